"""Bad input: an error that names the problem, never a silently wrong tensor."""
import copy
import os
import re
from pathlib import Path

import pytest
import torch

import helpers
from conftest import DEVICE


@pytest.fixture
def layer():
    return helpers.make_layer(64, 256, torch.bfloat16, device=DEVICE)


def _state(layer):
    return copy.copy(layer.weight.quant_state)


def test_missing_quant_state(kernel, layer):
    with pytest.raises(ValueError, match="W has no quant_state: not a bitsandbytes 4-bit weight"):
        kernel.dequantize_nf4(layer.weight, None)


def test_a_plain_linear_layer_is_told_what_to_use(kernel):
    with pytest.raises(ValueError, match=r"not a bitsandbytes 4-bit weight \(use bitsandbytes.nn.Linear4bit\)"):
        kernel.triton_dequantize_nf4(torch.nn.Linear(256, 64, bias=False))


def test_a_linear4bit_not_yet_quantized_is_told_so(kernel):
    import bitsandbytes as bnb
    layer = bnb.nn.Linear4bit(256, 64, bias=None, compute_dtype=torch.bfloat16, quant_type="nf4")
    with pytest.raises(ValueError, match=r"not quantized yet \(it quantizes on its first \.to\(device\)\)"):
        kernel.triton_dequantize_nf4(layer)


def test_a_weight_on_the_meta_device_is_refused_by_name(kernel, layer):
    qs = _state(layer)
    qs.absmax, qs.code = qs.absmax.to("meta"), qs.code.to("meta")
    with pytest.raises(ValueError, match=r"W holds no data \(on the meta device: load it first"):
        kernel.dequantize_nf4(layer.weight.data.to("meta"), qs)
    # W has data, its scales not (W on a GPU: "is on meta"; on the CPU, where meta also reads as device -1: no data)
    with pytest.raises(ValueError, match=r"quant_state\.absmax (is on meta|holds no data \(on the meta device)"):
        kernel.dequantize_nf4(layer.weight, qs)


# (what is changed in a copy of a good quant state, the error, what its message must say)
BROKEN_STATES = {
    "missing field": (lambda qs: setattr(qs, "absmax", None), ValueError, r"quant_state\.absmax is missing"),
    "output dtype": (lambda qs: setattr(qs, "dtype", torch.int8), TypeError, "output dtype torch.int8"),
    "mismatched shape": (lambda qs: setattr(qs, "shape", torch.Size([64, 512])), ValueError, "pack into"),
    "absmax dtype": (lambda qs: setattr(qs, "absmax", qs.absmax.float()), TypeError,
                     r"quant_state\.absmax must be torch\.uint8, got torch\.float32"),
    "absmax count": (lambda qs: setattr(qs, "absmax", qs.absmax[:-1]), ValueError,
                     r"quant_state\.absmax holds 255 values, not 256"),
    "state2 absmax count": (lambda qs: setattr(qs.state2, "absmax", qs.state2.absmax[:0]), ValueError,
                            r"quant_state\.state2\.absmax holds 0 values, not 1"),
    "state2 blocksize": (lambda qs: setattr(qs.state2, "blocksize", 3), ValueError,
                         r"quant_state\.state2\.blocksize 3 is not a power of two"),
    "state2 blocksize not an int": (lambda qs: setattr(qs.state2, "blocksize", 256.0), ValueError,
                                    r"quant_state\.state2\.blocksize 256\.0 is not a power of two"),
    # their product is positive: torch.empty raised on the negative size, an error not the wrapper's
    "negative sizes": (lambda qs: setattr(qs, "shape", torch.Size([-64, -256])), ValueError,
                       r"shape \(-64, -256\) holds no weights"),
    "blocksize": (lambda qs: setattr(qs, "blocksize", 48), ValueError,
                  r"blocksize 48 is not one of bitsandbytes' \(32, 64, 128, 256, 512, 1024, 2048, 4096\)"),
    "blocksize bitsandbytes refuses": (lambda qs: setattr(qs, "blocksize", 16), ValueError,
                                       "blocksize 16 is not one of bitsandbytes'"),
    "blocksize not an int": (lambda qs: setattr(qs, "blocksize", 64.0), ValueError,
                             "blocksize 64.0 is not one of bitsandbytes'"),
    "shape not a shape": (lambda qs: setattr(qs, "shape", (64.0, 256)), TypeError,
                          r"quant_state\.shape \(64\.0, 256\) is not a shape"),
    "nested, state2 gone": (lambda qs: setattr(qs, "state2", None), ValueError,
                            r"quant_state\.nested is True but it has no state2"),
    "not nested, with a state2": (lambda qs: setattr(qs, "nested", False), ValueError,
                                  r"quant_state\.nested is False but it has a state2"),
    "state2 nested": (lambda qs: setattr(qs.state2, "nested", True), ValueError,
                      r"quant_state\.state2 is nested itself"),
    "fewer weights than W packs": (lambda qs: setattr(qs, "shape", torch.Size([32, 256])), ValueError,
                                   r"W has 8192 bytes; \(32, 256\) weights pack into 4096"),
    "state2 dtype": (lambda qs: setattr(qs.state2, "dtype", torch.float16), ValueError,
                     r"quant_state\.state2\.dtype must be torch\.float32, got torch\.float16"),
    "state2 code count": (lambda qs: setattr(qs.state2, "code", qs.state2.code[:255]), ValueError,
                          r"quant_state\.state2\.code holds 255 values, not 256"),
    "offset not a tensor": (lambda qs: setattr(qs, "offset", 0.5), TypeError,
                            r"quant_state\.offset must be a tensor, got float"),
    "offset of two values": (lambda qs: setattr(qs, "offset", torch.zeros(2, device=qs.absmax.device)), ValueError,
                             r"quant_state\.offset holds 2 values, not 1"),
    # bitsandbytes makes an fp32 offset (absmax.mean() of an fp32 absmax); another dtype is refused, not converted
    "offset fp64": (lambda qs: setattr(qs, "offset", qs.offset.double()), TypeError,
                    r"quant_state\.offset must be torch\.float32, got torch\.float64"),
    "offset fp16": (lambda qs: setattr(qs, "offset", qs.offset.half()), TypeError,
                    r"quant_state\.offset must be torch\.float32, got torch\.float16"),
    # a str subclass may compare equal to anything: only a str is looked up (bitsandbytes' table for it)
    "quant type a str subclass": (lambda qs: setattr(qs, "quant_type", type("Fp4", (str,), {"__eq__": lambda a, b: True,
                                  "__hash__": str.__hash__})("fp4")), ValueError, "is not the str 'nf4' or 'fp4'"),
    "absmax not contiguous": (lambda qs: setattr(qs, "absmax", qs.absmax.repeat(2)[::2]), ValueError,
                              r"quant_state\.absmax is not a contiguous array"),
    "absmax not a tensor": (lambda qs: setattr(qs, "absmax", qs.absmax.tolist()), TypeError,
                            r"quant_state\.absmax must be a tensor, got list"),
    "quant type": (lambda qs: setattr(qs, "quant_type", "int4"), ValueError, "quant_type 'int4'"),
    # the kernel reads bytes: a lazy view's bytes are not its values (bitsandbytes reads them raw too, but adds
    # the offset by torch's arithmetic, which resolves it)
    "offset a lazily negated view": (lambda qs: setattr(qs, "offset", torch._neg_view(qs.offset)), ValueError,
                                     r"quant_state\.offset is a lazily negated or conjugated view: resolve it"),
    "absmax sparse": (lambda qs: setattr(qs, "absmax", qs.absmax.to_sparse()), ValueError,
                      r"quant_state\.absmax is not a contiguous array"),
    # (a CSR tensor has no is_contiguous: its layout is read first)
    "absmax sparse CSR": (lambda qs: setattr(qs, "absmax", qs.absmax.reshape(1, -1).to_sparse_csr()), ValueError,
                          r"quant_state\.absmax is not a contiguous array"),
    "absmax the tensor class": (lambda qs: setattr(qs, "absmax", torch.Tensor), TypeError,
                                r"quant_state\.absmax must be a tensor, got _TensorMeta"),
    # no memory: its data_ptr() is 0 (as a fake tensor's), and the kernel would read address 0
    "absmax a zero tensor": (lambda qs: setattr(qs, "absmax", torch._efficientzerotensor(
        qs.absmax.shape, dtype=qs.absmax.dtype, device=qs.absmax.device)), ValueError,
        r"quant_state\.absmax holds no data \(.*a fake or zero tensor"),
    # a blocksize past int32 failed in Triton's compiler (the kernel's BLOCKSIZE2 is a constexpr)
    "state2 blocksize 2**31": (lambda qs: setattr(qs.state2, "blocksize", 2**31), ValueError,
                               r"quant_state\.state2\.blocksize 2147483648 is not a power of two from 8 to 2\*\*30"),
    # bitsandbytes' CUDA kernel scales 8 absmax codes at once by the absmax2 of the first: below 8, its bits differ
    # from one scale per code (bitsandbytes' CPU kernel's, and this kernel's)
    "state2 blocksize 4": (lambda qs: setattr(qs.state2, "blocksize", 4), ValueError,
                           r"quant_state\.state2\.blocksize 4 is not a power of two from 8 to 2\*\*30"),
}


@pytest.mark.parametrize("case", BROKEN_STATES)
def test_broken_quant_state(kernel, layer, case):
    change, error, message = BROKEN_STATES[case]
    qs = _state(layer)
    change(qs)
    with pytest.raises(Exception) as raised:  # (another exception is a wrong answer too, not a crash of the test)
        kernel.dequantize_nf4(layer.weight, qs)
    assert type(raised.value) is error and re.search(message, str(raised.value)), repr(raised.value)


@pytest.mark.parametrize("shapes", [((256,), (1, 1)), ((), (1,)), ((256, 1), (1, 1, 1))])
def test_an_offset_bitsandbytes_cannot_add_to_absmax_is_refused_and_one_it_can_is_exact(kernel, layer, shapes):
    # absmax's and offset's shapes: where bitsandbytes' `absmax += offset` raises, ours names the offset; an offset
    # of as many dimensions as absmax (all of size 1) broadcasts, and both give bitsandbytes' bits
    import bitsandbytes.functional as bnbf
    absmax_shape, offset_shape = shapes
    qs = _state(layer)
    if absmax_shape == ():  # one block: a weight of 64 values
        W = layer.weight.data.reshape(-1)[:32].clone()
        qs.shape, qs.blocksize, qs.absmax = torch.Size([1, 64]), 64, qs.absmax[:1].reshape(())
    else:
        W = layer.weight.data
        qs.absmax = qs.absmax.reshape(absmax_shape)
    qs.offset = qs.offset.reshape(offset_shape)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        bnbf.dequantize_4bit(W, qs)
    with pytest.raises(ValueError, match=r"quant_state\.offset has more dimensions than absmax"):
        kernel.dequantize_nf4(W, qs)
    qs.offset = qs.offset.reshape([1] * qs.absmax.dim())
    assert torch.equal(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs))


# bitsandbytes' dequantize_4bit never reads quant_state.code (no backend of it takes the codebook): it
# decodes with its own table for the quant type, and so does the kernel. Neither change is an error.
CODEBOOK_CHANGES = {
    "another codebook": lambda qs: setattr(qs, "code", qs.code.flip(0)),
    "the other quant type": lambda qs: setattr(qs, "quant_type", "fp4"),
}


@pytest.mark.parametrize("case", CODEBOOK_CHANGES)
def test_the_codebook_decoded_is_bitsandbytes_table_not_quant_state_code(kernel, layer, case):
    import bitsandbytes.functional as bnbf
    qs = _state(layer)
    CODEBOOK_CHANGES[case](qs)
    ours = kernel.dequantize_nf4(layer.weight, qs)
    assert torch.equal(ours, bnbf.dequantize_4bit(layer.weight, qs))
    plain = kernel.dequantize_nf4(layer.weight, _state(layer))
    assert torch.equal(ours, plain) == (case == "another codebook")  # fp4's table is another


def test_a_plain_absmax_of_the_wrong_size(kernel):
    # compress_statistics=False: an fp32 absmax, no state2; its count is checked as the nested one's is
    import bitsandbytes.functional as bnbf
    torch.manual_seed(0)
    W, qs = bnbf.quantize_4bit(torch.randn(64, 256, device=DEVICE), blocksize=64, quant_type="nf4",
                               compress_statistics=False)
    qs.absmax = qs.absmax[:-1]
    with pytest.raises(ValueError, match=r"quant_state\.absmax holds 255 values, not 256"):
        kernel.dequantize_nf4(W, qs)


def test_a_weight_that_is_not_a_tensor(kernel, layer):
    with pytest.raises(TypeError, match="dequantize_nf4: W must be a tensor, got ndarray"):
        kernel.dequantize_nf4(layer.weight.data.cpu().numpy(), _state(layer))


def test_non_contiguous_weight(kernel, layer):
    W = layer.weight.data.reshape(-1, 2).t()
    with pytest.raises(ValueError, match="not a contiguous array"):
        kernel.dequantize_nf4(W, _state(layer))


def test_a_one_value_weight_whose_stride_is_0(kernel):
    # the fuzzer's find: W a view of its one value with stride 0, which torch calls contiguous (a size-1 dim's
    # stride is free), crashed in the byte view (RuntimeError) instead of being decoded or refused by name
    import bitsandbytes.functional as bnbf
    W, qs = bnbf.quantize_4bit(torch.randn(1, 4, device=DEVICE), quant_storage=torch.int16)  # 2 bytes: one int16
    strided = W.as_strided(W.shape, (0,) * W.dim())
    assert strided.is_contiguous() and strided.reshape(-1).stride() == (0,)
    assert torch.equal(kernel.dequantize_nf4(strided, qs), kernel.dequantize_nf4(W, qs))
    qs.shape = torch.Size([1, 64])  # 32 bytes of codes, which one value cannot hold
    with pytest.raises(ValueError, match=r"W has 2 bytes; \(1, 64\) weights pack into 32"):
        kernel.dequantize_nf4(strided, qs)


def test_empty_weight(kernel, layer):
    qs = _state(layer)
    qs.shape = torch.Size([0, 256])
    with pytest.raises(ValueError, match=r"shape \(0, 256\) holds no weights"):
        kernel.dequantize_nf4(layer.weight.data[:0], qs)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs CPU tensors")
def test_cpu_tensor_outside_the_interpreter(kernel):
    cpu_layer = helpers.make_layer(64, 256, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="runs on CUDA"):
        kernel.triton_dequantize_nf4(cpu_layer)


@pytest.mark.parametrize("tensor", ["W", "absmax", "state2.absmax"])
def test_a_storage_freed_after_a_good_call_is_refused_by_name(kernel, layer, tensor):
    # FSDP frees a parameter's storage by resizing it to 0: its data_ptr reads 0, and nothing may launch on it
    qs = _state(layer)
    W = layer.weight.data.clone()
    kernel.dequantize_nf4(W, qs)
    owner, name = (qs.state2, "absmax") if tensor == "state2.absmax" else (qs, tensor)
    freed = W if tensor == "W" else getattr(owner, name).clone()
    if tensor != "W":
        setattr(owner, name, freed)
    freed.untyped_storage().resize_(0)
    label = "W" if tensor == "W" else f"quant_state.{tensor}"
    with pytest.raises(ValueError, match=rf"{re.escape(label)} holds no data \(.*storage was freed\)"):
        kernel.dequantize_nf4(W, qs)


@pytest.mark.parametrize("tensor", ["W", "absmax", "offset"])
def test_a_lazily_negated_view_after_a_good_call_is_refused_by_name(kernel, layer, tensor):
    # at the address, dtype and size a plan was made for: the key holds the sign bit, so the view is validated
    qs = _state(layer)
    W = layer.weight.data.clone()
    for _ in range(2):
        kernel.dequantize_nf4(W, qs)
    if tensor == "W":
        W = torch._neg_view(W)
    else:
        setattr(qs, tensor, torch._neg_view(getattr(qs, tensor)))
    label = "W" if tensor == "W" else f"quant_state.{tensor}"
    with pytest.raises(ValueError, match=rf"{re.escape(label)} is a lazily negated or conjugated view"):
        kernel.dequantize_nf4(W, qs)


def test_a_weight_conjugated_after_a_good_call_is_refused_by_name(kernel, layer):
    # W's bytes as complex64 decode as they are (bitsandbytes reads them raw); its conjugate is a lazy view of them
    import bitsandbytes.functional as bnbf
    qs = _state(layer)
    W = layer.weight.data.reshape(-1).view(torch.complex64)
    for _ in range(2):
        assert torch.equal(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs))
    with pytest.raises(ValueError, match=r"W is a lazily negated or conjugated view"):
        kernel.dequantize_nf4(W.conj(), qs)


def test_a_weight_without_memory_after_a_good_call_is_refused_by_name(kernel, layer):
    # a zero tensor (torch._efficientzerotensor) in W's .data: at another address than the plan's, validated
    qs = _state(layer)
    W = layer.weight.data.clone()
    for _ in range(2):
        kernel.dequantize_nf4(W, qs)
    W.data = torch._efficientzerotensor(W.shape, dtype=W.dtype, device=W.device)
    with pytest.raises(ValueError, match=r"W holds no data \(.*a fake or zero tensor"):
        kernel.dequantize_nf4(W, qs)


@pytest.mark.parametrize("first_call", [True, False])
def test_a_call_under_a_fake_tensor_mode_is_refused_and_leaves_nothing(kernel, layer, first_call):
    # shape propagation runs calls under one: W read under it is a fake tensor, without memory to launch on. A first
    # call of the process (no table kept) keeps no table made under it; a weight's later calls are exact again
    from torch._subclasses.fake_tensor import FakeTensorMode
    import bitsandbytes.functional as bnbf
    qs = _state(layer)
    W = layer.weight
    if first_call:
        kernel._TABLES.clear()
    else:
        for _ in range(2):
            kernel.dequantize_nf4(W, qs)
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(Exception) as raised:
            kernel.dequantize_nf4(W, qs)
    # a CPU Params4bit reads as a fake tensor, refused by name; a GPU's is not read: torch's own error names the mode
    named = (ValueError, r"^dequantize_nf4: W holds no data \(.*a fake or zero tensor")
    torchs = (TypeError, r"^Multiple dispatch failed for 'torch._ops.aten.detach.default'.*FakeTensorMode")
    error, message = torchs if W.is_cuda else named
    assert type(raised.value) is error and re.search(message, str(raised.value), re.S), repr(raised.value)
    assert all(type(table) is torch.Tensor for table in kernel._TABLES.values())
    for _ in range(2):
        assert torch.equal(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs))


@pytest.mark.parametrize("default", [torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_a_first_call_under_another_default_dtype_answers_as_bitsandbytes(kernel, layer, default):
    # model code sets torch's default dtype to bfloat16. bitsandbytes' get_4bit_type makes its table in it, but its
    # CUDA and native CPU kernels decode in fp32 whatever it is: so does this one, and the table it keeps is fp32
    import bitsandbytes.functional as bnbf
    from reference import bits
    qs = _state(layer)
    expected = bnbf.dequantize_4bit(layer.weight, qs)
    kernel._TABLES.clear()  # a process's first call: no table kept, and no plan (a plan of a freed weight at
    kernel._plans.clear()   # W's addresses, of its sizes and dtypes, answers W rightly, without a table)
    torch.set_default_dtype(default)
    try:
        first = kernel.dequantize_nf4(layer.weight, qs)
        theirs = bnbf.dequantize_4bit(layer.weight, qs)
    finally:
        torch.set_default_dtype(torch.float32)
    assert torch.equal(bits(theirs), bits(expected))  # (bitsandbytes' own bits do not change with it)
    assert torch.equal(bits(first), bits(expected))
    (table,) = kernel._TABLES.values()
    assert table.dtype == torch.float32 and torch.equal(table, bnbf.get_4bit_type("nf4", table.device))
    assert torch.equal(bits(kernel.dequantize_nf4(layer.weight, qs)), bits(expected))
    # (the first call copied the codebook the wrapper cell decoded; decoded under the other dtype, as the cell
    # run then or a traced call does, it is fp32 and bitsandbytes' values too)
    torch.set_default_dtype(default)
    try:
        decoded = {kind: kernel.bitsandbytes_codebook(kind, "cpu") for kind in ("nf4", "fp4")}
    finally:
        torch.set_default_dtype(torch.float32)
    for kind, table in decoded.items():
        assert table.dtype == torch.float32 and torch.equal(table, bnbf.get_4bit_type(kind, "cpu")), kind


def test_a_one_row_weight_of_three_dimensions_is_refused_by_name_before_a_launch(kernel, monkeypatch):
    # a weight quantized from a 3-D tensor packs into (n, 1) bytes; called as W.t(), one row, bitsandbytes returns
    # out.t(), which raises torch's unnamed t() error for a 3-D out: here a named error, and nothing launched
    import bitsandbytes.functional as bnbf
    W, qs = bnbf.quantize_4bit(torch.randn(4, 8, 32, device=DEVICE), blocksize=64, quant_type="nf4")
    with pytest.raises(RuntimeError, match=r"t\(\) expects a tensor with <= 2 dimensions"):
        bnbf.dequantize_4bit(W.t(), qs)
    launches = []
    monkeypatch.setattr(kernel, "launch_arguments", lambda *args: launches.append(args))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^dequantize_nf4: W has one row: a 3-D result has no \.t\(\)$"):
            kernel.dequantize_nf4(W.t(), qs)
    assert launches == []
    monkeypatch.undo()
    assert torch.equal(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs))


@pytest.mark.parametrize("held_as", ["tensor", "ndarray", "list"])
def test_a_tensor_shape_is_refused_as_bitsandbytes_refuses_it(kernel, layer, held_as):
    # bitsandbytes' op takes a shape as a list of ints: a tensor it refuses (its op's schema), so does this; a
    # numpy array or a list it takes, and so does this (a dict, which its schema refuses too, this takes)
    import numpy
    import bitsandbytes.functional as bnbf
    qs = _state(layer)
    expected = bnbf.dequantize_4bit(layer.weight, qs)
    qs.shape = {"tensor": torch.tensor, "ndarray": numpy.array, "list": list}[held_as](list(qs.shape))
    if held_as != "tensor":
        assert torch.equal(bnbf.dequantize_4bit(layer.weight, qs), expected)
        assert torch.equal(kernel.dequantize_nf4(layer.weight, qs), expected)
        return
    with pytest.raises(RuntimeError, match=r"Expected a value of type 'List\[int\]' for argument 'shape'"):
        bnbf.dequantize_4bit(layer.weight, qs)
    with pytest.raises(TypeError, match=r"^dequantize_nf4: quant_state\.shape tensor\(\[ 64, 256\]\) is not a "
                                        r"shape \(a torch\.Size of ints\)"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_a_storage_shrunk_in_place_after_a_good_call_is_refused_by_name(kernel, layer):
    # resize_ twice: the second often gets the first's address back (the allocator hands the freed block out
    # again), W now spanning past its storage's end; the key holds the storage's extent
    qs = _state(layer)
    W = layer.weight.data.clone()
    for _ in range(2):
        kernel.dequantize_nf4(W, qs)
    storage = W.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(nbytes - 1)
    storage.resize_(nbytes - 2)
    with pytest.raises(ValueError, match=r"W holds no data \(.*storage was freed\)"):
        kernel.dequantize_nf4(W, qs)


def test_field_deleted_after_a_good_call(kernel, layer):
    qs = _state(layer)
    kernel.dequantize_nf4(layer.weight, qs)
    del qs.blocksize
    with pytest.raises(ValueError, match=r"quant_state\.blocksize is missing"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_the_codebook_deleted_is_no_error(kernel, layer):
    # neither bitsandbytes nor the kernel reads quant_state.code: without it both decode as before
    import bitsandbytes.functional as bnbf
    qs = _state(layer)
    del qs.code
    assert torch.equal(kernel.dequantize_nf4(layer.weight, qs), bnbf.dequantize_4bit(layer.weight, qs))


@pytest.mark.parametrize("literal, gpu, refused", [("[7, 0]", (7, 5), False), ("[7, 0]", (6, 1), True)])
def test_min_capability_edited_into_a_list_compares_as_the_tuple(kernel, monkeypatch, literal, gpu, refused):
    # the wrapper cell edited (MIN_CAPABILITY = [7, 0]) and run, in a namespace of its own: a GPU at or above it
    # passes, one below is refused by name; neither compares a tuple with a list (an unnamed TypeError)
    from benchmarks.cells import NOTEBOOK, kernel_cell_sources
    wrapper = kernel_cell_sources(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)))[1]
    assert wrapper.count("MIN_CAPABILITY = (7, 0)") == 1
    namespace = dict(vars(kernel))
    exec(wrapper.replace("MIN_CAPABILITY = (7, 0)", f"MIN_CAPABILITY = {literal}"), namespace)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    gpu_0 = torch.device("cuda", 0)
    if refused:
        with pytest.raises(RuntimeError, match=r"^dequantize_nf4: a GPU has compute capability \(6, 1\), below "
                                               r"this kernel's \(7, 0\)$"):
            namespace["device_capability"](gpu_0)
    else:
        assert namespace["device_capability"](gpu_0) == gpu

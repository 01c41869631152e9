"""model_patch.py's use_triton_dequantize(dequantize_nf4), handed the kernel cells' function, in a model:
a Llama from transformers (random weights from a config, loaded 4-bit through BitsAndBytesConfig), with
peft LoRA on every linear layer, gives the same logits and the same LoRA gradients, bit for bit, with and
without the patch; every dequantization bitsandbytes did without it went through the kernel with it; the
patch is undone to the original objects; it asks for the kernel's function by name; and the notebook's
check (check_in_a_small_llama) passes.

Without a GPU the kernel runs in the interpreter on a tiny model. There bitsandbytes' forward
dequantizes inside its CPU op (no Python function to route), so the model checks the backward and
the helpers; the forward's dequantize-then-linear path is checked against bitsandbytes' own
implementation of it (test_forward_dequantize_then_linear). On a GPU (tests marked gpu) the model is
larger and its batch large enough (2048 tokens) that bitsandbytes' CUDA matmul dequantizes in the
forward too.
"""
import json
import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from benchmarks import model as model_benchmark
import model_patch  # handed the kernel cells' function: model_patch.use_triton_dequantize(kernel.dequantize_nf4)
from conftest import DEVICE, GPU, ROOT

TARGETS = ("bitsandbytes.functional.dequantize_4bit", "bitsandbytes.matmul_4bit",
           "bitsandbytes.autograd._functions.matmul_4bit", "bitsandbytes.backends.cuda.ops._dequant_linear_fallback")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128)
LARGER = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512)
# (weights dtype, compute dtype): the two a QLoRA user picks, and fp32 weights with bf16 compute,
# where the forward's dequantize (to bf16) is not what the kernel writes (fp32): bitsandbytes keeps it.
DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32, torch.bfloat16)]
DTYPE_IDS = ["bf16", "fp16", "fp32-weights-bf16-compute"]


def _resolve(name):
    module_name, attribute = name.rsplit(".", 1)
    return sys.modules.get(module_name), attribute


def _current(name):
    module, attribute = _resolve(name)
    return getattr(module, attribute, None)


@pytest.fixture
def calls(kernel, monkeypatch):
    """Counts of calls into our kernel and into bitsandbytes' own dequantizing functions, each
    replaced by a counting stand-in that calls the real one (undone after the test). The tests hand
    the patch kernel.dequantize_nf4 after this fixture ran: the stand-in."""
    import bitsandbytes  # noqa: F401
    counts = {"kernel": 0, "bitsandbytes.functional.dequantize_4bit": 0,
              "bitsandbytes.backends.cuda.ops._dequant_linear_fallback": 0}

    def counting(key, real):
        def spy(*args, **kwargs):
            result = real(*args, **kwargs)
            counts[key] += 1  # calls that returned: a refusal raised inside is not an answer
            return result
        return spy

    monkeypatch.setattr(kernel, "dequantize_nf4", counting("kernel", kernel.dequantize_nf4))
    for name in list(counts)[1:]:
        module, attribute = _resolve(name)
        if module is not None:
            monkeypatch.setattr(module, attribute, counting(name, getattr(module, attribute)))
    return counts


def _quantized_model(tmp_path, shape, weights_dtype, compute_dtype):
    """The loader the benchmark and the notebook's check use (eager attention: its backward is deterministic on
    the GPU, sdpa's fused ones need not be), with LoRA of rank 4."""
    model = model_patch.quantized_llama(shape, weights_dtype, DEVICE, str(tmp_path), compute_dtype)
    return model_patch.with_lora(model, r=4)


def _step(model, ids):
    """Logits and every LoRA gradient of one training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    output = model(input_ids=ids, labels=ids, use_cache=False)
    output.loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    return output.logits.detach().clone(), grads


def _check_model(kernel, calls, model, ids, same_dtype):
    """Logits and LoRA gradients bit-identical with and without the patch; every dequantization
    bitsandbytes did without the patch was ours with it, but the forward's where the input's dtype
    is not the weight's. Returns how many dequantizations the step's forward made."""
    plain_logits, plain_grads = _step(model, ids)
    plain = dict(calls)
    assert plain["kernel"] == 0
    backward = plain["bitsandbytes.functional.dequantize_4bit"]
    forward = plain["bitsandbytes.backends.cuda.ops._dequant_linear_fallback"]
    assert backward > 0, "the step dequantized nothing in its backward"
    originals = {name: _current(name) for name in TARGETS}
    calls.update(dict.fromkeys(calls, 0))
    with model_patch.use_triton_dequantize(kernel.dequantize_nf4) as patch:
        assert "bitsandbytes.functional.dequantize_4bit" in patch.patched
        logits, grads = _step(model, ids)
    assert torch.equal(logits, plain_logits)
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    for name, grad in grads.items():
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0, f"{name}: a vacuous gradient"
        assert torch.equal(grad, plain_grads[name]), f"{name} differs"
    assert {name: _current(name) for name in TARGETS} == originals, "the patch was not undone"
    assert calls["bitsandbytes.functional.dequantize_4bit"] == 0
    if same_dtype:
        assert calls["kernel"] == backward + forward
        assert calls["bitsandbytes.backends.cuda.ops._dequant_linear_fallback"] == 0
    else:  # bitsandbytes dequantizes to the input's dtype in the forward: that stays with it
        assert calls["kernel"] == backward
        assert calls["bitsandbytes.backends.cuda.ops._dequant_linear_fallback"] == forward
    return forward


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("weights_dtype,compute_dtype", DTYPES, ids=DTYPE_IDS)
def test_tiny_model_is_bit_identical(kernel, calls, tmp_path, weights_dtype, compute_dtype, checkpointing):
    model = _quantized_model(tmp_path, TINY, weights_dtype, compute_dtype)
    model_benchmark.set_checkpointing(model, checkpointing)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _check_model(kernel, calls, model, ids, weights_dtype == compute_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
@pytest.mark.parametrize("weights_dtype,compute_dtype", DTYPES, ids=DTYPE_IDS)
def test_gpu_model_is_bit_identical(kernel, calls, tmp_path, weights_dtype, compute_dtype, checkpointing):
    model = _quantized_model(tmp_path, LARGER, weights_dtype, compute_dtype)
    model_benchmark.set_checkpointing(model, checkpointing)
    # 2048 tokens, more than bitsandbytes' fused kernels take (1536): its forward dequantizes
    ids = torch.randint(0, LARGER["vocab_size"], (4, 512), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    assert _check_model(kernel, calls, model, ids, weights_dtype == compute_dtype) > 0


@pytest.mark.gpu
def test_gpu_decode_keeps_bitsandbytes_fused_kernel(kernel, calls, tmp_path):
    """One token (decode): bitsandbytes' fused 4-bit matmul, not a dequantization, with the patch too."""
    import bitsandbytes as bnb
    model = _quantized_model(tmp_path, LARGER, torch.bfloat16, torch.bfloat16).eval()
    weights = sum(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())
    ids = torch.randint(0, LARGER["vocab_size"], (1, 1), device=DEVICE)
    with torch.inference_mode():
        plain = model(input_ids=ids).logits
        matmuls = model_patch.PATCH_CALLS["matmul_4bit", "bitsandbytes"]
        with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
            ours = model(input_ids=ids).logits
    assert torch.equal(ours, plain)
    assert model_patch.PATCH_CALLS["matmul_4bit", "bitsandbytes"] - matmuls == weights > 0
    assert calls == dict.fromkeys(calls, 0), "a one-token forward must stay in bitsandbytes' fused kernel"


def _layer(shape=(64, 128), dtype=torch.bfloat16, nested=True, seed=0):
    """A 4-bit weight as bitsandbytes quantizes it (NF4, blocksize 64), dequantizing to `dtype`."""
    import bitsandbytes.functional as bnbf
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    W, qs = bnbf.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=nested)
    qs.dtype = dtype
    return W, qs


def _decoded_absmax(qs):
    import bitsandbytes.functional as bnbf
    return bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset


@pytest.mark.parametrize("shape, storage", [((1, 2), torch.uint8), ((2, 1), torch.uint8), ((2, 2), torch.bfloat16),
                                            ((2, 4), torch.float32)], ids=str)
def test_forward_dequantize_then_linear_of_a_weight_packed_in_one_element(kernel, calls, monkeypatch, shape, storage):
    """A weight whose packed bytes fit in one element of its storage reaches the forward's step as a (1, 1) B:
    bitsandbytes' dequantize_4bit (and the kernel) returns out.t() for a one-row B, its dequantize-then-linear
    does not (a 2x2 weight in bf16 storage: W transposed, silently)."""
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl as bnb_dequantize_linear
    import bitsandbytes.functional as bnbf
    # (the CPU's bitsandbytes kernel starts a block at each row, unlike this step's on a GPU: on a GPU each of these
    # weights gets the kernel; on the CPU _kernel_may_answer declines rows that are not whole blocks)
    monkeypatch.setattr(model_patch, "_kernel_may_answer", lambda W, qs: True)
    generator = torch.Generator().manual_seed(sum(shape))
    W, qs = bnbf.quantize_4bit(torch.randn(shape, generator=generator).to(DEVICE), blocksize=64, quant_type="nf4",
                               compress_statistics=True, quant_storage=storage)
    qs.dtype = torch.bfloat16
    args = (W.view(-1, 1), qs.shape, qs.state2.absmax, qs.blocksize, qs.quant_type)
    kwargs = dict(absmax_8bit=qs.absmax, absmax_code=qs.state2.code, absmax_offset=qs.offset)
    assert args[0].shape == (1, 1)
    through = model_patch._dequantize_linear_through_triton(bnb_dequantize_linear, kernel.dequantize_nf4)

    @model_patch._remember_quant_state
    def matmul_4bit(A, B, quant_state, out=None, bias=None):  # stands in for bitsandbytes' own
        return through(A, *args, bias=bias, **kwargs)

    A = torch.randn(3, shape[1], generator=generator).to(torch.bfloat16).to(DEVICE)
    reference = bnb_dequantize_linear(A, *args, **kwargs)
    before = calls["kernel"]
    assert torch.equal(matmul_4bit(A, W, qs), reference)
    assert calls["kernel"] == before + 1


def test_forward_dequantize_then_linear(kernel, calls):
    """The forward's path, against bitsandbytes' own dequantize-then-linear (its default backend's
    gemm_4bit, which has the CUDA fallback's signature and arithmetic), called as bitsandbytes'
    matmul_4bit calls it: nested and plain absmax, fp16 and bf16, a bias."""
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl as bnb_dequantize_linear
    through = model_patch._dequantize_linear_through_triton(bnb_dequantize_linear, kernel.dequantize_nf4)

    def gemm_args(W, qs):
        """What bitsandbytes' matmul_4bit passes its gemm_4bit (the CUDA one hands it on as is)."""
        if qs.state2 is None:
            return (W.view(-1, 1), qs.shape, qs.absmax, qs.blocksize, qs.quant_type), {}
        return ((W.view(-1, 1), qs.shape, qs.state2.absmax, qs.blocksize, qs.quant_type),
                dict(absmax_8bit=qs.absmax, absmax_code=qs.state2.code, absmax_offset=qs.offset))

    @model_patch._remember_quant_state
    def matmul_4bit(A, B, quant_state, out=None, bias=None):  # stands in for bitsandbytes' own
        args, kwargs = gemm_args(B, quant_state)
        return through(A, *args, bias=bias, **kwargs)

    @model_patch._remember_quant_state
    def mismatched(A, B, quant_state, out=None, bias=None):  # passes on another weight than it names
        args, kwargs = gemm_args(*other)
        return through(A, *args, bias=bias, **kwargs)

    generator = torch.Generator().manual_seed(0)
    for nested in (True, False):
        for dtype in (torch.float16, torch.bfloat16):
            W, qs = _layer((64, 128), dtype, nested=nested)
            other = _layer((64, 128), dtype, nested=nested, seed=1)
            A = torch.randn(3, 5, 128, generator=generator).to(dtype).to(DEVICE)
            bias = torch.randn(64, generator=generator).to(dtype).to(DEVICE)
            args, kwargs = gemm_args(W, qs)
            reference = bnb_dequantize_linear(A, *args, bias=bias, **kwargs)
            before = calls["kernel"]
            assert torch.equal(matmul_4bit(A, W, qs, bias=bias), reference)
            assert calls["kernel"] == before + 1
            # refused, so bitsandbytes answers: no matmul_4bit call to name the quant state, the
            # input in another dtype than the weight's (bitsandbytes dequantizes to the input's),
            # the quant state named not the one whose tensors are passed
            assert torch.equal(through(A, *args, bias=bias, **kwargs), reference)
            wide = torch.float32
            assert torch.equal(matmul_4bit(A.to(wide), W, qs, bias=bias.to(wide)),
                               bnb_dequantize_linear(A.to(wide), *args, bias=bias.to(wide), **kwargs))
            other_args, other_kwargs = gemm_args(*other)
            assert torch.equal(mismatched(A, W, qs, bias=bias),
                               bnb_dequantize_linear(A, *other_args, bias=bias, **other_kwargs))
            assert calls["kernel"] == before + 1


def _outcome(fn):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001  (the error is the outcome compared)
        return (type(error), str(error))


def _same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    return a == b


def _replaced_code(qs):
    qs.code = qs.code.clone()
    qs.code[1] += 0.01  # not bitsandbytes' table: its kernels never read quant_state.code


def _set(**fields):
    def change(qs):
        for name, value in fields.items():
            setattr(qs, name, value)
    return change


def _out():
    return torch.empty(64, 128, dtype=torch.bfloat16, device=DEVICE)


def _plain(f, W, qs):
    return f(W, qs)


CASES = [
    # (case, weight shape, change to its quant state, the call, does the kernel answer it here?)
    ("W.t(), as older bitsandbytes passes it", (64, 128), _set(), lambda f, W, qs: f(W.t(), qs), True),
    ("fp16 output", (64, 128), _set(dtype=torch.float16), _plain, True),
    ("an out tensor", (64, 128), _set(), lambda f, W, qs: f(W, qs, out=_out()), False),
    ("absmax and out without a quant state", (64, 128), _set(),
     lambda f, W, qs: f(W, absmax=_decoded_absmax(qs), out=_out(), blocksize=64, quant_type="nf4"), False),
    ("a replaced codebook (read by neither)", (64, 128), _replaced_code, _plain, True),
    ("an fp64 output (bitsandbytes' error)", (64, 128), _set(dtype=torch.float64), _plain, False),
    ("an invalid blocksize (bitsandbytes' error)", (64, 128), _set(blocksize=16), _plain, False),
    # bitsandbytes' CPU kernel starts a block at each row: it agrees with the layout only for whole
    # blocks per row. CUDA (and the kernel) never restart: there the kernel answers.
    ("rows of 1.5 blocks", (8, 96), _set(), _plain, GPU),
]


@pytest.mark.parametrize("shape,change,call,taken", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_calls_get_bitsandbytes_answer(kernel, calls, shape, change, call, taken):
    import bitsandbytes.functional as bnbf
    W, qs = _layer(shape)
    change(qs)
    reference = _outcome(lambda: call(bnbf.dequantize_4bit, W, qs))
    with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
        ours = _outcome(lambda: call(bnbf.dequantize_4bit, W, qs))
    assert _same(ours, reference)
    assert calls["kernel"] == (1 if taken else 0)


def test_torch_compile_tracing_goes_to_bitsandbytes(kernel, calls, monkeypatch):
    import bitsandbytes.functional as bnbf
    W, qs = _layer()
    reference = bnbf.dequantize_4bit(W, qs)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what the patch sees while tracing
    with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
        assert torch.equal(bnbf.dequantize_4bit(W, qs), reference)
    assert calls["kernel"] == 0 and calls["bitsandbytes.functional.dequantize_4bit"] == 2


def test_patch_is_idempotent_nests_and_is_undone_exactly(kernel):
    import bitsandbytes  # noqa: F401
    originals = {name: _current(name) for name in TARGETS}
    present = [name for name in TARGETS if originals[name] is not None]
    # the CUDA backend's function is there where bitsandbytes loaded its CUDA backend (a GPU)
    assert set(present) >= set(TARGETS[:3]) and (TARGETS[3] in present or not GPU)
    try:
        first = model_patch.use_triton_dequantize(kernel.dequantize_nf4)
        assert first.patched == present
        installed = {name: _current(name) for name in present}
        assert all(installed[name] is not originals[name] and installed[name].__wrapped__ is originals[name]
                   for name in present)
        # a second call with the same function changes nothing: no wrapper of a wrapper
        again = model_patch.use_triton_dequantize(kernel.dequantize_nf4)
        assert again.patched == present and all(_current(name) is installed[name] for name in present)
        with model_patch.use_triton_dequantize(enable=False) as off:
            assert off.patched == [] and all(_current(name) is originals[name] for name in present)
            with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
                assert all(_current(name).__wrapped__ is originals[name] for name in present)
            assert all(_current(name) is originals[name] for name in present)
        assert all(_current(name).__wrapped__ is originals[name] for name in present)
    finally:
        model_patch.use_triton_dequantize(enable=False)
    assert {name: _current(name) for name in TARGETS} == originals


@pytest.fixture
def dequantize_4bit_put_back():
    """bitsandbytes.functional.dequantize_4bit as it was, and the patch off, after a test that replaces it."""
    import bitsandbytes.functional as bnbf
    original = bnbf.dequantize_4bit
    yield
    bnbf.dequantize_4bit = original
    model_patch.use_triton_dequantize(enable=False)


def test_another_librarys_wrapper_over_the_patch_is_not_taken_for_it(kernel, dequantize_4bit_put_back):
    # a wrapper another library puts over a replacement with functools.wraps copies its attributes: switching on
    # again must not stack a second replacement over it, and switching off must neither take it for ours (and
    # "restore" our replacement under it, dropping it) nor be silent that calls through it still reach the kernel
    import functools
    import warnings
    import bitsandbytes.functional as bnbf
    name = "bitsandbytes.functional.dequantize_4bit"
    model_patch.use_triton_dequantize(kernel.dequantize_nf4)
    ours = bnbf.dequantize_4bit

    @functools.wraps(ours)
    def another_librarys(*args, **kwargs):
        return ours(*args, **kwargs)
    bnbf.dequantize_4bit = another_librarys
    assert model_patch._patched_now()[name] is kernel.dequantize_nf4  # (beneath the other wrapper)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = model_patch.use_triton_dequantize(kernel.dequantize_nf4)
        with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
            assert bnbf.dequantize_4bit is another_librarys
    assert name in again.patched and bnbf.dequantize_4bit is another_librarys
    with pytest.warns(RuntimeWarning, match=r"dequantize_4bit is another library's wrapper over the patch"):
        model_patch.use_triton_dequantize(enable=False)
    assert bnbf.dequantize_4bit is another_librarys


def test_a_marker_of_another_form_is_not_taken_for_a_replacement(kernel, dequantize_4bit_put_back):
    # an older model_patch marked a replacement with its kernel function alone (a reloaded module meets one):
    # not ours, and no error switching on or off
    import bitsandbytes.functional as bnbf
    original = bnbf.dequantize_4bit

    def older(*args, **kwargs):
        return original(*args, **kwargs)
    older._nf4_triton_patch = kernel.dequantize_nf4
    bnbf.dequantize_4bit = older
    assert "bitsandbytes.functional.dequantize_4bit" not in model_patch._patched_now()
    model_patch.use_triton_dequantize(kernel.dequantize_nf4)
    assert bnbf.dequantize_4bit.__wrapped__ is older
    model_patch.use_triton_dequantize(enable=False)
    assert bnbf.dequantize_4bit is older


def test_switching_from_threads_never_tears_or_stacks(kernel):
    import bitsandbytes  # noqa: F401
    originals = {name: _current(name) for name in TARGETS if _current(name) is not None}

    def flip(seed):
        rng = random.Random(seed)
        for _ in range(200):
            model_patch.use_triton_dequantize(kernel.dequantize_nf4, rng.random() < 0.5)

    threads = [threading.Thread(target=flip, args=(seed,)) for seed in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        states = {_current(name) is originals[name] for name in originals}
        assert len(states) == 1, "some functions replaced and others not"
        assert all(_current(name) is originals[name] or _current(name).__wrapped__ is originals[name]
                   for name in originals)
    finally:
        model_patch.use_triton_dequantize(enable=False)
    assert all(_current(name) is originals[name] for name in originals)


def test_every_reference_is_replaced(kernel):
    """No module keeps a copy of a replaced function under another name: the callers in
    bitsandbytes, peft and transformers reach each one through the attributes the patch replaces."""
    import bitsandbytes.nn  # noqa: F401
    import peft.tuners.lora.bnb  # noqa: F401
    import peft.utils.integrations  # noqa: F401
    import transformers.integrations.bitsandbytes  # noqa: F401
    originals = {name: _current(name) for name in TARGETS if _current(name) is not None}
    with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
        left = [f"{module_name}.{attribute}"
                for module_name, module in list(sys.modules.items()) if module is not None
                for attribute, value in list(getattr(module, "__dict__", {}).items())
                if any(value is original for original in originals.values())]
    assert left == [], f"copies the patch does not reach: {left}"


def test_the_patch_asks_for_the_kernel_function(kernel):
    """enable=True needs the kernel's function, and says so; switching off needs none."""
    import bitsandbytes  # noqa: F401
    originals = {name: _current(name) for name in TARGETS}
    for wrong in ((), (True,), (False,), ("dequantize_nf4",)):
        with pytest.raises(TypeError, match=r"use_triton_dequantize: .*dequantize_nf4"):
            model_patch.use_triton_dequantize(*wrong)
    with pytest.raises(TypeError, match=r"use_triton_dequantize\(enable=False\)"):
        model_patch.use_triton_dequantize(False)  # the notebook cell's old spelling of "off"
    assert model_patch.use_triton_dequantize(enable=False).patched == []
    assert model_patch.use_triton_dequantize(None, False).patched == []
    assert model_patch.use_triton_dequantize(kernel.dequantize_nf4, enable=False).patched == []
    assert {name: _current(name) for name in TARGETS} == originals


def test_another_kernel_function_is_called_instead_and_the_block_restores_the_first(kernel):
    """Patched with one function, then a with-block with another: the replacements call the second
    (still wrapping bitsandbytes' originals, never a replacement), and the first is back after it."""
    import bitsandbytes.functional as bnbf
    originals = {name: _current(name) for name in TARGETS if _current(name) is not None}
    called = []

    def first(W, quant_state):
        called.append("first")
        return kernel.dequantize_nf4(W, quant_state)

    def second(W, quant_state):
        called.append("second")
        return kernel.dequantize_nf4(W, quant_state)

    W, qs = _layer()
    reference = bnbf.dequantize_4bit(W, qs)
    try:
        model_patch.use_triton_dequantize(first)
        assert torch.equal(bnbf.dequantize_4bit(W, qs), reference)
        with model_patch.use_triton_dequantize(second):
            assert all(_current(name).__wrapped__ is originals[name] for name in originals)
            assert torch.equal(bnbf.dequantize_4bit(W, qs), reference)
        assert all(_current(name).__wrapped__ is originals[name] for name in originals)
        assert torch.equal(bnbf.dequantize_4bit(W, qs), reference)
    finally:
        model_patch.use_triton_dequantize(enable=False)
    assert called == ["first", "second", "first"]
    assert all(_current(name) is originals[name] for name in originals)


CPU_WITHOUT_THE_INTERPRETER = textwrap.dedent("""
    import json, sys, warnings
    sys.path[:0] = [{root!r}, {tests!r}]
    warnings.simplefilter("error", RuntimeWarning)  # an unexpected kernel failure warns: make it fail
    import bitsandbytes.functional as bnbf, torch
    import model_patch
    from benchmarks.cells import load_kernel_cells
    cells = load_kernel_cells()
    W, qs = bnbf.quantize_4bit(torch.randn(64, 128), blocksize=64, quant_type="nf4")
    reference = bnbf.dequantize_4bit(W, qs)
    with model_patch.use_triton_dequantize(cells.dequantize_nf4):
        ours = bnbf.dequantize_4bit(W, qs)
    print(json.dumps({{"interpreted": cells.INTERPRETED, "same": torch.equal(ours, reference),
                      "triton": model_patch.PATCH_CALLS["dequantize_4bit", "triton"],
                      "bitsandbytes": model_patch.PATCH_CALLS["dequantize_4bit", "bitsandbytes"]}}))
""")


def test_a_cpu_weight_without_the_interpreter_goes_to_bitsandbytes_quietly(tmp_path):
    """Without TRITON_INTERPRET the kernel refuses a CPU weight in its own words ("dequantize_nf4:
    ... runs on CUDA"): the patch takes that as a decline, without a warning, and bitsandbytes answers."""
    script = tmp_path / "cpu_without_the_interpreter.py"
    script.write_text(CPU_WITHOUT_THE_INTERPRETER.format(root=str(ROOT), tests=str(ROOT / "tests")))
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environment,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"interpreted": False, "same": True, "triton": 0, "bitsandbytes": 1}, report


def test_the_notebooks_check_in_a_small_llama(kernel):
    """What the notebook's cell tagged model-check runs: bit-identical in bf16 and fp16, the kernel
    dequantizing, and lines that fit the notebook's output."""
    exact, lines = model_patch.check_in_a_small_llama(kernel.dequantize_nf4, DEVICE)
    assert exact, lines
    for dtype_name, said, counts in zip(("bf16", "fp16"), lines[0::2], lines[1::2]):
        assert said.startswith(f"{dtype_name}: logits and ") and "bit-identical with and without" in said
        assert counts.lstrip().startswith("our kernel dequantized ") and "bitsandbytes kept 0" in counts
    replaced = " ".join(lines[4:])
    assert replaced.startswith("Replaced while on: bitsandbytes.functional.dequantize_4bit, ")
    assert all(len(line) <= 120 for line in lines), lines

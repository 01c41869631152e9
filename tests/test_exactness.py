"""The kernel cells against bitsandbytes, torch.equal, in the interpreter (CPU) or on the GPU."""

import pytest
import torch

import helpers
from conftest import DEVICE
from reference import references

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# (out, in): whole tiles, one block, a (1, n) weight, rows that are not whole blocks, a partial
# last block, an element count that is not a multiple of a program's tile.
SHAPES = [(128, 256), (1, 64), (1, 1024), (33, 96), (3, 7), (5, 40), (300, 520), (64, 4160)]


def _check(kernel, layer):
    W, qs = layer.weight, layer.weight.quant_state
    ours = kernel.triton_dequantize_nf4(layer)
    refs = references(W, qs)
    assert refs
    for name, ref in refs.items():
        assert ours.shape == ref.shape and ours.dtype == ref.dtype == qs.dtype, name
        assert ours.is_contiguous()
        assert torch.equal(ours, ref), f"differs from bitsandbytes ({name}) in " \
            f"{(ours != ref).sum().item()} of {ref.numel()} values"
    return ours


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_bitsandbytes(kernel, shape, dtype):
    layer = helpers.make_layer(*shape, dtype, device=DEVICE, seed=sum(shape))
    _check(kernel, layer)


@pytest.mark.parametrize("seed", range(6))
def test_many_seeds_and_scales(kernel, seed):
    # Weights of very different magnitudes exercise the scale's rounding (the no-FMA rule).
    torch.manual_seed(seed)
    dtype = DTYPES[seed % 3]
    with torch.no_grad():
        import bitsandbytes as bnb
        weight = torch.randn(96, 256) * 10.0 ** torch.randint(-6, 4, (96, 1)).float()
        layer = bnb.nn.Linear4bit(256, 96, bias=None, compute_dtype=dtype, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4")
        layer = layer.to(DEVICE)
        layer.weight.quant_state.dtype = dtype
    _check(kernel, layer)


def test_second_call_uses_the_same_result(kernel):
    layer = helpers.make_layer(64, 256, torch.bfloat16, device=DEVICE)
    first = _check(kernel, layer)
    second = _check(kernel, layer)
    assert first.data_ptr() != second.data_ptr(), "every call must return a new tensor"


def test_quant_state_dtype_change_is_followed(kernel):
    layer = helpers.make_layer(64, 256, torch.float16, device=DEVICE)
    _check(kernel, layer)
    layer.weight.quant_state.dtype = torch.bfloat16
    assert _check(kernel, layer).dtype == torch.bfloat16


def test_returns_transpose_for_a_one_row_packed_weight(kernel):
    # fast_dequantize returns out.t() when W.shape[0] == 1; the kernel cell does the same.
    layer = helpers.make_layer(16, 64, torch.float16, device=DEVICE)
    W, qs = layer.weight, layer.weight.quant_state
    row = W.data.reshape(1, -1)
    out = kernel.dequantize_nf4(row, qs)
    ref = references(W, qs)
    assert all(torch.equal(out, r.t()) for r in ref.values())


def test_bf16_rounds_to_nearest_even(kernel):
    # The interpreter's own fp32 -> bf16 cast truncates; the kernel must round.
    layer = helpers.make_layer(64, 1024, torch.bfloat16, device=DEVICE, seed=7)
    ours = _check(kernel, layer)
    as_fp32 = helpers.make_layer(64, 1024, torch.float32, device=DEVICE, seed=7)
    exact = kernel.triton_dequantize_nf4(as_fp32)
    truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert not torch.equal(ours, truncated), "bf16 output looks truncated, not rounded"
    assert torch.equal(ours, exact.to(torch.bfloat16))


def test_bf16_ties_round_to_even(kernel):
    # products exactly halfway between two bf16 values (code 1.0 times an fp32 absmax with its low 16 bits
    # 0x8000): bitsandbytes rounds to the even one, down for 1 + 2**-8, up for 1 + 3 * 2**-8
    import bitsandbytes.functional as bnbf
    torch.manual_seed(0)
    W, qs = bnbf.quantize_4bit(torch.randn(4, 64, device=DEVICE), blocksize=64, quant_type="nf4",
                               compress_statistics=False)
    qs.dtype = torch.bfloat16
    W.fill_(0xFF)  # every nibble 15: NF4's code 1.0
    qs.absmax = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1.0], device=DEVICE)
    ours = kernel.dequantize_nf4(W, qs)
    assert torch.equal(ours.view(torch.int16), bnbf.dequantize_4bit(W, qs).view(torch.int16))
    assert ours[:, 0].tolist() == [1.0, 1 + 2**-6, -1.0, 1.0]


def test_a_nan_scale_gives_the_nan_bitsandbytes_cuda_kernel_writes(kernel):
    # bitsandbytes' CUDA kernel writes bf16 NaN as 0x7FFF; its CPU path as 0x7FC0 (torch's cast). Interpreted, the
    # kernel's own rounding (_to_bf16_rne) runs and must write 0x7FFF; on a GPU, bitsandbytes' own bits
    import bitsandbytes.functional as bnbf
    torch.manual_seed(0)
    W, qs = bnbf.quantize_4bit(torch.randn(2, 64, device=DEVICE), blocksize=64, quant_type="nf4",
                               compress_statistics=False)
    qs.dtype = torch.bfloat16
    W.fill_(0xFF)
    qs.absmax = torch.tensor([float("nan"), 1.0], device=DEVICE)
    ours = kernel.dequantize_nf4(W, qs).view(torch.int16)
    if DEVICE == "cuda":
        assert torch.equal(ours, bnbf.dequantize_4bit(W, qs).view(torch.int16))
    else:
        assert (ours[0] == 0x7FFF).all() and (ours[1] == 0x3F80).all()  # NaN; 1.0


@pytest.mark.parametrize("blocksize2", [8, 16, 64])
def test_a_state2_blocksize_from_8_gives_bitsandbytes_bits(kernel, blocksize2):
    # a state2.blocksize below bitsandbytes' 256, down to the 8 codes its CUDA kernel scales at once (below 8 is
    # refused: test_errors.py): one absmax2 per blocksize2 absmax codes, as on both of bitsandbytes' kernels
    layer = helpers.make_layer(64, 256, torch.bfloat16, device=DEVICE, seed=blocksize2)
    qs = layer.weight.quant_state
    generator = torch.Generator().manual_seed(blocksize2)
    qs.state2.absmax = (torch.rand(-(-qs.absmax.numel() // blocksize2), generator=generator) + 0.5).to(DEVICE)
    qs.state2.blocksize = blocksize2
    _check(kernel, layer)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp4_zero_codes_carry_the_sign_bitsandbytes_gives_them(kernel, dtype):
    # bitsandbytes' CUDA kernel decodes FP4's code 0b1000 to -0.0, where its get_4bit_type table holds +0.0: the
    # table this kernel reads is bitsandbytes' own decoding of codes 0 to 15, on the host's CPU, so on an x86 GPU
    # host (whose CUDA build decodes by its scalar path, -0.0) every bit agrees. On the CPU its paths disagree
    # (AVX-512, NEON and the generic one give +0.0, the scalar one -0.0); the table and this weight's reference
    # take the same one here. (An aarch64 GPU host's NEON path would give its kept tables +0.0.)
    import bitsandbytes.functional as bnbf
    from reference import assert_same_bits
    W, qs = bnbf.quantize_4bit(torch.randn(32, 256, device=DEVICE), blocksize=64, quant_type="fp4")
    W.view(torch.uint8)[::3] = 0x88  # code 0b1000 in both halves of every third byte
    qs.dtype = dtype
    theirs = bnbf.dequantize_4bit(W, qs)
    if DEVICE == "cuda":
        assert torch.signbit(theirs[theirs == 0]).any()  # (code 0b0000 decodes to +0.0)
    assert_same_bits(kernel.dequantize_nf4(W, qs), theirs, "fp4")

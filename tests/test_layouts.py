"""Every 4-bit layout bitsandbytes makes, drawn at random (seeded, bounded): exact, torch.equal."""
import itertools
import random

import pytest
import torch
import bitsandbytes.functional as bnbf

import helpers
from conftest import DEVICE, GPU
from reference import references

BLOCKSIZES = [32, 64, 128, 256, 512, 1024, 2048, 4096]
STORAGES = [torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _layouts(seed, count):
    rng = random.Random(seed)
    for _ in range(count):
        rows = rng.choice([1, 2, 3, 7, 16, 33, 100])
        cols = rng.choice([2, 8, 64, 96, 130, 320, 1000, 4096])
        yield dict(shape=(rows, cols), quant_type=rng.choice(["nf4", "fp4"]),
                   compress_statistics=rng.random() < 0.7, blocksize=rng.choice(BLOCKSIZES),
                   quant_storage=rng.choice(STORAGES), dtype=rng.choice(DTYPES),
                   scale=10.0 ** rng.randint(-4, 3))


@pytest.mark.parametrize("chunk", range(4))
def test_random_layouts(kernel, chunk):
    checked = 0
    for layout in _layouts(1000 + chunk, 40 if GPU else 25):
        n = layout["shape"][0] * layout["shape"][1]
        if ((n + 1) // 2) % layout["quant_storage"].itemsize:
            # bitsandbytes can't fill such a storage: on the CPU it refuses, on CUDA it makes one
            # too short for the packed bytes (seen: 452 bytes for 455). The kernel refuses a
            # short W (test_errors.py).
            continue
        torch.manual_seed(checked)
        weight = torch.randn(layout["shape"], device=DEVICE) * layout["scale"]
        W, qs = bnbf.quantize_4bit(weight, blocksize=layout["blocksize"], quant_type=layout["quant_type"],
                                   compress_statistics=layout["compress_statistics"],
                                   quant_storage=layout["quant_storage"])
        qs.dtype = layout["dtype"]
        out = kernel.dequantize_nf4(W, qs)
        refs = references(W, qs)
        assert refs
        for name, ref in refs.items():
            assert torch.equal(out, ref), f"{layout} differs from bitsandbytes ({name})"
        checked += 1
    assert checked >= 10, f"only {checked} layouts were made"


@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "fp32-absmax"])
def test_every_blocksize(kernel, blocksize, nested):
    weight = torch.randn(24, 4096, device=DEVICE)
    W, qs = bnbf.quantize_4bit(weight, blocksize=blocksize, compress_statistics=nested, quant_type="nf4")
    qs.dtype = torch.bfloat16
    out = kernel.dequantize_nf4(W, qs)
    assert all(torch.equal(out, ref) for ref in references(W, qs).values())


def test_the_bounds_just_under_2_31_weights_do_not_wrap(kernel):
    # Triton passes an n below 2**31 as an int32: for n from 2**31 - BLOCKSIZE + 1 to 2**31 - 1, a bound computed
    # as (n + BLOCKSIZE - 1) // BLOCKSIZE (or, at 2**31 - 1, (n + 1) // 2) wrapped negative and masked every absmax
    # (every packed byte) off: a scale of 0, or the offset alone where nested. Program 0 alone, launched as for such
    # an n, reads and writes only the first tile: a weight of one tile stands in for it, against bitsandbytes' bits
    layer = helpers.make_layer(32, 64, torch.float16, device=DEVICE)
    W, qs = layer.weight, layer.weight.quant_state
    layout = kernel.validate(W, qs)
    expected = bnbf.dequantize_4bit(W, qs).view(-1)
    capability = kernel.device_capability(layout.packed.device)
    config = kernel.DEFAULT_CONFIG
    assert config.weights_per_program == expected.numel()
    for n in (2**31 - qs.blocksize + 1, 2**31 - 1):
        grid, args, constexprs, options = kernel.launch_arguments(
            layout, torch.empty(n, dtype=layout.dtype, device="meta"), config, capability)
        assert constexprs["MASKED"] and constexprs["WIDE"], n
        out = torch.full_like(expected, float("nan"))
        kernel._dequantize_4bit_kernel[(1,)](*args[:-2], out, n, **constexprs, **options)
        assert torch.equal(out, expected), f"n = 2**31 - {2**31 - n}: {int((out != expected).sum())} values differ"


def test_the_launch_takes_int64_offsets_from_2_31_weights_and_no_fma_without_ptx(kernel, monkeypatch):
    # exactness rules of launch_arguments, read without a launch (a meta output holds no data): offsets are
    # int64 where the last tile reaches 2**31 weights; without inline PTX (the interpreter, a config without it)
    # Triton may not contract the scale's product and sum into an FMA; interpreted, whatever the GPU (its tensors
    # run on the CPU then), no inline PTX, which the interpreter cannot run, and bf16 rounded by hand
    layer = helpers.make_layer(64, 256, torch.bfloat16, device=DEVICE)
    layout = kernel.validate(layer.weight, layer.weight.quant_state)
    config = kernel.DEFAULT_CONFIG
    tile = config.weights_per_program
    for n, wide in ((2**31 - tile, True), (2**31 - 2 * tile, False)):
        out = torch.empty(n, dtype=torch.bfloat16, device="meta")
        constexprs = kernel.launch_arguments(layout, out, config, (9, 0))[2]
        assert constexprs["WIDE"] is wide, n
    out = torch.empty(layout.shape, dtype=layout.dtype, device="meta")
    for chosen, interpreted in itertools.product((config, config._replace(ptx=False)), (False, True)):
        monkeypatch.setattr(kernel, "INTERPRETED", interpreted)
        _, _, constexprs, options = kernel.launch_arguments(layout, out, chosen, (9, 0))
        ptx = chosen.ptx and not interpreted
        assert constexprs["PTX"] is ptx and constexprs["BF16_RNE"] is interpreted, (chosen, interpreted)
        assert options.get("enable_fp_fusion", True) is ptx, (chosen, interpreted)

"""Every 4-bit layout bitsandbytes makes, drawn at random (seeded, bounded): exact, torch.equal."""
import random

import pytest
import torch
import bitsandbytes.functional as bnbf

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

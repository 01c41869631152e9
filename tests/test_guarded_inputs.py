"""Loads past the end of an input, seen on the CPU: each tensor the kernel reads is copied flush against a page
that may not be read (mmap, mprotect PROT_NONE), so a load the kernel's masks should have stopped faults. In the
interpreter, in a process of its own per input: the packed weight, the absmax codes, and state2's absmax (with
absmax codes re-quantized in blocks of 16, so the last block is partial)."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import GPU, ROOT

GUARDED = textwrap.dedent("""
    import ctypes, mmap, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    import torch, bitsandbytes.functional as bnbf
    import helpers
    from benchmarks.cells import load_kernel_cells
    from reference import references
    PAGE, kept = mmap.PAGESIZE, []

    def guarded(tensor):
        # tensor's bytes ending where a page that may not be read begins
        nbytes = tensor.numel() * tensor.element_size()
        pages = -(-nbytes // PAGE)
        buffer = mmap.mmap(-1, (pages + 1) * PAGE)
        start = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(start + pages * PAGE), PAGE, 0) == 0
        kept.append(buffer)
        copy = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=pages * PAGE - nbytes)
        copy = copy.view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        return copy

    kernel = load_kernel_cells()
    layer = helpers.make_layer(33, 64, torch.bfloat16, device="cpu", seed=5)  # 2112 weights: a partial tile
    W, qs = layer.weight.data, layer.weight.quant_state
    which = {which!r}
    if which == "state2.absmax":  # absmax codes in blocks of 16: the last of its 3 blocks is partial
        absmax = bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
        qs.absmax, qs.state2 = bnbf.quantize_blockwise(absmax - qs.offset, blocksize=16)
    references = references(W, qs)
    if which == "W":
        W = guarded(W)
    elif which == "absmax":
        qs.absmax = guarded(qs.absmax)
    else:
        qs.state2.absmax = guarded(qs.state2.absmax)
    out = kernel.dequantize_nf4(W, qs)
    print("EXACT" if all(torch.equal(out, r) for r in references.values()) else "DIFFERENT")
""")


@pytest.mark.skipif(GPU, reason="the interpreter reads CPU memory: a GPU's tensors are not in these pages")
@pytest.mark.parametrize("which", ["W", "absmax", "state2.absmax"])
def test_no_load_reads_past_an_input(tmp_path, which):
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED.format(root=str(ROOT), tests=str(ROOT / "tests"), which=which))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip().endswith("EXACT"), result.stdout[-500:]

"""The direct launch against the installed Triton's own launcher, without a GPU (offline_gpu.py):
for a nested and a plain layout, Triton's launch, then a replay recorded from it; and with a launch
hook set, which must make the direct launch decline. Prints one JSON line. Run in its own process.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

import helpers  # noqa: E402


def case(kernel, layout, hook=None):
    """Triton's own launch into `out`, then direct_launch from it and one replay into a new tensor."""
    out = torch.empty(layout.shape, dtype=layout.dtype)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.DEFAULT_CONFIG, (7, 5))
    launch = kernel._dequantize_4bit_kernel[grid]
    offline_gpu.set_launch_hook(hook)
    try:
        compiled = launch(*args, **constexprs, **options)  # compiles for sm_75
        fake = offline_gpu.fake_launch_of(compiled)
        fake.expect_output(out)
        launch(*args, **constexprs, **options)  # Triton's own launch "writes" out
        replay = kernel.direct_launch(compiled, lambda: launch(*args, **constexprs, **options), args, out)
        result = {"replay": replay is not None}
        if replay is not None:
            second = torch.empty_like(out)
            replay(second)
            result["replay_matches_triton"] = torch.equal(kernel._bits(second), kernel._bits(out))
        result["problems"] = fake.problems
        return result
    finally:
        offline_gpu.set_launch_hook(None)
        fake.output = None  # Triton >= 3.7 shares one launch function: the next case is another tensor


def main():
    offline_gpu.install(75)
    kernel = helpers.load_kernel_cells()
    report = {"triton": offline_gpu.triton.__version__}
    weight = torch.randn(64, 256)
    for name, nested, dtype in (("nested", True, torch.bfloat16), ("plain", False, torch.float32),
                                ("with_launch_hook", True, torch.float16)):
        W, qs = bnbf.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=nested)
        qs.dtype = dtype
        hook = (lambda *args: None) if name == "with_launch_hook" else None
        report[name] = case(kernel, kernel.nf4_layout(W, qs), hook)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

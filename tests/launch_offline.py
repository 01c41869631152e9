"""The fast-launch cell against the installed Triton's own launcher, without a GPU (offline_gpu.py):
for a nested and a plain layout, Triton's launch, then the plan learned from it and one fast call;
a launch hook set before the first call (nothing is learned) and after it (the fast call steps
aside, so that Triton's launch calls the hook); a QuantState field deleted after it (it steps aside
too). Prints one JSON line. Run in its own process."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from kernel_cells import load_kernel_cells  # noqa: E402
from reference import bits  # noqa: E402


def case(kernel, W, q, hook_before=False):
    """Triton's own launch into `out`, the fast-launch cell learning from it, then fast calls."""
    layout = kernel.nf4_layout(W, q)
    out = torch.empty(layout.shape, dtype=layout.dtype)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.DEFAULT_CONFIG, (7, 5))

    def launch():
        return kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)

    hook_calls = []
    offline_gpu.set_launch_hook((lambda *a: hook_calls.append(a)) if hook_before else None)
    try:
        compiled = launch()  # compiles for sm_75
        fake = offline_gpu.fake_launch_of(compiled)
        fake.expect_output(out)
        launch()  # Triton's own launch "writes" out
        kernel.fast_launch.learn(W, q, compiled, launch, out, layout.transposed)
        fast = kernel.fast_launch(W, q)
        result = {"fast": fast is not None}
        if fast is not None:
            result["fast_matches_triton"] = torch.equal(bits(fast), bits(out))
            offline_gpu.set_launch_hook(lambda *a: hook_calls.append(a))  # a profiler starts
            result["fast_with_a_hook_set_later"] = kernel.fast_launch(W, q) is not None
            offline_gpu.set_launch_hook(None)
            code = q.code
            del q.code  # Triton's path names the missing field: the fast launch steps aside, raising nothing
            result["fast_with_a_field_deleted"] = kernel.fast_launch(W, q) is not None
            q.code = code
        result["problems"] = fake.problems
        return result
    finally:
        offline_gpu.set_launch_hook(None)
        fake.output = None  # Triton >= 3.7 shares one launch function: the next case is another tensor


def main():
    offline_gpu.install(75)
    kernel = load_kernel_cells()
    report = {"triton": offline_gpu.triton.__version__}
    weight = torch.randn(64, 256)
    for name, nested, dtype in (("nested", True, torch.bfloat16), ("plain", False, torch.float32),
                                ("with_launch_hook", True, torch.float16)):
        W, qs = bnbf.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=nested)
        qs.dtype = dtype
        report[name] = case(kernel, W, qs, hook_before=name == "with_launch_hook")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""The launch path against the installed Triton's own launcher, without a GPU (offline_gpu.py): for
a nested and a plain layout, Triton's launch, then a launch of the same compiled kernel recorded
and made a plan, and one call through the plan; a launch hook set before (no plan is made) and after
(the plan steps aside, so that Triton's launch calls the hook); a QuantState field deleted after it
(it steps aside too). Prints one JSON line. Run in its own process."""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from kernel_cells import NOTEBOOK, PASTE_UNIT, load_kernel_cells  # noqa: E402
from reference import bits  # noqa: E402


def case(kernel, name, W, q, hook_before=False):
    """Triton's own launch into `out`, a second launch learned from, then calls through the plan."""
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
        kernel._last_compiled[name] = launch()  # Triton's own launch "writes" out
        triton_bits = bits(out).clone()
        kernel._launch_and_learn(W, q, out, layout.transposed, launch, name)  # recorded on the way
        plan = kernel._plans.get(kernel._identity(q))
        result = {"fast": plan is not None, "recorded_launch_unchanged": torch.equal(bits(out), triton_bits)}
        if plan is not None:
            fast = plan(W, q)
            result["fast_matches_triton"] = fast is not None and torch.equal(bits(fast), triton_bits)
            offline_gpu.set_launch_hook(lambda *a: hook_calls.append(a))  # a profiler starts
            result["fast_with_a_hook_set_later"] = plan(W, q) is not None
            offline_gpu.set_launch_hook(None)
            code = q.code
            del q.code  # Triton's path names the missing field: the plan steps aside, raising nothing
            result["fast_with_a_field_deleted"] = plan(W, q) is not None
            q.code = code
        result["problems"] = fake.problems
        return result
    finally:
        offline_gpu.set_launch_hook(None)
        fake.output = None  # Triton >= 3.7 shares one launch function: the next case is another tensor


def main():
    offline_gpu.install(75)
    kernel = load_kernel_cells(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)), tags=PASTE_UNIT)
    report = {"triton": offline_gpu.triton.__version__}
    weight = torch.randn(64, 256)
    for name, nested, dtype in (("nested", True, torch.bfloat16), ("plain", False, torch.float32),
                                ("with_launch_hook", True, torch.float16)):
        W, qs = bnbf.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=nested)
        qs.dtype = dtype
        report[name] = case(kernel, name, W, qs, hook_before=name == "with_launch_hook")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""What a T4 (sm_75) and a Hopper GPU (sm_90) will run, built offline by Triton's own JIT over the
stand-in GPU of offline_gpu.py: the kernel on a real layout with each configuration that GPU can
pick (its LAUNCH_CONFIGS entries: sm_75's and sm_90's) and
each output dtype; and the oldest GPU the wrapper accepts (MIN_CAPABILITY, sm_70) with the default
configuration. Prints one JSON line. Run in its own process.
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from benchmarks.cells import load_kernel_cells  # noqa: E402

OUT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def build(kernel, capability, dtype, config, shape=(256, 256)):
    """The kernel compiled by Triton's JIT for `capability`, as the wrapper would launch it."""
    W, qs = bnbf.quantize_4bit(torch.randn(shape), blocksize=64, quant_type="nf4", compress_statistics=True)
    qs.dtype = dtype
    layout = kernel.validate(W, qs)
    out = torch.empty(layout.shape, dtype=dtype)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, divmod(capability, 10))
    return kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)


def ptxas_report(ptx, capability):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        arch = f"sm_{capability}{'a' if capability >= 90 else ''}"
        result = subprocess.run([offline_gpu.ptxas_path(capability), "-v", f"--gpu-name={arch}", str(path),
                                 "-o", str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True)
    return result.stderr + result.stdout + f"\nexit {result.returncode}"


def exactness_builds(kernel):
    """Two rules only a build shows: without inline PTX (a config with ptx False) no FMA contracts the scale's
    product and sum; with WIDE the program's offsets are widened to int64 (TTIR's sign extensions counted)."""
    plain = build(kernel, 90, torch.bfloat16, kernel.DEFAULT_CONFIG._replace(ptx=False)).asm["ptx"]
    W, qs = bnbf.quantize_4bit(torch.randn(256, 256), blocksize=64, quant_type="nf4", compress_statistics=True)
    qs.dtype = torch.bfloat16
    layout = kernel.validate(W, qs)
    out = torch.empty(layout.shape, dtype=torch.bfloat16)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.DEFAULT_CONFIG, (9, 0))
    extensions = {}
    for wide in (True, False):
        compiled = kernel._dequantize_4bit_kernel[grid](*args, **dict(constexprs, WIDE=wide), **options)
        extensions[str(wide)] = compiled.asm["ttir"].count("arith.extsi")
    return {"fma_without_ptx": plain.count("fma.rn.f32"), "int64_extensions": extensions}


def configs_for(kernel, capability):
    if divmod(capability, 10) == kernel.MIN_CAPABILITY:
        return [kernel.DEFAULT_CONFIG]
    return [kernel.LAUNCH_CONFIGS.get(divmod(capability, 10), kernel.DEFAULT_CONFIG)]


def main():
    report = []
    kernel = None
    for capability in (70, 75, 90):
        offline_gpu.install(capability)
        kernel = kernel or load_kernel_cells()
        for config in configs_for(kernel, capability):
            for out, dtype in OUT.items():
                compiled = build(kernel, capability, dtype, config)
                ptx = compiled.asm["ptx"]
                report.append({
                    "capability": capability, "out": out, "config": list(config),
                    "stores": re.findall(r"st\.global\S*", ptx),
                    "loads": re.findall(r"ld\.global\S*", ptx),
                    "cubin_bytes": len(compiled.asm["cubin"]),
                    "ptxas": ptxas_report(ptx, capability),
                    "inline_ptx": "mul.rn.f32" in ptx and "add.rn.f32" in ptx,
                    "native_bf16_cvt": bool(re.search(r"cvt\.\S*bf16", ptx)),
                })
    minimum = kernel.MIN_CAPABILITY[0] * 10 + kernel.MIN_CAPABILITY[1]
    print(json.dumps({"triton": offline_gpu.triton.__version__, "min_capability": minimum, "builds": report,
                      "exactness": exactness_builds(kernel)}))


if __name__ == "__main__":
    main()

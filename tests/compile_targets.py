"""Compiles the notebook's kernel offline for a GPU target and prints what the tests check, as
JSON. Run in its own process: the interpreter, once used, patches triton.language for good."""
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import helpers  # noqa: E402

OUT = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}


def compile_kernel(kernel_module, capability: int, out: str, config, blocksize=64, nested=True):
    weights_per_program, num_warps, lookup, stream = config
    signature = {"packed_ptr": "*u8", "absmax_ptr": "*u8" if nested else "*fp32",
                 "absmax2_ptr": "*fp32", "code2_ptr": "*fp32", "offset_ptr": "*fp32",
                 "code_ptr": "*fp32", "out_ptr": OUT[out], "n_elements": "i32"}
    constexprs = dict(BLOCKSIZE=blocksize, BLOCKSIZE2=256, NESTED=nested,
                      BLOCKS_PER_PROGRAM=max(1, weights_per_program // blocksize), MASKED=False,
                      WIDE=False, LOOKUP=lookup, PTX=True, BF16_RNE=False, STREAM=stream)
    signature.update({name: "constexpr" for name in constexprs})
    # What the JIT specializes for 16-byte aligned pointers and sizes divisible by 16.
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(8)}
    source = ASTSource(kernel_module._dequantize_4bit_kernel, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps})


def ptxas_report(ptx: str, capability: int) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        result = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{capability}{'a' if capability >= 90 else ''}", str(path),
                                 "-o", str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True)
    return result.stderr + result.stdout + f"\nexit {result.returncode}"


def main():
    kernel = helpers.load_kernel_cells()
    report = []
    for capability in (75, 90):
        table = kernel.LAUNCH_CONFIGS.get((capability // 10, capability % 10), kernel.LAUNCH_CONFIGS[None])
        for _, config in table:
            for out in OUT:
                compiled = compile_kernel(kernel, capability, out, config)
                ptx = compiled.asm["ptx"]
                report.append({
                    "capability": capability, "out": out, "config": list(config),
                    "stores": re.findall(r"st\.global\S*", ptx),
                    "loads": re.findall(r"ld\.global\S*", ptx),
                    "cubin_bytes": len(compiled.asm["cubin"]),
                    "ptxas": ptxas_report(ptx, capability),
                    "inline_ptx": "mul.rn.f32" in ptx and "add.rn.f32" in ptx,
                })
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""Timing, device facts, the published test procedure, result files and plots for the NF4 notebook.

Nothing here is the kernel: the kernel lives in the notebook's cells tagged `kernel`, and
`load_kernel_cells` imports those cells as a module for the tests and the benchmark.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

ROOT = Path(__file__).resolve().parent
NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"

# The published procedure's cases: (bsz, qlen, hd, m, seed, dtype), in order.
PROCEDURE_CASES = (
    (2, 3333, 2048, 8192, 3407, torch.float16),
    (5, 777, 1024, 4096, 3409, torch.bfloat16),
    (3, 2048, 4096, 14336, 3408, torch.bfloat16),
)
# Weight shapes (out, in) timed kernel-only: the procedure's three, plus a 70B-class MLP weight.
KERNEL_SHAPES = ((8192, 2048, torch.float16), (4096, 1024, torch.bfloat16),
                 (14336, 4096, torch.bfloat16), (28672, 8192, torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# The kernel cells
# ---------------------------------------------------------------------------------------------
def kernel_cell_sources(notebook: Path = NOTEBOOK) -> list[str]:
    """The source of every code cell tagged `kernel`, in notebook order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells
               if c["cell_type"] == "code" and "kernel" in c.get("metadata", {}).get("tags", [])]
    if not sources:
        raise LookupError(f"{notebook} has no code cell tagged 'kernel'")
    return sources


def load_kernel_cells(notebook: Path = NOTEBOOK, name: str = "nf4_kernel_cells"):
    """Import the notebook's kernel cells as a module, run in order in a fresh namespace.

    Triton reads a kernel's source with `inspect`, and torch.compile imports a kernel's module by
    name, so the cells are written to a real file and the module is registered in sys.modules.
    """
    if name in sys.modules:
        return sys.modules[name]
    source = "\n\n".join(kernel_cell_sources(notebook))
    directory = Path(tempfile.mkdtemp(prefix="nf4_cells_"))
    path = directory / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# ---------------------------------------------------------------------------------------------
# The device and the software
# ---------------------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:
        return "not installed"


def environment() -> dict:
    """GPU, driver and library versions, for printing and for every result file."""
    import triton
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "bitsandbytes": _version("bitsandbytes"),
        "unsloth": _version("unsloth"),
        "gpu": "none (CPU, TRITON_INTERPRET=1)",
        "capability": None,
        "driver": None,
        "sm_count": None,
        "peak_bandwidth_gbs": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                     sm_count=props.multi_processor_count,
                     memory_gib=round(props.total_memory / 2**30, 1),
                     l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                     peak_bandwidth_gbs=peak_bandwidth_gbs())
        try:
            facts["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:
            facts["driver"] = "unknown"
    return facts


def peak_bandwidth_gbs(device: int = 0) -> float | None:
    """The datasheet-style peak: memory clock x bus width x 2 (DDR), from the driver."""
    try:
        import triton
        props = triton.runtime.driver.active.utils.get_device_properties(device)
        return round(2 * props["mem_clock_rate"] * 1e3 * props["mem_bus_width"] / 8 / 1e9, 1)
    except Exception:
        return None


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3', for results/<gpu>/."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


# ---------------------------------------------------------------------------------------------
# Timers
# ---------------------------------------------------------------------------------------------
@dataclass
class BenchResult:
    """Kernel time from triton.testing.do_bench, in microseconds."""
    median_us: float
    p20_us: float
    p80_us: float

    def gbs(self, n_bytes: float) -> float:
        return n_bytes / (self.median_us * 1e-6) / 1e9


def bench(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 200) -> BenchResult:
    """Median and 20th/80th percentiles of fn's GPU time, L2 flushed before each call."""
    import triton
    p50, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                            quantiles=[0.5, 0.2, 0.8])
    return BenchResult(p50 * 1e3, p20 * 1e3, p80 * 1e3)


def cpu_cost_us(fn: Callable[[], object], calls: int = 2000, repeats: int = 5) -> float:
    """CPU time of one call of fn, GPU work excluded: the mean over `calls` calls issued without
    waiting (use work the GPU finishes faster than the CPU issues it), median of `repeats`."""
    for _ in range(50):
        fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    synchronize()
    return statistics.median(times)


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def packed_bytes(n_elements: int, out_dtype: torch.dtype, blocksize: int = 64) -> int:
    """Bytes a dequantization must move: packed codes and absmax codes in, the output out."""
    out_size = torch.empty(0, dtype=out_dtype).element_size()
    return n_elements // 2 + n_elements // blocksize + n_elements * out_size


# ---------------------------------------------------------------------------------------------
# The published test procedure (test_dequantize, 18 Feb 2025), re-implemented
# ---------------------------------------------------------------------------------------------
def set_seed(seed: int):
    try:
        from transformers import set_seed as hf_set_seed
        hf_set_seed(seed)
    except ImportError:
        import random
        random.seed(seed)
        torch.manual_seed(seed)


def silu():
    try:
        from transformers.activations import ACT2FN
        return ACT2FN["silu"]
    except ImportError:
        return torch.nn.SiLU()


class MLP(torch.nn.Module):
    """gate (hd -> m), up (hd -> m), down (m -> hd) as bitsandbytes NF4 layers, SiLU."""

    def __init__(self, hd: int, m: int, dtype: torch.dtype, device: str):
        super().__init__()
        import bitsandbytes as bnb
        make = lambda i, o: bnb.nn.Linear4bit(i, o, bias=None, compute_dtype=dtype,
                                              quant_type="nf4").to(device)
        self.gate_proj, self.up_proj, self.down_proj = make(hd, m), make(hd, m), make(m, hd)
        for layer in self.layers():
            layer.weight.quant_state.dtype = dtype
        self.act_fn = silu()

    def layers(self):
        return self.gate_proj, self.up_proj, self.down_proj

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def mlp_with_weights(X, gate, up, down, act_fn):
    """The MLP computed from dequantized weights, as the procedure does: X @ W.t()."""
    return (act_fn(X @ gate.t()) * (X @ up.t())) @ down.t()


def check_quant_state_layout(layer, dtype):
    """The quant state must keep bitsandbytes' layout after our function has run on it."""
    W, qs = layer.weight, layer.weight.quant_state
    assert W.dtype == torch.uint8, f"weight dtype {W.dtype}"
    assert qs.dtype == dtype, f"quant_state.dtype {qs.dtype} != {dtype}"
    assert qs.absmax.dtype == torch.uint8, f"absmax dtype {qs.absmax.dtype}"
    assert qs.code.dtype == torch.float32 and qs.offset.dtype == torch.float32
    assert qs.state2.absmax.dtype == torch.float32 and qs.state2.code.dtype == torch.float32
    assert qs.blocksize == 64 and qs.state2.blocksize == 256


def make_case(case, device: str = "cuda", scale: int = 1):
    """One procedure case: (seeded MLP, X). scale > 1 shrinks hd, m and qlen for CPU runs."""
    bsz, qlen, hd, m, seed, dtype = case
    set_seed(seed)
    torch.set_default_dtype(torch.float32)
    mlp = MLP(hd // scale, m // scale, dtype, device)
    X = torch.randn(bsz, max(1, qlen // scale), hd // scale, dtype=dtype, device=device)
    return mlp, X


def warmup_checks(dequantize: Callable, reference: Callable, mlp: MLP, X: torch.Tensor, dtype):
    """The procedure's two warm-up rounds: the MLP from our weights matches the bnb module, the
    quant state keeps its layout, and each weight matches the reference's (assert_close)."""
    for _ in range(2):
        weights = [dequantize(layer) for layer in mlp.layers()]
        torch.testing.assert_close(mlp_with_weights(X, *weights, mlp.act_fn), mlp(X),
                                   check_stride=True)
        for layer in mlp.layers():
            check_quant_state_layout(layer, dtype)
        for layer, ours in zip(mlp.layers(), weights):
            theirs = reference(layer)
            assert ours.dtype == theirs.dtype == dtype
            torch.testing.assert_close(ours.t(), theirs.t(), check_stride=True)


def timed_loop(dequantize: Callable, mlp: MLP, iterations: int = 1000) -> float:
    """The procedure's timed part for one case: wall clock seconds of `iterations` rounds of
    up, gate, down, each dequantized, transposed and synchronized."""
    up, gate, down = mlp.up_proj, mlp.gate_proj, mlp.down_proj
    sync = synchronize
    start = time.time()
    for _ in range(iterations):
        dequantize(up).t()
        sync()
        dequantize(gate).t()
        sync()
        dequantize(down).t()
        sync()
    return time.time() - start


def compare_procedure(methods: dict[str, Callable], reference: Callable, repeats: int = 3,
                      iterations: int = 1000, device: str = "cuda", cases=PROCEDURE_CASES,
                      scale: int = 1) -> dict[str, list[float]]:
    """The procedure for several functions side by side in one process: each case's MLP is
    built once (same seed, same weights), every method passes the warm-up checks on it, then the
    methods' timed loops alternate, `repeats` times. Returns seconds per repeat, per method."""
    totals = {name: [0.0] * repeats for name in methods}
    for case in cases:
        mlp, X = make_case(case, device, scale)
        for dequantize in methods.values():
            warmup_checks(dequantize, reference, mlp, X, case[-1])
        for r in range(repeats):
            for name, dequantize in methods.items():
                totals[name][r] += timed_loop(dequantize, mlp, iterations)
        del mlp, X
    return totals


# ---------------------------------------------------------------------------------------------
# Baselines and benchmark tables (the benchmark script and the notebook share these)
# ---------------------------------------------------------------------------------------------
def import_unsloth_kernels():
    """unsloth.kernels.utils without running unsloth's package __init__ (which imports its whole
    training stack): the packages are registered as bare namespaces over their installed files.
    Returns the module, or None when unsloth is not installed."""
    import importlib
    import logging
    import types
    if "unsloth.kernels.utils" in sys.modules:
        return sys.modules["unsloth.kernels.utils"]
    for name in ("unsloth", "unsloth.kernels", "unsloth_zoo", "unsloth_zoo.temporary_patches"):
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            return None
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules[name] = package
    logging.disable(logging.WARNING)  # its import logs about training features not used here
    try:
        return importlib.import_module("unsloth.kernels.utils")
    finally:
        logging.disable(logging.NOTSET)


def dequantizers(kernel_module) -> dict[str, Callable]:
    """Every NF4 dequantization this machine can run, each taking a Linear4bit layer:
    ours; unsloth's fast_dequantize (its current fused Triton path) and its classic path
    (bitsandbytes ctypes, what the puzzle was written against); bitsandbytes' dequantize_4bit."""
    import bitsandbytes.functional as bnbf
    methods = {"ours": kernel_module.triton_dequantize_nf4}
    if torch.cuda.is_available():
        utils = import_unsloth_kernels()
        if utils is not None:
            fused, classic = utils.fast_dequantize, utils._fast_dequantize_ctypes
            methods["unsloth_fused"] = lambda layer: fused(layer.weight, layer.weight.quant_state)
            methods["unsloth_classic"] = lambda layer: classic(layer.weight, layer.weight.quant_state)
    methods["bnb"] = lambda layer: bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
    return methods


def make_layer(out_features: int, in_features: int, dtype: torch.dtype, device: str = "cuda",
               seed: int = 0, **kwargs):
    """A bitsandbytes Linear4bit (NF4, double quantized unless told otherwise) on device."""
    import bitsandbytes as bnb
    torch.manual_seed(seed)
    kwargs.setdefault("quant_type", "nf4")
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=None, compute_dtype=dtype,
                              **kwargs).to(device)
    layer.weight.quant_state.dtype = dtype
    return layer


def _copy_ceiling_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_ceiling(packed_ptr, out_ptr, n_bytes, BYTES: tl.constexpr):
        # Reads the packed bytes and writes two 16-bit values per byte, with no decoding:
        # the same bytes moved as a dequantization, so nothing that moves them can be faster.
        offsets = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
        packed = tl.load(packed_ptr + offsets, mask=offsets < n_bytes)
        value = packed.to(tl.uint16)
        tl.store(out_ptr + 2 * offsets[:, None] + tl.arange(0, 2)[None, :],
                 tl.join(value, value), mask=offsets[:, None] < n_bytes)

    return copy_ceiling


def copy_ceiling_us(n_elements: int, configs=((1024, 4), (2048, 4), (4096, 8), (8192, 8))) -> BenchResult:
    """Kernel time of the no-math kernel moving a dequantization's bytes: best of a small sweep."""
    kernel = _copy_ceiling_kernel()
    packed = torch.randint(0, 255, ((n_elements + 1) // 2,), dtype=torch.uint8, device="cuda")
    out = torch.empty(n_elements, dtype=torch.int16, device="cuda")
    best = None
    for block, warps in configs:
        grid = (-(-packed.numel() // block),)
        result = bench(lambda: kernel[grid](packed, out, packed.numel(), BYTES=block, num_warps=warps))
        if best is None or result.median_us < best.median_us:
            best = result
    return best


def device_copy_gbs(n_bytes: int = 1 << 30) -> float:
    """A device-to-device copy's bandwidth, counting bytes read plus written."""
    src = torch.empty(n_bytes // 2, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / (bench(lambda: dst.copy_(src)).median_us * 1e-6) / 1e9


def kernel_table(methods: dict[str, Callable], shapes=KERNEL_SHAPES, ceiling: bool = True,
                 repeats: int = 3) -> list[dict]:
    """Per shape: each method's do_bench time, GB/s, and the copy ceiling. The methods are timed in
    turn, `repeats` rounds; each number is the median of the rounds' medians (p20/p80 likewise)."""
    rows = []
    for out_features, in_features, dtype in shapes:
        layer = make_layer(out_features, in_features, dtype)
        n = out_features * in_features
        n_bytes = packed_bytes(n, dtype)
        row = {"shape": f"{out_features}x{in_features}", "dtype": str(dtype).replace("torch.", ""),
               "bytes": n_bytes}
        runs = {name: [] for name in methods}
        for _ in range(repeats):
            for name, fn in methods.items():
                runs[name].append(bench(lambda: fn(layer)))
        for name, results in runs.items():
            result = BenchResult(*(statistics.median(getattr(r, field) for r in results)
                                   for field in ("median_us", "p20_us", "p80_us")))
            row.update({f"{name}_us": result.median_us, f"{name}_p20_us": result.p20_us,
                        f"{name}_p80_us": result.p80_us, f"{name}_gbs": result.gbs(n_bytes)})
        if ceiling:
            result = copy_ceiling_us(n)
            row.update({"ceiling_us": result.median_us, "ceiling_gbs": result.gbs(n_bytes)})
        rows.append(row)
        del layer
    return rows


def procedure_table(methods: dict[str, Callable], reference: Callable, repeats: int = 3) -> dict:
    """The published procedure, side by side: median elapsed seconds per method, with spread."""
    totals = compare_procedure(methods, reference, repeats=repeats)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs_s": t}
            for name, t in totals.items()}


def cpu_cost_table(kernel_module) -> dict:
    """CPU microseconds per call, GPU work excluded: our wrapper against its floor, torch.empty
    of the output plus one direct launch of an already compiled empty Triton kernel."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty_kernel(x_ptr, n):
        pass

    layer = make_layer(256, 256, torch.bfloat16)
    shape, dtype = layer.weight.quant_state.shape, torch.bfloat16
    x = torch.empty(16, device="cuda")
    compiled = empty_kernel[(1,)](x, 16)
    stream = torch.cuda.current_stream().cuda_stream
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    pointer = x.data_ptr()

    def floor():
        torch.empty(shape, dtype=dtype, device="cuda")
        run(1, 1, 1, stream, function, metadata, None, None, None, pointer, 16)

    ours = cpu_cost_us(lambda: kernel_module.triton_dequantize_nf4(layer))
    return {"ours_us": ours, "floor_us": cpu_cost_us(floor),
            "empty_us": cpu_cost_us(lambda: torch.empty(shape, dtype=dtype, device="cuda")),
            "triton_launch_us": cpu_cost_us(lambda: empty_kernel[(1,)](x, 16))}


# ---------------------------------------------------------------------------------------------
# Result files and plots
# ---------------------------------------------------------------------------------------------
def results_dir(env: dict, root: Path = ROOT / "results") -> Path:
    path = root / gpu_slug(env["gpu"] if env["capability"] else "cpu")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_results(path: Path, env: dict, **tables) -> Path:
    """One JSON file: the environment (GPU, driver, versions, date, baselines) and the tables."""
    path.write_text(json.dumps({"environment": env, **tables}, indent=2, default=str) + "\n")
    return path


def plot_speedups(rows: Sequence[dict], baselines: Sequence[str], gpu: str, path: Path | None = None):
    """Per-shape speedup of our kernel over each baseline (kernel-only medians), with lines at
    1.0 and 1.15. rows: dicts with 'shape' and '<baseline>_us' and 'ours_us'."""
    import matplotlib
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(baselines)
    for i, base in enumerate(baselines):
        ratios = [r[f"{base}_us"] / r["ours_us"] for r in rows]
        xs = [j + (i - (len(baselines) - 1) / 2) * width for j in range(len(rows))]
        bars = ax.bar(xs, ratios, width, label=f"vs {base}")
        ax.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(1.15, color="red", linestyle="--", linewidth=1, label="1.15x (puzzle target)")
    ax.set_xticks(range(len(rows)), [r["shape"] for r in rows])
    ax.set_ylabel("speedup (baseline time / ours)")
    ax.set_title(f"NF4 dequantize, kernel time (do_bench median) on {gpu}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_bandwidth(rows: Sequence[dict], gpu: str, peak_gbs: float | None, copy_gbs: float | None,
                   path: Path | None = None):
    """Achieved GB/s per shape for each method, against the peak and a measured copy."""
    import matplotlib.pyplot as plt
    methods = [k[:-4] for k in rows[0] if k.endswith("_gbs")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(methods)
    for i, name in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r[f"{name}_gbs"] for r in rows], width, label=name)
    if peak_gbs:
        ax.axhline(peak_gbs, color="black", linestyle=":", label=f"peak {peak_gbs:.0f} GB/s")
    if copy_gbs:
        ax.axhline(copy_gbs, color="gray", linestyle="--", label=f"copy {copy_gbs:.0f} GB/s")
    ax.set_xticks(range(len(rows)), [r["shape"] for r in rows])
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"NF4 dequantize, achieved bandwidth on {gpu}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig

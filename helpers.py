"""Timing, device facts, the published test procedure, result files and plots for the NF4 notebook.

Nothing here is the kernel: the kernel lives in the notebook's cells tagged `kernel`, and
`load_kernel_cells` imports those cells as a module for the tests and the benchmark.

Three clocks, each named wherever its numbers are shown:
- GPU time (`gpu_time`): the summed durations of the kernels, copies and memsets one call launches,
  from CUPTI through torch.profiler, with the L2 cache flushed before each call. Host time cannot
  leak in, unlike CUDA events around a Python call (triton.testing.do_bench), which count the GPU
  waiting for a slow host. `graph_time` (CUDA-graph replay) cross-checks it where capture works.
- Host time (`host_time`): the CPU time to issue one call, the GPU idle before it.
- Wall clock: the published procedure's own `time.time()` around its timed loop.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import math
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

import torch
import triton
import triton.language as tl

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
# How each kind of number is measured: result files and plot titles carry these words.
GPU_TIME_METHOD = ("GPU time: summed durations of every kernel, copy and memset one call launches "
                   "(CUPTI via torch.profiler), L2 flushed before each call")
GRAPH_TIME_METHOD = ("CUDA-graph replay of (L2 flush, call) x N minus N flushes, CUDA events: counts "
                     "the gaps before and between a call's kernels too")
HOST_TIME_METHOD = ("host time: perf_counter around one call issued with the GPU idle "
                    "(synchronized before, untimed)")
PROCEDURE_METHOD = "wall clock (time.time) of the published procedure's timed loop"
BASELINE_NAMES = {
    "ours": "ours",
    "unsloth_fused": "unsloth fast_dequantize (fused Triton, default)",
    "unsloth_classic": "unsloth classic path (bnb ctypes)",
    "bnb": "bnb dequantize_4bit",
}


# ---------------------------------------------------------------------------------------------
# The kernel cells
# ---------------------------------------------------------------------------------------------
def kernel_cell_sources(notebook: Path = NOTEBOOK) -> list[str]:
    """The source of every code cell tagged `kernel`, in notebook order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells
               if c["cell_type"] == "code" and "kernel" in c.get("metadata", {}).get("tags", [])]
    if not sources:
        raise LookupError(f"{Path(notebook).name} has no code cell tagged 'kernel'")
    return sources


def load_kernel_cells(notebook: Path = NOTEBOOK, name: str = "nf4_kernel_cells") -> types.ModuleType:
    """Import the notebook's kernel cells, run in order, as the module `name`.

    Two effects outlive the call, both on purpose: the module is registered in sys.modules (as
    any import is: torch.compile imports a Triton kernel's module by name), and its source stays
    in a temporary file while the module lives (Triton reads kernel source with `inspect`). The
    file is removed when the module is collected or the interpreter exits. A second call with
    the same name returns the module already loaded."""
    if name in sys.modules:
        return sys.modules[name]
    source = "\n\n".join(kernel_cell_sources(notebook))
    directory = tempfile.mkdtemp(prefix="nf4_cells_")
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        shutil.rmtree(directory, ignore_errors=True)
        raise
    weakref.finalize(module, shutil.rmtree, directory, ignore_errors=True)
    return module


# ---------------------------------------------------------------------------------------------
# The device and the software
# ---------------------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    """GPU, driver and library versions, for printing and for every result file."""
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
        except (OSError, IndexError, subprocess.SubprocessError):
            facts["driver"] = "unknown"
    return facts


def peak_bandwidth_gbs() -> float | None:
    """The datasheet-style peak of GPU 0: memory clock x bus width x 2 (DDR), from the driver."""
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(0)
        return round(2 * props["mem_clock_rate"] * 1e3 * props["mem_bus_width"] / 8 / 1e9, 1)
    except Exception:  # a driver that does not report them: the plots leave the line out
        return None


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3', for results/<gpu>/."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def short_dtype(dtype) -> str:
    """torch.bfloat16 or 'bfloat16' -> 'bf16' (tick labels and table rows)."""
    name = str(dtype).replace("torch.", "")
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(name, name)


def bytes_moved(n_elements: int, out_dtype: torch.dtype) -> int:
    """Bytes one dequantization must move: packed codes and absmax codes (one per 64 weights)
    in, the output out."""
    out_size = torch.empty(0, dtype=out_dtype).element_size()
    return n_elements // 2 + n_elements // 64 + n_elements * out_size


# ---------------------------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------------------------
def _quantile(ordered: Sequence[float], q: float) -> float:
    # linear interpolation between the closest ranks (numpy's default)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Timing:
    """A time per call in microseconds: median, 20th and 80th percentiles over `samples` calls;
    `kernels`: the GPU operations one call launches (GPU clocks only)."""
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    kernels: int | None = None

    @classmethod
    def of(cls, samples_us: Sequence[float], kernels: int | None = None) -> "Timing":
        if not samples_us:
            raise ValueError("no samples")
        ordered = sorted(samples_us)
        return cls(_quantile(ordered, 0.5), _quantile(ordered, 0.2), _quantile(ordered, 0.8),
                   len(ordered), kernels)

    def gbs(self, n_bytes: float) -> float:
        return n_bytes / (self.median_us * 1e-6) / 1e9


class DeviceEvent(NamedTuple):
    """One kernel, copy or memset on the GPU, from the profiler (microseconds on its clock)."""
    start_us: float
    end_us: float
    name: str


@triton.jit
def _l2_flush_before_timed_call(buffer_ptr, n_words, BLOCK: tl.constexpr):
    # Zeros over twice the L2: no byte of the timed call's data survives in the cache. Its name
    # appears nowhere else, so its GPU events mark where each timed call begins.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(buffer_ptr + offsets, tl.zeros([BLOCK], dtype=tl.int32), mask=offsets < n_words)


FLUSH_KERNEL = "_l2_flush_before_timed_call"


class L2Flush:
    """Evicts the GPU's L2 cache when called: one launch of `_l2_flush_before_timed_call`."""
    BLOCK = 4096

    def __init__(self):
        l2_bytes = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                           "L2_cache_size", 0) or 64 << 20
        n_words = max(2 * l2_bytes, 32 << 20) // 4
        self.buffer = torch.empty(n_words, dtype=torch.int32, device="cuda")
        self.grid = (triton.cdiv(n_words, self.BLOCK),)

    def __call__(self):
        _l2_flush_before_timed_call[self.grid](self.buffer, self.buffer.numel(), BLOCK=self.BLOCK)


def device_events(profile) -> list[DeviceEvent]:
    """Every GPU operation a finished torch.profiler run recorded, in start order."""
    from torch.autograd import DeviceType
    return sorted(DeviceEvent(e.time_range.start, e.time_range.end, e.name)
                  for e in profile.events() if e.device_type == DeviceType.CUDA)


def calls_between_flushes(events: Iterable[DeviceEvent]) -> list[list[DeviceEvent]]:
    """The GPU operations of each timed call: those between one flush and the next. Operations
    before the first flush or after the last belong to no call. A call that launched nothing on
    the GPU is an error: its time would silently read as zero."""
    calls, current = [], None
    for event in sorted(events):
        if FLUSH_KERNEL in event.name:
            if current is not None:
                calls.append(current)
            current = []
        elif current is not None:
            current.append(event)
    if any(not call for call in calls):
        raise ValueError("a timed call launched no GPU work between two flushes")
    return calls


def _profiled(work: Callable[[], object]) -> list[DeviceEvent]:
    synchronize()
    with warnings.catch_warnings():  # each session is one cycle: its end-of-cycle notice says nothing
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            work()
            torch.cuda.synchronize()
        events = device_events(profile)
    if not events:
        raise RuntimeError("the profiler recorded no GPU activity (is CUPTI available?)")
    return events


def _profiled_calls(fn: Callable[[], object], calls: int, flush: L2Flush) -> list[DeviceEvent]:
    """One profiled run of `calls` calls of fn, each after an L2 flush, and a last flush to close
    the last call; three unprofiled calls first (they compile, validate, tune: not what is timed)."""
    for _ in range(3):
        flush()
        fn()

    def work():
        for _ in range(calls):
            flush()
            fn()
        flush()

    return _profiled(work)


def gpu_samples(fn: Callable[[], object], calls: int, flush: L2Flush) -> tuple[list[float], int]:
    """The GPU time of each of `calls` calls of fn (microseconds), L2 flushed before each, and
    how many GPU operations one call launches (the most common count)."""
    per_call = calls_between_flushes(_profiled_calls(fn, calls, flush))
    if len(per_call) != calls:
        raise RuntimeError(f"{len(per_call)} calls found between flushes, {calls} were made")
    counts = collections.Counter(len(call) for call in per_call)
    return [sum(e.end_us - e.start_us for e in call) for call in per_call], counts.most_common(1)[0][0]


def gpu_time(fn: Callable[[], object], calls: int = 100, flush: L2Flush | None = None) -> Timing:
    """GPU time per call of fn (GPU_TIME_METHOD): median and spread over `calls` calls."""
    samples, kernels = gpu_samples(fn, calls, flush or L2Flush())
    return Timing.of(samples, kernels)


def profiled_mean_us(fn: Callable[[], object], calls: int = 100, flush: L2Flush | None = None) -> float:
    """A second reading of GPU time, for checking `gpu_time`: every non-flush GPU operation of
    another profiled run of `calls` flushed calls, summed, divided by `calls` (no split into calls)."""
    events = _profiled_calls(fn, calls, flush or L2Flush())
    return sum(e.end_us - e.start_us for e in events if FLUSH_KERNEL not in e.name) / calls


def _capture(work: Callable[[], object]) -> "torch.cuda.CUDAGraph":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
        work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph


def _replay_us(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def graph_time(fn: Callable[[], object], flush: L2Flush | None = None) -> Timing | None:
    """GPU time per call by CUDA-graph replay (GRAPH_TIME_METHOD), or None where fn cannot be
    captured. A graph of 20 (flush, call) pairs and one of 20 flushes are replayed in turn, ten
    times; each sample is their difference over 20."""
    flush = flush or L2Flush()
    calls = 20

    def calls_and_flushes():
        for _ in range(calls):
            flush()
            fn()

    def flushes():
        for _ in range(calls):
            flush()

    try:
        with_calls, flushes_only = _capture(calls_and_flushes), _capture(flushes)
    except Exception:  # capture refused (a host sync, a launch on another stream): no cross-check
        torch.cuda.synchronize()
        return None
    samples = []
    for _ in range(11):
        samples.append((_replay_us(with_calls) - _replay_us(flushes_only)) / calls)
    del with_calls, flushes_only
    return Timing.of(samples[1:])  # the first replay uploads the graph


def host_time(fn: Callable[[], object], calls: int = 500) -> Timing:
    """Host time of one call of fn (HOST_TIME_METHOD): the GPU is idle when each call starts, as
    after the procedure's synchronize, so no call waits behind another's GPU work."""
    for _ in range(20):
        fn()
    samples = []
    for _ in range(calls):
        synchronize()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    synchronize()
    return Timing.of(samples)


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------
# The published test procedure (test_dequantize, 18 Feb 2025), re-implemented
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to `dtype` inside the block, the previous one restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def set_seed(seed: int):
    """The procedure's seeding (transformers.set_seed: Python, numpy and torch)."""
    from transformers import set_seed as transformers_set_seed
    transformers_set_seed(seed)


class MLP(torch.nn.Module):
    """gate (hd -> m), up (hd -> m), down (m -> hd) as bitsandbytes NF4 layers, SiLU."""

    def __init__(self, hd: int, m: int, dtype: torch.dtype, device: str):
        super().__init__()
        import bitsandbytes as bnb
        from transformers.activations import ACT2FN
        make = lambda i, o: bnb.nn.Linear4bit(i, o, bias=None, compute_dtype=dtype,
                                              quant_type="nf4").to(device)
        self.gate_proj, self.up_proj, self.down_proj = make(hd, m), make(hd, m), make(m, hd)
        for layer in self.layers():
            layer.weight.quant_state.dtype = dtype
        self.act_fn = ACT2FN["silu"]

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
    """One procedure case: (seeded MLP, X), built with float32 as the default dtype as the
    procedure sets it; the caller's default dtype is restored. scale > 1 shrinks hd, m and
    qlen for CPU runs."""
    bsz, qlen, hd, m, seed, dtype = case
    with default_dtype(torch.float32):
        set_seed(seed)
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


def _inside_the_procedure(dequantize: Callable, mlp: MLP) -> dict:
    """GPU time and host time per call of one method on one case's layers, as the timed loop
    calls it: GPU time profiled over 50 rounds of the loop itself (no L2 flush, as in the
    procedure); host time per call with the GPU idle before it, cycling up, gate, down."""
    iterations = 50
    calls = 3 * iterations
    events = _profiled(lambda: timed_loop(dequantize, mlp, iterations))
    layers = itertools.cycle(mlp.layers())
    host = host_time(lambda: dequantize(next(layers)), calls=calls)
    return {"gpu_us": sum(e.end_us - e.start_us for e in events) / calls,
            "gpu_kernels": len(events) / calls, "host_us": host.median_us,
            "host_p20_us": host.p20_us, "host_p80_us": host.p80_us}


def procedure_table(methods: dict[str, Callable], reference: Callable, repeats: int = 3,
                    iterations: int = 1000, device: str = "cuda", scale: int = 1) -> dict:
    """The published procedure for several methods side by side in one process. Per case the
    MLP is built once (same seed, same weights), every method passes the warm-up checks on it,
    then the methods' timed loops alternate, `repeats` times. On a GPU each case also records,
    per method, GPU and host time per call inside the procedure (`_inside_the_procedure`).

    Returns per method: median, min, max and every run's total seconds, and per case its
    `calls`, median seconds, wall-clock microseconds per call (and gpu_us, host_us on a GPU)."""
    results = {name: {"runs_s": [0.0] * repeats, "cases": []} for name in methods}
    for bsz, qlen, hd, m, seed, dtype in PROCEDURE_CASES:
        with default_dtype(torch.float32):  # the procedure sets it per case
            mlp, X = make_case((bsz, qlen, hd, m, seed, dtype), device, scale)
            for dequantize in methods.values():
                warmup_checks(dequantize, reference, mlp, X, dtype)
            runs = {name: [] for name in methods}
            for r in range(repeats):
                for name, dequantize in methods.items():
                    seconds = timed_loop(dequantize, mlp, iterations)
                    runs[name].append(seconds)
                    results[name]["runs_s"][r] += seconds
            for name, dequantize in methods.items():
                case = {"case": f"{bsz}x{max(1, qlen // scale)}, {hd // scale}->{m // scale}",
                        "weight": f"{m // scale}x{hd // scale}", "dtype": str(dtype).replace("torch.", ""),
                        "calls": 3 * iterations, "median_s": _quantile(sorted(runs[name]), 0.5)}
                case["wall_us"] = case["median_s"] / case["calls"] * 1e6
                if device == "cuda":
                    case.update(_inside_the_procedure(dequantize, mlp))
                results[name]["cases"].append(case)
        del mlp, X
    for result in results.values():
        runs = result["runs_s"]
        result.update(median_s=_quantile(sorted(runs), 0.5), min_s=min(runs), max_s=max(runs))
    return results


def time_split(procedure: dict) -> list[dict]:
    """Where one call's wall-clock time goes inside the procedure, per case and method (µs):
    GPU time, host time to issue the call, and the rest (launch latency, synchronize, .t() and
    the loop). The rest is negative where the GPU runs a call's first kernels while the host is
    still issuing its last (the three-launch paths). Empty for results without the split."""
    rows = []
    for method, result in procedure.items():
        for case in result.get("cases", []):
            if "gpu_us" in case:
                rows.append({"method": method, "case": case["case"], "weight": case["weight"],
                             "dtype": case["dtype"], "wall_us": case["wall_us"], "gpu_us": case["gpu_us"],
                             "host_us": case["host_us"],
                             "rest_us": case["wall_us"] - case["gpu_us"] - case["host_us"]})
    return rows


def saved_per_call(procedure: dict, baseline: str) -> dict | None:
    """Of the wall-clock time saved per call against `baseline` over the whole procedure, how
    much is kernel (GPU) time and how much the launch path (everything else), in µs per call.
    None for results without the split."""
    pairs = list(zip(procedure["ours"].get("cases", []), procedure[baseline].get("cases", [])))
    if not pairs or not all("gpu_us" in a and "gpu_us" in b for a, b in pairs):
        return None
    calls = sum(a["calls"] for a, _ in pairs)
    saved = sum(a["calls"] * (b["wall_us"] - a["wall_us"]) for a, b in pairs) / calls
    kernel = sum(a["calls"] * (b["gpu_us"] - a["gpu_us"]) for a, b in pairs) / calls
    return {"saved_us": saved, "kernel_us": kernel, "launch_path_us": saved - kernel}


# ---------------------------------------------------------------------------------------------
# torch.compile: what compiles on this GPU, and what it matches
# ---------------------------------------------------------------------------------------------
def inductor_refusal(error: BaseException) -> str | None:
    """Why Inductor refused to compile a graph, or None when `error` is not such a refusal.

    Inductor skips a graph it will not compile by raising SkipFrame from inside the compiler (on a
    GPU without native bf16: torch/_inductor/compile_fx.py, _check_triton_bf16_support, "BF16 is
    not supported"). Under fullgraph=True that reaches the caller wrapped in an InductorError,
    whose inner_exception (or __cause__) is the SkipFrame."""
    from torch._dynamo.exc import SkipFrame
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SkipFrame):
            return f"{type(error).__name__}: {error}"
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def compile_report(kernel, dtypes=(torch.float16, torch.bfloat16), hd: int = 2048, m: int = 8192,
                   seed: int = 3407) -> dict:
    """torch.compile(fullgraph=True) of the procedure's MLP with its three weights dequantized inside
    the graph (kernel.triton_dequantize_nf4: the kernel cells' module or the notebook's namespace),
    on the current GPU, per dtype: what compiled and what it matched, or why Inductor refused it.

    A refusal is reported, never raised: Inductor refuses bf16 graphs on a GPU without native bf16
    (a T4), and the rest of the notebook must still run there. Any other error is raised.

    Returns {"gpu", "capability", "bf16_native", "dtypes": {str(dtype): result}}. bf16_native is
    Inductor's own question (the cuda device interface's is_bf16_supported(including_emulation=
    False)). A compiled dtype's result: compiled=True and the checks, each a bool unless named
    otherwise: the three weights bit-identical to eager; the compiled MLP bit-identical to the same
    compiled MLP fed eager's weights; bit-identical to the eager MLP, its max abs difference, and
    within 1e-2 (Inductor fuses silu(a) * b and rounds its intermediates differently from eager);
    bit-identical to eager with emulate_precision_casts; three repeats identical; recompiled. A
    refused dtype's: {"compiled": False, "refused_by": "Inductor", "reason", "warnings"}."""
    import warnings
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.device_interface import get_interface_for_device

    dequantize = kernel.triton_dequantize_nf4
    capability = torch.cuda.get_device_capability()
    report = {"gpu": torch.cuda.get_device_name(), "capability": f"{capability[0]}.{capability[1]}",
              "bf16_native": bool(get_interface_for_device("cuda").is_bf16_supported(including_emulation=False)),
              "dtypes": {}}

    def forward(X, gate, up, down):
        weights = [dequantize(layer) for layer in (gate, up, down)]
        return weights, mlp_with_weights(X, *weights, torch.nn.functional.silu)

    def mlp_only(X, gate, up, down):
        return mlp_with_weights(X, gate, up, down, torch.nn.functional.silu)

    for dtype in dtypes:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        set_seed(seed)
        mlp = MLP(hd, m, dtype, "cuda")
        X = torch.randn(2, 333, hd, dtype=dtype, device="cuda")
        layers = mlp.layers()
        eager_weights, eager_out = forward(X, *layers)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                compiled = torch.compile(forward, fullgraph=True)
                weights, out = compiled(X, *layers)
            except Exception as error:
                reason = inductor_refusal(error)
                if reason is None:
                    raise
                report["dtypes"][str(dtype)] = {
                    "compiled": False, "refused_by": "Inductor", "reason": reason,
                    "warnings": sorted({str(w.message) for w in caught if "_inductor" in w.filename})}
                continue
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        repeats = [compiled(X, *layers) for _ in range(3)]
        recompiled = torch._dynamo.utils.counters["stats"]["unique_graphs"] != graphs
        on_eager_weights = torch.compile(mlp_only, fullgraph=True)(X, *eager_weights)
        torch._dynamo.reset()
        with torch._inductor.config.patch(emulate_precision_casts=True):
            _, emulated = torch.compile(forward, fullgraph=True)(X, *layers)
        report["dtypes"][str(dtype)] = {
            "compiled": True,
            "weights_bit_identical": all(map(torch.equal, weights, eager_weights)),
            "mlp_bit_identical_to_compiled_mlp_on_eager_weights": torch.equal(out, on_eager_weights),
            "mlp_bit_identical_to_eager": torch.equal(out, eager_out),
            "mlp_max_abs_diff_to_eager": (out.float() - eager_out.float()).abs().max().item(),
            "mlp_close_to_eager": torch.allclose(out, eager_out, atol=1e-2, rtol=1e-2),
            "mlp_bit_identical_to_eager_with_emulate_precision_casts": torch.equal(emulated, eager_out),
            "repeats_identical": all(torch.equal(r[1], out) and all(map(torch.equal, r[0], weights))
                                     for r in repeats),
            "recompiled": recompiled,
        }
        del mlp, X, eager_weights, eager_out, weights, out, repeats, on_eager_weights, emulated
    torch._dynamo.reset()
    return report


def compile_claim(report: dict) -> str:
    """The marking cell's torch.compile evidence: exactly what `report` (compile_report) shows."""
    compiled = {name: r for name, r in report["dtypes"].items() if r["compiled"]}
    refused = {name: r for name, r in report["dtypes"].items() if not r["compiled"]}
    good = [name for name, r in compiled.items()
            if r["weights_bit_identical"] and r["mlp_bit_identical_to_compiled_mlp_on_eager_weights"]
            and r["mlp_bit_identical_to_eager_with_emulate_precision_casts"] and r["repeats_identical"]
            and not r["recompiled"]]
    parts = []
    if good:
        parts.append(f"{', '.join(n.replace('torch.', '') for n in good)}: fullgraph, no recompilation; weights "
                     "bit-identical to eager, the MLP too with emulate_precision_casts")
    for name in compiled:
        if name not in good:
            parts.append(f"{name.replace('torch.', '')}: compiled but NOT as claimed: {compiled[name]}")
    for name, r in refused.items():
        parts.append(f"{name.replace('torch.', '')}: not compiled on this GPU ({report['gpu']}, compute capability "
                     f"{report['capability']}): Inductor refused the graph ({r['reason']})"
                     + ("; Inductor reports no native bf16 here" if not report["bf16_native"] else ""))
    return "; ".join(parts) if parts else "nothing was compiled"


# ---------------------------------------------------------------------------------------------
# Baselines and benchmark tables (the benchmark script and the notebook share these)
# ---------------------------------------------------------------------------------------------
def import_unsloth_kernels():
    """unsloth.kernels.utils without running unsloth's package __init__ (which imports its whole
    training stack), or None when unsloth is not installed. For the import, the packages above it
    are stood in for by bare namespaces over their installed files; afterwards those stand-ins
    leave sys.modules (a later `import unsloth` runs the real package, which finds the modules
    imported here) and logging's disable level is restored."""
    if "unsloth.kernels.utils" in sys.modules:
        return sys.modules["unsloth.kernels.utils"]
    stand_ins = {}
    try:
        for name in ("unsloth", "unsloth.kernels", "unsloth_zoo", "unsloth_zoo.temporary_patches"):
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                return None
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            sys.modules[name] = stand_ins[name] = package
        disabled = logging.root.manager.disable
        logging.disable(logging.WARNING)  # its import logs about training features not used here
        try:
            return importlib.import_module("unsloth.kernels.utils")
        finally:
            logging.disable(disabled)
    finally:
        for name, package in stand_ins.items():
            if sys.modules.get(name) is package:
                del sys.modules[name]


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
               seed: int = 0):
    """A bitsandbytes Linear4bit (NF4, double quantized) on device, its initial weights drawn
    from `seed` (the caller's random state is left as it was)."""
    import bitsandbytes as bnb
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = bnb.nn.Linear4bit(in_features, out_features, bias=None, compute_dtype=dtype,
                                  quant_type="nf4").to(device)
    layer.weight.quant_state.dtype = dtype
    return layer


@triton.jit
def _copy_ceiling_kernel(packed_ptr, out_ptr, n_bytes, BYTES: tl.constexpr):
    # Reads the packed bytes and writes two 16-bit values per byte, with no decoding: the bytes
    # a dequantization moves, so nothing that moves them can be faster.
    offsets = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
    packed = tl.load(packed_ptr + offsets, mask=offsets < n_bytes)
    value = packed.to(tl.uint16)
    tl.store(out_ptr + 2 * offsets[:, None] + tl.arange(0, 2)[None, :],
             tl.join(value, value), mask=offsets[:, None] < n_bytes)


def ceiling_launch(n_elements: int, bytes_per_program: int, num_warps: int) -> Callable[[], None]:
    """One launch of the no-math kernel moving an n-element 16-bit dequantization's bytes."""
    packed = torch.randint(0, 255, ((n_elements + 1) // 2,), dtype=torch.uint8, device="cuda")
    out = torch.empty(n_elements, dtype=torch.int16, device="cuda")
    grid = (triton.cdiv(packed.numel(), bytes_per_program),)
    return lambda: _copy_ceiling_kernel[grid](packed, out, packed.numel(), BYTES=bytes_per_program,
                                              num_warps=num_warps)


class Ceiling(NamedTuple):
    timing: Timing           # GPU time of the fastest configuration
    bytes_per_program: int
    num_warps: int


def copy_ceiling(n_elements: int, flush: L2Flush | None = None) -> Ceiling:
    """The copy ceiling: GPU time of the no-math kernel, fastest of a small configuration sweep."""
    flush = flush or L2Flush()
    timings = {config: gpu_time(ceiling_launch(n_elements, *config), calls=30, flush=flush)
               for config in ((1024, 4), (2048, 4), (4096, 8), (8192, 8))}
    best = min(timings, key=lambda config: timings[config].median_us)
    return Ceiling(timings[best], *best)


def device_copy_gbs() -> float:
    """A 1 GiB device-to-device copy's bandwidth by GPU time, counting bytes read plus written."""
    n_bytes = 1 << 30
    src = torch.empty(n_bytes // 2, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    return gpu_time(lambda: dst.copy_(src), calls=20).gbs(2 * n_bytes)


def _put(row: dict, name: str, timing: Timing, n_bytes: int):
    row.update({f"{name}_us": timing.median_us, f"{name}_p20_us": timing.p20_us,
                f"{name}_p80_us": timing.p80_us, f"{name}_gbs": timing.gbs(n_bytes),
                f"{name}_kernels": timing.kernels, f"{name}_samples": timing.samples})


def kernel_table(methods: dict[str, Callable]) -> list[dict]:
    """Per weight shape: every method's GPU time (GPU_TIME_METHOD; median, p20, p80 of the 150
    calls of three rounds of 50 that time the methods in turn), GB/s and GPU operations per call; the
    copy ceiling the same way (`ceiling_*`, with its configuration); and per method a CUDA-graph
    cross-check (`<method>_graph_us`, GRAPH_TIME_METHOD; None where capture fails)."""
    flush = L2Flush()
    rows = []
    for out_features, in_features, dtype in KERNEL_SHAPES:
        layer = make_layer(out_features, in_features, dtype)
        n = out_features * in_features
        n_bytes = bytes_moved(n, dtype)
        ceiling = copy_ceiling(n, flush)
        timed = {name: (lambda fn=fn, layer=layer: fn(layer)) for name, fn in methods.items()}
        timed["ceiling"] = ceiling_launch(n, ceiling.bytes_per_program, ceiling.num_warps)
        samples = {name: [] for name in timed}
        kernels = {}
        for _ in range(3):
            for name, fn in timed.items():
                times, kernels[name] = gpu_samples(fn, 50, flush)
                samples[name] += times
        row = {"shape": f"{out_features}x{in_features}", "dtype": str(dtype).replace("torch.", ""),
               "bytes": n_bytes, "ceiling_config": [ceiling.bytes_per_program, ceiling.num_warps]}
        for name, fn in timed.items():
            _put(row, name, Timing.of(samples[name], kernels[name]), n_bytes)
            graph = graph_time(fn, flush=flush)
            row[f"{name}_graph_us"] = graph.median_us if graph else None
        rows.append(row)
        del layer, timed
    return rows


@triton.jit
def _trivial_kernel(out_ptr, n, BLOCK: tl.constexpr):
    # the least a launch can do and still leave a result a replay can be checked against
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.zeros([BLOCK], dtype=tl.float32), mask=offsets < n)


def cpu_cost_table(methods: dict[str, Callable], direct_launch: Callable | None) -> dict:
    """Host time per call (HOST_TIME_METHOD) of every method on the procedure's first weight
    (8192x2048 fp16), beside the floor: torch.empty of the output plus one direct launch of a
    trivial compiled Triton kernel, made by the kernel cells' `direct_launch` (Triton's own
    launch where that declines or is None). Also torch.empty alone and a standard Triton launch
    (`kernel[grid](...)`)."""
    shape, dtype = (8192, 2048), torch.float16
    layer = make_layer(*shape, dtype)
    sample = torch.empty(16, dtype=dtype, device="cuda")
    standard = lambda: _trivial_kernel[(1,)](sample, 16, BLOCK=16)
    compiled = standard()
    torch.cuda.synchronize()
    replay = direct_launch(compiled, standard, (sample, 16), sample) if direct_launch else None
    launch = replay if replay is not None else (lambda out: _trivial_kernel[(1,)](out, 16, BLOCK=16))
    size = torch.Size((shape[0], shape[1]))
    timed = {name: (lambda fn=fn, layer=layer: fn(layer)) for name, fn in methods.items()}
    timed["floor"] = lambda: launch(torch.empty(size, dtype=dtype, device="cuda"))
    timed["empty"] = lambda: torch.empty(size, dtype=dtype, device="cuda")
    timed["triton_launch"] = standard
    table = {"layer": f"{shape[0]}x{shape[1]} {str(dtype).replace('torch.', '')}",
             "floor_launch": "direct" if replay is not None else "triton"}
    for name, fn in timed.items():
        timing = host_time(fn)
        table.update({f"{name}_us": timing.median_us, f"{name}_p20_us": timing.p20_us,
                      f"{name}_p80_us": timing.p80_us})
    return table


# ---------------------------------------------------------------------------------------------
# Result files and plots
# ---------------------------------------------------------------------------------------------
def results_dir(env: dict) -> Path:
    """results/<gpu>/ beside this file (results/cpu/ without a GPU), created if missing."""
    path = ROOT / "results" / gpu_slug(env["gpu"] if env["capability"] else "cpu")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown_path(path: Path) -> str:
    """A path as printed and stored: relative to the repository (results/<gpu>/x.json), never
    naming the machine's directories."""
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def write_results(path: Path, env: dict, **tables) -> str:
    """One JSON file: the environment (GPU, driver, versions, date), how each clock measures
    (`measurement`) and the tables. Returns the path as `shown_path` prints it."""
    measurement = {"kernel": GPU_TIME_METHOD, "graph": GRAPH_TIME_METHOD, "host": HOST_TIME_METHOD,
                   "procedure": PROCEDURE_METHOD}
    path = Path(path)
    path.write_text(json.dumps({"environment": env, "measurement": measurement, **tables},
                               indent=2, default=str) + "\n")
    return shown_path(path)


def format_kernel_table(rows: Sequence[dict], methods: Sequence[str]) -> str:
    """kernel_table's rows as text: GPU time with spread and GPU operations per call; then GB/s,
    baseline / ours, ours as a share of the copy ceiling, and the CUDA-graph cross-check."""
    names = [*methods, "ceiling"]
    label = lambda r: f"{r['shape']} {short_dtype(r['dtype'])}"
    lines = [f"Kernel only. {GPU_TIME_METHOD}; median of {rows[0]['ours_samples']} calls.",
             "µs per call: median [p20, p80] x GPU operations per call",
             f"{'':>15} | " + " | ".join(f"{n:>26}" for n in names)]
    for r in rows:
        lines.append(f"{label(r):>15} | " + " | ".join(
            f"{r[f'{n}_us']:8.2f} [{r[f'{n}_p20_us']:7.2f},{r[f'{n}_p80_us']:7.2f}] x{r[f'{n}_kernels']}"
            for n in names))
    lines += ["", f"GB/s, baseline / ours, ours / ceiling; CUDA-graph cross-check in µs ({GRAPH_TIME_METHOD})"]
    for r in rows:
        graph = ", ".join(f"{n} {r[f'{n}_graph_us']:.2f}" if r[f"{n}_graph_us"] is not None
                          else f"{n} (no capture)" for n in names)
        lines.append(f"{label(r):>15} | " + ", ".join(f"{n} {r[f'{n}_gbs']:.0f}" for n in names)
                     + " | " + ", ".join(f"{n} {r[f'{n}_us'] / r['ours_us']:.2f}x" for n in methods[1:])
                     + f" | ours/ceiling {r['ceiling_us'] / r['ours_us']:.1%} | graph: {graph}")
    return "\n".join(lines)


def format_cpu_cost(cost: dict, methods: Sequence[str]) -> str:
    """cpu_cost_table as text: every method beside the floor."""
    floor = ("torch.empty + direct launch" if cost["floor_launch"] == "direct"
             else "torch.empty + Triton launch (no direct launch here)")
    names = [(m, m) for m in methods] + [("floor", floor), ("empty", "torch.empty"),
                                         ("triton_launch", "a standard Triton launch")]
    return (f"Host time per call, µs, median [p20, p80], {cost['layer']} ({HOST_TIME_METHOD}):\n"
            + "\n".join(f"{label:>40}: {cost[f'{key}_us']:7.2f} [{cost[f'{key}_p20_us']:.2f}, "
                        f"{cost[f'{key}_p80_us']:.2f}]" for key, label in names))


def format_procedure(procedure: dict) -> str:
    """procedure_table as text: seconds per method and baseline / ours."""
    ours = procedure["ours"]["median_s"]
    lines = []
    for name, result in procedure.items():
        spread = f" (min {result['min_s']:.4f}, max {result['max_s']:.4f})" if len(result["runs_s"]) > 1 else ""
        ratio = "" if name == "ours" else f"   ours is {result['median_s'] / ours:.2f}x faster"
        lines.append(f"{name:>16}: {result['median_s']:.4f} s{spread}{ratio}")
    return "\n".join(lines)


def format_time_split(procedure: dict) -> str:
    """time_split and saved_per_call as text (empty where the procedure ran without the split)."""
    rows = time_split(procedure)
    if not rows:
        return ""
    lines = ["Where one call's time goes inside the procedure, µs per call:",
             f"{'case':>22} {'method':>16} {'wall':>7} {'GPU':>7} {'host':>7} {'rest':>7}"]
    for r in rows:
        lines.append(f"{r['weight'] + ' ' + short_dtype(r['dtype']):>22} {r['method']:>16} {r['wall_us']:7.1f} "
                     f"{r['gpu_us']:7.1f} {r['host_us']:7.1f} {r['rest_us']:7.1f}")
    for baseline in procedure:
        split = saved_per_call(procedure, baseline) if baseline != "ours" else None
        if split:
            lines.append(f"saved per call against {baseline}: {split['saved_us']:.1f} µs = "
                         f"{split['kernel_us']:.1f} kernel + {split['launch_path_us']:.1f} launch path")
    return "\n".join(lines)


def _pyplot():
    # matplotlib picks its backend: inline in a notebook, Agg where there is no display
    import matplotlib.pyplot as plt
    return plt


def _shape_labels(rows: Sequence[dict]) -> list[str]:
    return [f"{r['shape']}\n{short_dtype(r['dtype'])}" for r in rows]


def _finish(fig, ax, path: Path | None):
    # the legend right of the axes: it never covers a bar or a value label
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def plot_kernel_speedups(rows: Sequence[dict], baselines: Sequence[str], gpu: str,
                         path: Path | None = None):
    """Kernel-only speedup of ours over each baseline per shape (baseline GPU time / ours), with
    a line at 1.0. No 1.15x line: the puzzle's target applies to the procedure, not to kernels."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(baselines)
    top = 1.0
    for i, base in enumerate(baselines):
        ratios = [r[f"{base}_us"] / r["ours_us"] for r in rows]
        top = max(top, *ratios)
        xs = [j + (i - (len(baselines) - 1) / 2) * width for j in range(len(rows))]
        bars = ax.bar(xs, ratios, width, label=f"vs {BASELINE_NAMES.get(base, base)}")
        ax.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(range(len(rows)), _shape_labels(rows))
    ax.set_ylabel("baseline GPU time / ours")
    ax.set_title(f"NF4 dequantize, kernel only, on {gpu}\nGPU time (CUPTI kernel durations, L2 "
                 f"flushed), median of {rows[0].get('ours_samples', 'the')} calls", fontsize=10)
    return _finish(fig, ax, path)


def plot_bandwidth(rows: Sequence[dict], methods: Sequence[str], gpu: str, peak_gbs: float | None,
                   copy_gbs: float | None, path: Path | None = None):
    """Achieved GB/s per shape for each method; the no-math copy ceiling drawn as a reference
    mark over each shape (not as a method), with the datasheet peak and a measured copy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for i, name in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(rows))]
        bars = ax.bar(xs, [r[f"{name}_gbs"] for r in rows], width, label=BASELINE_NAMES.get(name, name))
        ax.bar_label(bars, fmt="%.0f", fontsize=7, rotation=90, padding=2)
    ceilings = [(j, r["ceiling_gbs"]) for j, r in enumerate(rows) if "ceiling_gbs" in r]
    if ceilings:
        ax.hlines([gbs for _, gbs in ceilings], [j - 0.45 for j, _ in ceilings], [j + 0.45 for j, _ in ceilings],
                  colors="black", linewidth=2, label="no-math copy ceiling (reference)")
    if peak_gbs:
        ax.axhline(peak_gbs, color="black", linestyle=":", label=f"datasheet peak {peak_gbs:.0f} GB/s")
    if copy_gbs:
        ax.axhline(copy_gbs, color="gray", linestyle="--", label=f"device copy {copy_gbs:.0f} GB/s")
    highest = max([peak_gbs or 0, copy_gbs or 0] + [r[f"{m}_gbs"] for r in rows for m in methods])
    ax.set_ylim(0, highest * 1.2)
    ax.set_xticks(range(len(rows)), _shape_labels(rows))
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(f"NF4 dequantize, achieved bandwidth on {gpu}\nbytes moved / GPU time (CUPTI kernel "
                 "durations, L2 flushed), median", fontsize=10)
    return _finish(fig, ax, path)


def plot_procedure(procedure: dict, gpu: str, path: Path | None = None):
    """The published procedure: baseline time / ours per baseline, with the puzzle's 1.15x target
    (which applies here) and 1.0."""
    plt = _pyplot()
    baselines = [name for name in procedure if name != "ours"]
    ratios = [procedure[b]["median_s"] / procedure["ours"]["median_s"] for b in baselines]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(range(len(baselines)), ratios, 0.6, color="tab:blue")
    ax.bar_label(bars, fmt="%.2fx", fontsize=9)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(1.15, color="red", linestyle="--", linewidth=1, label="1.15x (puzzle target)")
    ax.set_ylim(0, max(ratios + [1.15]) * 1.15)
    ax.set_xticks(range(len(baselines)), [BASELINE_NAMES.get(b, b).replace(" (", "\n(") for b in baselines],
                  fontsize=8)
    ax.set_ylabel("baseline time / ours")
    runs = len(procedure["ours"].get("runs_s", [])) or 1
    ax.set_title(f"Published test_dequantize procedure on {gpu}\n{PROCEDURE_METHOD}, median of {runs}",
                 fontsize=10)
    return _finish(fig, ax, path)


def plot_time_split(procedure: dict, gpu: str, path: Path | None = None):
    """One call of each method inside the procedure, per case: GPU time, host time to issue it,
    and the rest (launch latency, synchronize, loop), stacked; a black mark at the measured wall
    clock per call (the stack passes it where GPU and host overlap)."""
    plt = _pyplot()
    rows = time_split(procedure)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases) + 2.5, 3.6), sharey=True, squeeze=False)
    parts = (("gpu_us", "GPU time (kernels)", "tab:green"), ("host_us", "host: issue the call", "tab:orange"),
             ("rest_us", "rest: launch latency, synchronize, loop", "tab:gray"))
    for ax, case in zip(axes[0], cases):
        here = {r["method"]: r for r in rows if r["case"] == case}
        ys = range(len(methods))
        left = [0.0] * len(methods)
        for key, label, color in parts:
            widths = [max(0.0, here[m][key]) for m in methods]
            ax.barh(ys, widths, left=left, color=color, label=label)
            left = [a + b for a, b in zip(left, widths)]
        walls = [here[m]["wall_us"] for m in methods]
        ax.scatter(walls, ys, marker="|", s=300, color="black", zorder=3, label="wall clock per call")
        for y, wall in zip(ys, walls):
            ax.annotate(f"{wall:.1f} µs", (max(wall, left[y]), y), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=8)
        ax.set_xlim(0, max(left + walls) * 1.3)
        first = next(iter(here.values()))
        ax.set_title(f"{first['weight']} {short_dtype(first['dtype'])} ({case})", fontsize=9)
        ax.set_xlabel("µs per call")
        ax.set_yticks(list(ys), [BASELINE_NAMES.get(m, m).replace(" (", "\n(") for m in methods], fontsize=8)
    axes[0][0].invert_yaxis()  # the y axis is shared: first method on top
    fig.suptitle(f"Where one call's time goes inside the published procedure, on {gpu}\nwall: {PROCEDURE_METHOD} "
                 "/ calls; GPU: CUPTI kernel durations in the same loop; host: perf_counter per call",
                 fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig

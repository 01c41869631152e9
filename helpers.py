"""How the NF4 notebook's numbers are made, in its order; report.py (fetched beside it) shows them. Nothing
here imports the kernel: functions take the callables they run (tests/kernel_cells.py loads the kernel cells).

  0. Installing what is missing    PACKAGES, UNSLOTH, install_missing (the first cell's; triton only with a GPU)
  1. Environment and device facts  wrap, environment, versions_line, short_dtype, bytes_moved
  2. The test procedure            METHODS, OURS, BASELINES, SAME_KERNELS, PROCEDURE_CASES, KERNEL_SHAPES,
                                   make_layer, exactness, dequantizers, check_baselines, usable, MLP,
                                   call_bytes, procedure_bytes, procedure_result, round_ratios (the procedure
                                   itself is the notebook's cell tagged `procedure`)
  3. GPU and host timing           gpu_time, host_time, l2_flush, kernel_table, device_copy_gbs, cpu_cost_table,
                                   timed_calls, add_call_split (a call's wall = issue + wait, GPU time beside)
  4. A T4: forecast, emulation     T4_COPY_GBS, t4_forecast, forecast_seconds, is_t4, emulate_t4, PaddedToT4
  5. torch.compile                 compile_report, compile_claim
  6. Result files                  results_dir, write_results, shown_path

Every number names its clock (MEASUREMENT): GPU time, the GPU's own kernel durations (host time cannot leak
in as into CUDA events around a Python call); host time; the procedure's wall clock, and its split per call.
The GPU is the current one; `l2_flush()` keeps a flush buffer per device; anything else global a function
changes is restored.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import warnings
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

try:
    import torch
except ModuleNotFoundError as error:
    if error.name != "torch":  # torch is there, but something it imports is not: its own error says what
        raise
    raise RuntimeError("torch is not installed: install PyTorch for this machine "
                       "(https://pytorch.org/get-started/locally/), then run this cell again.") from None
# triton only with a GPU, for the GPU's kernels here: without one the notebook turns on Triton's interpreter after
# this import, and triton.language imported before that keeps tl.interleave and the like out of the interpreter
triton = None
if torch.cuda.is_available():
    try:
        import triton
        import triton.language as tl
    except ModuleNotFoundError as error:  # a torch without triton, until install_missing installs it
        if error.name != "triton":
            raise

ROOT = Path(__file__).resolve().parent
MAX_LINE = 120  # Colab wraps longer lines: no printed line or table row is longer
# A word that opens a Markdown block at a line's start: '>', a list item, '#', a setext underline, a fence
_BLOCK_MARKER = re.compile(r">.*|[-+*]|#{1,6}|\d{1,9}[.)]|=+|-+|[`~]{3}.*")


def wrap(text: str, indent: str = "") -> str:
    """`text` in lines of at most MAX_LINE characters, none but the first starting with a block marker."""
    words = []
    for word in text.split():  # a marker word joins the one before by a no-break space, which textwrap keeps
        words.append(words.pop() + "\u00a0" + word if words and _BLOCK_MARKER.fullmatch(word) else word)
    return textwrap.fill(" ".join(words), MAX_LINE, subsequent_indent=indent, break_on_hyphens=False,
                         break_long_words=False).replace("\u00a0", " ")


# 0. Installing what the notebook needs (its first cell fetches this file, then calls install_missing) -
# Pinned as in requirements.txt; triton only where torch came without it (a CPU torch). unsloth only with a
# GPU (its baselines need one), without its dependencies, which would replace torch: only its kernels are used.
PACKAGES = {"bitsandbytes": "bitsandbytes==0.50.2", "transformers": "transformers", "peft": "peft==0.21.2",
            "accelerate": "accelerate", "matplotlib": "matplotlib", "triton": "triton==3.6.0"}
UNSLOTH = {"unsloth": "unsloth==2026.10.9", "unsloth_zoo": "unsloth_zoo==2026.10.9"}
KEPT = ("torch", "triton")  # the runtime's own, never replaced: pip gets them as constraints
MIN_BITSANDBYTES = (0, 46)  # older has no CPU dequantize_4bit, the reference without a GPU


def runtime_name() -> str:
    """Where the notebook runs: Colab, Kaggle, local Jupyter or local Python."""
    if "google.colab" in sys.modules:
        return "Colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.isdir("/kaggle"):
        return "Kaggle"
    return "local Jupyter" if "ipykernel" in sys.modules else "local Python"


def _bitsandbytes_too_old() -> bool:
    """Whether pip's bitsandbytes is older than MIN_BITSANDBYTES (one copied in without metadata is kept)."""
    try:
        found = importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return False
    release = tuple(int(part) for part in re.findall(r"\d+", found)[:2])
    return release < MIN_BITSANDBYTES


def _pip_install(specs: Iterable[str], keep: dict[str, str], *options: str) -> subprocess.CompletedProcess:
    """pip install `specs` with `keep` ({package: version}) as constraints: pip fails rather than replace them."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("".join(f"{package}=={version}\n" for package, version in keep.items()))
    command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
               "-c", constraints.name, *options, *specs]
    try:
        return subprocess.run(command, capture_output=True, text=True)
    finally:
        os.unlink(constraints.name)
        importlib.invalidate_caches()  # what pip installed imports from now on


def install_missing(gpu: bool, fetched: Sequence[str] = ()) -> str:
    """Installs the PACKAGES this runtime cannot import (UNSLOTH too with a GPU) and a newer bitsandbytes over a
    pip one older than MIN_BITSANDBYTES, never replacing torch or triton (KEPT); first refuses a GPU older than
    the kernel supports. Returns what it did in one line (`fetched`: the files the notebook's first cell
    fetched; wrapped where longer than MAX_LINE), and without a GPU a line on what that means."""
    if gpu and torch.cuda.get_device_capability() < (7, 0):
        raise RuntimeError(f"{torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()}) "
                           "is older than this kernel supports (7.0): pick a T4 or a newer GPU for this runtime.")
    keep = {package: _version(package) for package in KEPT if importlib.util.find_spec(package) is not None}
    missing, missing_unsloth = {}, {}
    for package, spec in PACKAGES.items():
        if importlib.util.find_spec(package) is None or package == "bitsandbytes" and _bitsandbytes_too_old():
            missing[package] = spec
    for package, spec in UNSLOTH.items():
        if gpu and importlib.util.find_spec(package) is None:
            missing_unsloth[package] = spec
    installed, note = [], ""
    if missing:
        result = _pip_install(missing.values(), keep)
        if result.returncode != 0:
            hint = " (on Kaggle, turn on Internet in the notebook's settings)" if runtime_name() == "Kaggle" else ""
            raise RuntimeError(f"pip could not install {', '.join(missing.values())}{hint}:\n{result.stderr[-2000:]}")
        installed = [f"{package} {_version(package)}" for package in missing]
    if missing_unsloth:
        result = _pip_install(missing_unsloth.values(), keep, "--no-deps")
        if result.returncode == 0:
            installed.append(f"unsloth {_version('unsloth')} (kernels only)")
        else:
            note = "; unsloth could not be installed: its baselines are skipped"
    # What it did, then what it kept (or, having installed nothing, the versions found): one line
    where = f"{runtime_name()} ({torch.cuda.get_device_name() if gpu else 'no GPU'})"
    if installed:
        did = f"{where}: installed {', '.join(installed)};"
        found = "kept " + " and ".join(f"{package} {version}" for package, version in keep.items())
    else:
        shown = ["torch", "triton", "bitsandbytes"]
        if gpu and importlib.util.find_spec("unsloth") is not None:
            shown.append("unsloth")
        did = f"{where}: nothing installed" if missing_unsloth else f"{where}: nothing to install"
        found = "(" + ", ".join(f"{package} {_version(package)}" for package in shown) + ")"
    found += note
    if fetched:
        found += f"; fetched {', '.join(fetched)}"
    lines = [f"{did} {found}"]
    if len(lines[0]) > MAX_LINE:  # what it kept or found on a line of its own
        lines = [did, textwrap.fill(found, MAX_LINE, initial_indent="    ", subsequent_indent="    ")]
    if not gpu:
        lines.append("No GPU: kernels run in Triton's interpreter; timings and unsloth's baseline need a GPU.")
    return "\n".join(lines)


# 1. Environment and device facts (the current CUDA device) ------------------------------------
UNSLOTH_NF4_SHA256 = {"f4dd101d1dd86e46a1e096aea1ad19fb27d8e39233cfb99a61240ca495d44a52": "2026.10.9"}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # copied in without metadata, or absent
        spec = importlib.util.find_spec(package)
        if spec is None:
            return "not installed"
        if package == "unsloth" and (sha := _unsloth_nf4_sha256()):  # environment() keeps it beside
            return UNSLOTH_NF4_SHA256.get(sha, "unknown version")
        try:  # a package whose import raises is reported, never raised: it must not stop Run all
            return getattr(importlib.import_module(package), "__version__", None) or "present, no metadata"
        except Exception as error:
            return f"present, no metadata; importing it raised {_first_line(error)}"


def _unsloth_nf4_sha256() -> str | None:
    """The sha256 of unsloth's kernels/nf4.py or None: result files keep it; without package metadata (the GPU
    machine) it names the version (UNSLOTH_NF4_SHA256, from PyPI's wheels)."""
    spec = importlib.util.find_spec("unsloth")
    folders = list(spec.submodule_search_locations or []) if spec else []
    nf4 = Path(folders[0], "kernels", "nf4.py") if folders else None
    return hashlib.sha256(nf4.read_bytes()).hexdigest() if nf4 and nf4.is_file() else None


def environment() -> dict:
    """The current GPU's facts and the library versions: printed, in every plot's subtitle and result file."""
    facts = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "python": platform.python_version(), "torch": torch.__version__, "triton": _version("triton"),
             "bitsandbytes": _version("bitsandbytes"), "unsloth": _version("unsloth"),
             "unsloth_nf4_sha256": _unsloth_nf4_sha256(),
             "gpu": "none (CPU, TRITON_INTERPRET=1)", "capability": None, "driver": None, "sm_count": None,
             "peak_bandwidth_gbs": None}
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        facts.update(device=device, gpu=props.name, capability=f"{props.major}.{props.minor}",
                     sm_count=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                     l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        with contextlib.suppress(Exception):  # memory clock x bus width x 2 (DDR); if unreported, plots omit it
            driver = triton.runtime.driver.active.utils.get_device_properties(device)
            facts["peak_bandwidth_gbs"] = round(2 * driver["mem_clock_rate"] * driver["mem_bus_width"] / 8e6, 1)
        try:  # one driver serves every GPU of the machine
            facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            facts["driver"] = "unknown"
    return facts


def versions_line(env: dict, date: bool = True) -> str:
    """'GPU · torch x · triton y · bitsandbytes z · unsloth w · date' (plots leave out the date); no hash in it."""
    versions = [f"{n} {str(env[n]).split(' (by ')[0]}" for n in ("torch", "triton", "bitsandbytes", "unsloth")
                if n in env]
    return " · ".join([env.get("gpu", "unknown GPU"), *versions] + ([env["date"]] if date and "date" in env else []))


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3', for results/<gpu>/."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def dtype_name(dtype) -> str:
    """torch.bfloat16, 'torch.bfloat16' or 'bfloat16' -> 'bfloat16' (result files)."""
    return str(dtype).replace("torch.", "")


def short_dtype(dtype) -> str:
    """torch.bfloat16, 'torch.bfloat16' or 'bfloat16' -> 'bf16' (tables and tick labels)."""
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype_name(dtype), dtype_name(dtype))


def bytes_moved(n_elements: int, out_dtype: torch.dtype) -> int:
    """Bytes one dequantization moves: packed codes and absmax codes (1 per 64) in, the output out."""
    return n_elements // 2 + n_elements // 64 + n_elements * torch.empty(0, dtype=out_dtype).element_size()


# 2. The test procedure (test_dequantize, 18 Feb 2025) and the methods it compares -------------
class Method(NamedTuple):
    column: str   # in tables and plot legends
    name: str     # in the README headline (markdown)
    calls: str    # what it calls, for result files
    prose: str    # in the headline's sentences


METHODS = {  # every method the tables compare, keyed as in the result files
    "ours": Method("ours", "ours", "triton_dequantize_nf4 (the notebook's kernel cells)", "ours"),
    "ours_via_triton": Method("ours through Triton's own launch",
                              "ours through Triton's own launch (`kernel[grid](...)`, every call bound by Triton)",
                              "dequantize_nf4_via_triton (the kernel cells' kernel through Triton's own launch)",
                              "ours through Triton's own launch"),
    "unsloth_fused": Method("unsloth fused", "unsloth `fast_dequantize` (fused Triton, default)",
                            "unsloth.kernels.utils.fast_dequantize (default fused Triton path)", "the fused path"),
    "unsloth_classic": Method("unsloth classic", "unsloth classic path (bnb ctypes)",
                              "unsloth.kernels.utils._fast_dequantize_ctypes (bitsandbytes ctypes path)",
                              "the classic path"),
    "bnb": Method("bnb", "bnb `dequantize_4bit`", "bitsandbytes.functional.dequantize_4bit", "bnb"),
}
OURS = ("ours", "ours_via_triton")
BASELINES = ("unsloth_fused", "unsloth_classic", "bnb")
SAME_KERNELS = {"unsloth_classic": "bnb"}  # the classic path launches bitsandbytes' own 3 kernels
# The published procedure's cases: (bsz, qlen, hd, m, seed, dtype), in order.
PROCEDURE_CASES = ((2, 3333, 2048, 8192, 3407, torch.float16),
                   (5, 777, 1024, 4096, 3409, torch.bfloat16),
                   (3, 2048, 4096, 14336, 3408, torch.bfloat16))
# Weight shapes (out, in, dtype) timed kernel-only: the cases' gate and up weights, a 70B-class one.
KERNEL_SHAPES = tuple((m, hd, dtype) for _, _, hd, m, _, dtype in PROCEDURE_CASES) + ((28672, 8192, torch.bfloat16),)
PROCEDURE_METHOD = "wall clock (time.time) of the published procedure's timed loop"


def column(name: str) -> str:
    """A method's name in tables and plot legends."""
    return METHODS[name].column if name in METHODS else name


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default dtype set to `dtype` inside the block, the previous one restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def kept_random_state():
    """Python's, numpy's and torch's (CPU and every GPU's) random states restored after the block."""
    import numpy
    python, numpys = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            yield
    finally:
        random.setstate(python)
        numpy.random.set_state(numpys)


def _nf4_linear(in_features: int, out_features: int, dtype: torch.dtype, device: str):
    import bitsandbytes as bnb
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=None, compute_dtype=dtype, quant_type="nf4").to(device)
    layer.weight.quant_state.dtype = dtype
    return layer


def make_layer(out_features: int, in_features: int, dtype: torch.dtype, device: str = "cuda", seed: int = 0):
    """A bitsandbytes Linear4bit (NF4, double quantized) on device, weights drawn from `seed` (caller's RNG kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _nf4_linear(in_features, out_features, dtype, device)


# Without a GPU (the interpreter is slow): small weights, one whose rows are not whole 64-weight blocks
CPU_SHAPES = ((256, 128, torch.float16), (64, 256, torch.bfloat16), (33, 96, torch.bfloat16))
EXACTNESS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def bitsandbytes_bits(layer) -> torch.Tensor:
    """bitsandbytes' dequantization as its CUDA kernel computes it; on the CPU its generic code over the
    flat weight (its CPU dequantize_4bit walks rows, wrong where a row is not whole blocks)."""
    import bitsandbytes.functional as bnbf
    W, qs = layer.weight, layer.weight.quant_state
    if W.is_cuda:
        return bnbf.dequantize_4bit(W, qs)
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute as flat
    absmax = bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    return getattr(flat, "__wrapped__", flat)(W.view(torch.uint8).reshape(-1), absmax, qs.code, qs.blocksize,
                                              qs.shape, qs.dtype)


def exactness(dequantize: Callable, shapes: Sequence[tuple], device: str) -> tuple[bool, list[list[str]], list]:
    """torch.equal of `dequantize(layer)` and `bitsandbytes_bits` per (out, in, dtype) of `shapes`, in each
    EXACTNESS_DTYPES: (all equal, per shape a row of "equal"/"DIFFERENT", per shape a layer in its dtype)."""
    exact, rows, layers = True, [], []
    for out_features, in_features, shape_dtype in shapes:
        row = [f"{out_features}x{in_features}"]
        for dtype in EXACTNESS_DTYPES:
            layer = make_layer(out_features, in_features, dtype, device=device)
            same = torch.equal(dequantize(layer), bitsandbytes_bits(layer))
            exact &= same
            row.append("equal" if same else "DIFFERENT")
            if dtype == shape_dtype:
                layers.append(layer)
        rows.append(row)
    return exact, rows, layers


def import_unsloth_kernels():
    """unsloth.kernels.utils without running unsloth's __init__ (its training stack; None if not installed,
    import errors raised): bare namespace packages during the import only; logging's disable level restored."""
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
    finally:  # a later `import unsloth` runs the real package, which finds the modules imported here
        for name, package in stand_ins.items():
            if sys.modules.get(name) is package:
                del sys.modules[name]


def dequantizers(ours: Callable) -> tuple[dict[str, Callable], dict[str, str]]:
    """(methods, skipped): each NF4 dequantization this machine can run (`ours`, unsloth fused and classic,
    bnb dequantize_4bit), and {name: reason} for each baseline it cannot (skipped, never raised)."""
    import bitsandbytes.functional as bnbf
    methods, skipped = {"ours": ours}, {}
    utils, reason = None, "needs a CUDA GPU"
    if torch.cuda.is_available():
        try:
            utils, reason = import_unsloth_kernels(), "unsloth is not installed"
        except Exception as error:
            reason = f"importing unsloth's kernels raised {_first_line(error)}"
    for key, attribute in (("unsloth_fused", "fast_dequantize"), ("unsloth_classic", "_fast_dequantize_ctypes")):
        function = getattr(utils, attribute, None)
        if function is None:
            skipped[key] = reason if utils is None else f"this unsloth has no kernels.utils.{attribute}"
        else:
            methods[key] = lambda layer, function=function: function(layer.weight, layer.weight.quant_state)
    methods["bnb"] = lambda layer: bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
    return methods, skipped


def check_baselines(methods: dict[str, Callable], reference: Callable, layers: Iterable) -> dict[str, str]:
    """{name: why} for each method but ours and `reference` that raised or differed from `reference`
    (dtype, shape, torch.equal) on a layer: reported, never raised (`usable` leaves them out)."""
    problems = {}
    for layer in layers:
        expected = reference(layer)
        where = f"{tuple(layer.weight.quant_state.shape)} {short_dtype(layer.weight.quant_state.dtype)}"
        for name, method in methods.items():
            if name in OURS or method is reference or name in problems:
                continue
            try:
                got = method(layer)
            except Exception as error:
                problems[name] = f"raised at {where}: {_first_line(error)}"
                continue
            if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
                problems[name] = f"differs from the reference at {where}"
    return problems


def usable(methods: dict[str, Callable], skipped: dict[str, str]) -> dict[str, Callable]:
    """`methods` without those in `skipped`, each left out printed with its reason."""
    for name, reason in skipped.items():
        print(wrap(f"skipped {column(name)}: {reason}", "    "))
    return {name: method for name, method in methods.items() if name not in skipped}


class MLP(torch.nn.Module):
    """gate (hd -> m), up (hd -> m), down (m -> hd) as bitsandbytes NF4 layers, SiLU."""

    def __init__(self, hd: int, m: int, dtype: torch.dtype, device: str):
        super().__init__()
        from transformers.activations import ACT2FN
        self.gate_proj, self.up_proj = _nf4_linear(hd, m, dtype, device), _nf4_linear(hd, m, dtype, device)
        self.down_proj, self.act_fn = _nf4_linear(m, hd, dtype, device), ACT2FN["silu"]

    def layers(self):
        return self.gate_proj, self.up_proj, self.down_proj

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def mlp_with_weights(X, gate, up, down, act_fn):
    """The MLP computed from dequantized weights, as the procedure does: X @ W.t()."""
    return (act_fn(X @ gate.t()) * (X @ up.t())) @ down.t()


def call_bytes(n_elements: int, out_dtype: torch.dtype) -> int:
    """DRAM bytes one call of the procedure moves: bytes_moved, and an fp32 absmax2 per 16384 weights read."""
    return bytes_moved(n_elements, out_dtype) + 4 * -(-n_elements // (64 * 256))


def procedure_bytes(scale: int = 1, iterations: int = 1000) -> int:
    """DRAM bytes one run of the procedure moves (601 GB): call_bytes of each of its calls, 3 calls
    (n = hd * m weights each) an iteration."""
    sizes = [((hd // scale) * (m // scale), dtype) for _, _, hd, m, _, dtype in PROCEDURE_CASES]
    return sum(3 * iterations * call_bytes(n, dtype) for n, dtype in sizes)


def procedure_result(seconds: dict[str, list[list[float]]], iterations: int, scale: int = 1) -> dict:
    """The procedure's table from seconds[method][case][round] (cases in PROCEDURE_CASES order, every
    method in every round): per method the median, min and max of the rounds' totals over the cases
    (`runs_s`, in round order), and per case its median seconds and their wall clock per call (procedure_us)."""
    results = {}
    for name, per_case in seconds.items():
        runs = [sum(rounds) for rounds in zip(*per_case)]
        cases = []
        for (bsz, qlen, hd, m, _, dtype), rounds in zip(PROCEDURE_CASES, per_case):
            hd, m, qlen = hd // scale, m // scale, qlen // scale
            median = _quantile(rounds, 0.5)
            cases.append({"case": f"{bsz}x{qlen}, {hd}->{m}", "weight": f"{m}x{hd}", "dtype": dtype_name(dtype),
                          "calls": 3 * iterations, "median_s": median,
                          "procedure_us": median / (3 * iterations) * 1e6})
        results[name] = {"median_s": _quantile(runs, 0.5), "min_s": min(runs), "max_s": max(runs), "runs_s": runs,
                         "cases": cases}
    return results


def round_ratios(procedure: dict, baseline: str, ours: str = "ours") -> dict:
    """The puzzle's speedup, baseline time / ours, per round: the median over the rounds, min, max."""
    ratios = [b / o for b, o in zip(procedure[baseline]["runs_s"], procedure[ours]["runs_s"])]
    return {"median": _quantile(ratios, 0.5), "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


# 3. GPU and host timing -----------------------------------------------------------------------
GPU_TIME_METHOD = ("GPU time: summed durations of every kernel, copy and memset one call launches "
                   "(CUPTI via torch.profiler), L2 flushed before each call")
HOST_TIME_METHOD = "host time: perf_counter around one call issued with the GPU idle (synchronized before, untimed)"
CALL_SPLIT_METHOD = ("a call of the procedure's loop timed by perf_counter in two parts, issue (the call to its "
                     "return, .t() included) and wait (inside torch.cuda.synchronize()): wall = issue + wait")
LAUNCH_REFERENCE_METHOD = (  # result files key it "floor", their older name for it: it is no lower bound
    "torch.empty of the output plus one launch of a trivial compiled Triton kernel (16 stores) through Triton's "
    "CompiledKernel launcher, stream given (compiled[grid](out, stream=s)): no argument binding, specialization or "
    "cache lookup, but Triton's hook check (~2 µs on an H200 over calling the launcher's run directly)")
FLUSH_KERNEL = "_l2_flush_before_timed_call"
_FLUSHES: dict[int, L2Flush] = {}  # device index -> its flush, made on first use


def _quantile(values: Sequence[float], q: float) -> float:
    # linear interpolation between the closest ranks (numpy's default)
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    return ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (position - low)


class Timing(NamedTuple):
    """A time per call in µs: median, p20 and p80 over `samples` calls; `kernels`: GPU operations per call."""
    median_us: float
    p20_us: float
    p80_us: float
    samples: int
    kernels: int | None = None

    @classmethod
    def of(cls, samples_us: Sequence[float], kernels: int | None = None) -> Timing:
        if not samples_us:
            raise ValueError("no samples")
        return cls(*(_quantile(samples_us, q) for q in (0.5, 0.2, 0.8)), len(samples_us), kernels)

    def gbs(self, n_bytes: float) -> float:
        return n_bytes / (self.median_us * 1e-6) / 1e9

    def fields(self, name: str) -> dict:
        """As the tables store it: <name>_us (the median), <name>_p20_us, <name>_p80_us."""
        return {f"{name}_us": self.median_us, f"{name}_p20_us": self.p20_us, f"{name}_p80_us": self.p80_us}


class DeviceEvent(NamedTuple):
    """One kernel, copy or memset on the GPU, from the profiler (microseconds on its clock)."""
    start_us: float
    end_us: float
    name: str


if triton is not None:  # a GPU kernel, defined only with a GPU
    @triton.jit
    def _l2_flush_before_timed_call(buffer_ptr, n_words, BLOCK: tl.constexpr):
        # Zeros over twice the L2: no byte of the timed call's data survives in the cache. Its name
        # appears nowhere else, so its GPU events mark where each timed call begins.
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(buffer_ptr + offsets, tl.zeros([BLOCK], dtype=tl.int32), mask=offsets < n_words)


class L2Flush:
    """Evicts GPU `device`'s L2 cache when called. `l2_flush()` makes one per device and reuses it."""
    BLOCK = 4096

    def __init__(self, device: int):
        l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
        n_words = max(2 * l2_bytes, 32 << 20) // 4
        self.device, self.grid = device, (triton.cdiv(n_words, self.BLOCK),)
        self.buffer = torch.empty(n_words, dtype=torch.int32, device=torch.device("cuda", device))

    def __call__(self):
        with torch.cuda.device(self.device):
            _l2_flush_before_timed_call[self.grid](self.buffer, self.buffer.numel(), BLOCK=self.BLOCK)


def l2_flush() -> L2Flush:
    """The current device's L2Flush: one buffer per device, made on first use and reused."""
    device = torch.cuda.current_device()
    if device not in _FLUSHES:
        _FLUSHES[device] = L2Flush(device)
    return _FLUSHES[device]


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def calls_between_flushes(events: Iterable[DeviceEvent]) -> list[list[DeviceEvent]]:
    """The GPU operations of each timed call: those between one flush and the next (none before the first or
    after the last belongs to a call). A call that launched nothing is an error: its time would read as zero."""
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
    """Every GPU operation of one profiled run of `work`, in start order."""
    from torch.autograd import DeviceType
    synchronize()
    with warnings.catch_warnings():  # each session is one cycle: its end-of-cycle notice says nothing
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            work()
            torch.cuda.synchronize()
        events = sorted(DeviceEvent(e.time_range.start, e.time_range.end, e.name)
                        for e in profile.events() if e.device_type == DeviceType.CUDA)
    if not events:
        raise RuntimeError("the profiler recorded no GPU activity (is CUPTI available?)")
    return events


def profiled_calls(fn: Callable[[], object], calls: int, flush: L2Flush) -> list[DeviceEvent]:
    """One profiled run of `calls` calls of fn, each after an L2 flush, and a last flush to close the
    last call; three unprofiled calls first (they compile, validate, tune: not what is timed)."""
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
    """The GPU time (µs) of each of `calls` calls of fn, L2 flushed before each, and GPU operations per call (mode)."""
    per_call = calls_between_flushes(profiled_calls(fn, calls, flush))
    if len(per_call) != calls:
        raise RuntimeError(f"{len(per_call)} calls found between flushes, {calls} were made")
    counts = collections.Counter(len(call) for call in per_call)
    return [sum(e.end_us - e.start_us for e in call) for call in per_call], counts.most_common(1)[0][0]


def gpu_time(fn: Callable[[], object], calls: int = 100, flush: L2Flush | None = None) -> Timing:
    """GPU time per call of fn (GPU_TIME_METHOD) on the current device, over `calls` calls."""
    return Timing.of(*gpu_samples(fn, calls, flush or l2_flush()))


def host_time(fn: Callable[[], object], calls: int = 500) -> Timing:
    """Host time of one call of fn (HOST_TIME_METHOD): the GPU is idle when each call starts, as after
    the procedure's synchronize, so no call waits behind another's GPU work."""
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


def timed_calls(dequantize: Callable, layers: Sequence, iterations: int,
                synchronize: Callable[[], None] = torch.cuda.synchronize,
                clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """The procedure's timed loop (`iterations` times each of `layers`: dequantize, .t(), synchronize), every
    call timed in two parts by `clock` (CALL_SPLIT_METHOD): (issue, wait), each in seconds summed over the calls."""
    issue_s = 0.0
    wait_s = 0.0
    for _ in range(iterations):
        for layer in layers:
            called = clock()
            dequantize(layer).t()
            returned = clock()
            synchronize()
            synchronized = clock()
            issue_s += returned - called
            wait_s += synchronized - returned
    return issue_s, wait_s


def add_call_split(procedure: dict, methods: dict[str, Callable], build_case: Callable, rounds: int = 5,
                   iterations: int = 50, synchronize: Callable[[], None] = torch.cuda.synchronize,
                   clock: Callable[[], float] = time.perf_counter, profile: Callable | None = None) -> None:
    """Where a call's time goes, added to each case of `procedure` per method (issue_us, wait_us, wall_us, gpu_us,
    gpu_kernels, split_calls, split_rounds), on layers rebuilt by `build_case(*case)`. The procedure's loop
    (timed_calls: up, gate, down) twice untimed, then `rounds` rounds of `iterations`, the methods in turn, the order
    rotated each round; kept: the round of median wall, its issue and wait per call (means over its calls), so wall_us
    is issue_us + wait_us exactly. GPU time per call (durations of the GPU operations, `profile`: the profiler, no L2
    flush as in the procedure) comes from one more round, profiled: beside the sum, not in it."""
    profile = profile or _profiled
    names = list(procedure)
    calls = 3 * iterations
    for c, case in enumerate(PROCEDURE_CASES):
        mlp, _ = build_case(*case)
        layers = (mlp.up_proj, mlp.gate_proj, mlp.down_proj)  # the procedure's order
        for name in names:
            timed_calls(methods[name], layers, 2, synchronize, clock)  # a new weight's first calls: untimed
        rounds_s = {name: [] for name in names}  # per method, (issue_s, wait_s) per round
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds_s[name].append(timed_calls(methods[name], layers, iterations, synchronize, clock))
        for name in names:
            issue_s, wait_s = sorted(rounds_s[name], key=sum)[(rounds - 1) // 2]  # the round of median wall
            loop = functools.partial(timed_calls, methods[name], layers, iterations, synchronize, clock)
            events = profile(loop)
            issue_us = issue_s / calls * 1e6
            wait_us = wait_s / calls * 1e6
            procedure[name]["cases"][c].update(
                issue_us=issue_us, wait_us=wait_us, wall_us=issue_us + wait_us,
                gpu_us=sum(e.end_us - e.start_us for e in events) / calls, gpu_kernels=len(events) / calls,
                split_calls=calls, split_rounds=rounds)
        del mlp, layers


if triton is not None:  # a GPU kernel, defined only with a GPU
    @triton.jit
    def _copy_ceiling_kernel(packed_ptr, out_ptr, n_bytes, BYTES: tl.constexpr):
        # Reads the packed bytes and writes two 16-bit values per byte, with no decoding: the bytes
        # a dequantization moves, so nothing that moves them can be faster.
        offsets = tl.program_id(0).to(tl.int64) * BYTES + tl.arange(0, BYTES)
        value = tl.load(packed_ptr + offsets, mask=offsets < n_bytes).to(tl.uint16)
        tl.store(out_ptr + 2 * offsets[:, None] + tl.arange(0, 2)[None, :], tl.join(value, value),
                 mask=offsets[:, None] < n_bytes)


def ceiling_launch(n_elements: int, bytes_per_program: int, num_warps: int) -> Callable[[], None]:
    """One launch of the no-math kernel moving an n-element 16-bit dequantization's bytes."""
    packed = torch.randint(0, 255, ((n_elements + 1) // 2,), dtype=torch.uint8, device="cuda")
    out = torch.empty(n_elements, dtype=torch.int16, device="cuda")
    grid = (triton.cdiv(packed.numel(), bytes_per_program),)
    return lambda: _copy_ceiling_kernel[grid](packed, out, packed.numel(), BYTES=bytes_per_program,
                                              num_warps=num_warps)


def device_copy_gbs() -> float:
    """A 1 GiB device-to-device copy's bandwidth by GPU time, counting bytes read plus written."""
    src = torch.empty(1 << 29, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    return gpu_time(lambda: dst.copy_(src), calls=20).gbs(2 << 30)


def kernel_table(methods: dict[str, Callable]) -> list[dict]:
    """Per weight shape (KERNEL_SHAPES): each method's GPU time (median, p20, p80 of 150 calls: three
    rounds of 50 that time the methods in turn), GB/s and GPU operations per call; the same for the copy
    ceiling (`ceiling_*`) in the fastest configuration of a small sweep (`ceiling_config`)."""
    flush, rows = l2_flush(), []
    for out_features, in_features, dtype in KERNEL_SHAPES:
        layer = make_layer(out_features, in_features, dtype)
        n = out_features * in_features
        ceiling = min(((1024, 4), (2048, 4), (4096, 8), (8192, 8)),  # (bytes per program, warps)
                      key=lambda c: gpu_time(ceiling_launch(n, *c), calls=30, flush=flush).median_us)
        timed = {name: (lambda fn=fn: fn(layer)) for name, fn in methods.items()}
        timed["ceiling"] = ceiling_launch(n, *ceiling)
        samples, kernels = collections.defaultdict(list), {}
        for _ in range(3):
            for name, fn in timed.items():
                times, kernels[name] = gpu_samples(fn, 50, flush)
                samples[name] += times
        row = {"shape": f"{out_features}x{in_features}", "dtype": dtype_name(dtype),
               "bytes": bytes_moved(n, dtype), "ceiling_config": list(ceiling)}
        for name in timed:
            timing = Timing.of(samples[name], kernels[name])
            row.update(timing.fields(name), **{f"{name}_gbs": timing.gbs(row["bytes"]),
                                               f"{name}_kernels": timing.kernels, f"{name}_samples": timing.samples})
        rows.append(row)
        del layer, timed
    return rows


if triton is not None:  # a GPU kernel, defined only with a GPU
    @triton.jit
    def _store_16_zeros(out_ptr):
        # The least a launch can do and still leave a result. No constexpr and no integer argument:
        # every Triton version passes its launcher the same arguments.
        tl.store(out_ptr + tl.arange(0, 16), tl.zeros([16], dtype=tl.float32))


def cpu_cost_table(methods: dict[str, Callable]) -> dict:
    """Host time per call (HOST_TIME_METHOD) of every method on the procedure's first weight, beside a reference
    launch (LAUNCH_REFERENCE_METHOD, keyed "floor"), torch.empty alone, and Triton's own launch of its kernel."""
    out_features, in_features, dtype = KERNEL_SHAPES[0]
    size = torch.Size((out_features, in_features))
    layer = make_layer(out_features, in_features, dtype)
    sample = torch.empty(size, dtype=dtype, device="cuda")
    standard = lambda: _store_16_zeros[(1,)](sample)
    direct = standard()[(1, 1, 1)]  # Triton's own launch compiles the kernel and returns it: its launcher
    stream = torch.cuda.current_stream().cuda_stream
    timed = {name: (lambda fn=fn: fn(layer)) for name, fn in methods.items()}
    timed.update(floor=lambda: direct(torch.empty(size, dtype=dtype, device="cuda"), stream=stream),
                 empty=lambda: torch.empty(size, dtype=dtype, device="cuda"), triton_launch=standard)
    table = {"layer": f"{out_features}x{in_features} {dtype_name(dtype)}", "floor": LAUNCH_REFERENCE_METHOD}
    for name, fn in timed.items():
        table.update(host_time(fn).fields(name))
    return table


# 4. A T4: forecast from this run's split, and emulation on this GPU ------------------------------
# A T4's device-to-device copy, bytes read + written (as device_copy_gbs counts them): CUDA's bandwidthTest
# measured 239.6 GB/s device to device on a T4. Its datasheet's 320 GB/s is a peak no copy reaches.
T4_COPY_GBS = 240
T4_HOST_FACTORS = (1, 2, 3)  # Colab's host is slower than this one by a factor nobody here measured
T4_FORECAST_METHOD = (
    "forecast, not a measurement: per call, issue x host factor + GPU time x (this GPU's copy GB/s / a T4's) + the "
    "wait beyond GPU time (max(wait - GPU, 0)) as measured, times the procedure's calls, summed over its cases")
EMULATION_METHOD = "each call padded to a T4's GPU time for its bytes (torch.cuda._sleep on the current stream)"


def forecast_seconds(cases: Sequence[dict], gpu_scale: float, host_factor: float) -> float:
    """The procedure's seconds by T4_FORECAST_METHOD's model, from one method's cases (add_call_split's
    issue_us, wait_us, gpu_us and the procedure's calls): GPU time x gpu_scale, issue x host_factor."""
    total_us = 0.0
    for case in cases:
        wait_beyond_gpu_us = max(case["wait_us"] - case["gpu_us"], 0.0)
        per_call_us = case["issue_us"] * host_factor + case["gpu_us"] * gpu_scale + wait_beyond_gpu_us
        total_us += per_call_us * case["calls"]
    return total_us / 1e6


def t4_forecast(procedure: dict, copy_gbs: float, host_factors: Sequence[float] = T4_HOST_FACTORS,
                t4_gbs: float = T4_COPY_GBS) -> dict | None:
    """The procedure on a T4, forecast (T4_FORECAST_METHOD) from this run's split: per method its seconds at each
    host factor, per baseline its seconds / ours at each, and the model's error on this GPU (gpu_scale 1, host
    factor 1, against this run's measured median). None unless every method's cases carry the split."""
    for result in procedure.values():
        if not result.get("cases") or not all("issue_us" in case for case in result["cases"]):
            return None
    gpu_scale = copy_gbs / t4_gbs
    inputs = {"copy_gbs": copy_gbs, "t4_copy_gbs": t4_gbs, "gpu_scale": gpu_scale, "host_factors": list(host_factors),
              "cases": {name: [{key: case[key] for key in ("case", "calls", "issue_us", "wait_us", "gpu_us")}
                               for case in result["cases"]] for name, result in procedure.items()}}
    seconds = {name: [forecast_seconds(result["cases"], gpu_scale, factor) for factor in host_factors]
               for name, result in procedure.items()}
    ratios = {name: [base / ours for base, ours in zip(seconds[name], seconds["ours"])]
              for name in seconds if name in BASELINES}
    model_error = {}
    for name, result in procedure.items():
        model_s = forecast_seconds(result["cases"], 1.0, 1.0)
        model_error[name] = {"model_s": model_s, "measured_s": result["median_s"],
                             "error": model_s / result["median_s"] - 1}
    return {"what": T4_FORECAST_METHOD, "inputs": inputs, "seconds": seconds, "ratios": ratios,
            "ratio_range": {name: [min(r), max(r)] for name, r in ratios.items()}, "model_error": model_error}


def is_t4(env: dict) -> bool:
    """Whether `env` (environment()) is a T4's: compute capability 7.5 or 'T4' in the GPU's name."""
    return env.get("capability") == "7.5" or "T4" in str(env.get("gpu"))


def t4_pad_us(n_elements: int, out_dtype: torch.dtype, copy_gbs: float, t4_gbs: float = T4_COPY_GBS) -> float:
    """GPU time a call on n weights lacks here to take a T4's for its bytes (call_bytes): the bytes at a T4's
    copy bandwidth minus at this GPU's, µs (GB/s x 1e3 = bytes per µs); 0 where this GPU is no faster."""
    n_bytes = call_bytes(n_elements, out_dtype)
    return max(n_bytes / (t4_gbs * 1e3) - n_bytes / (copy_gbs * 1e3), 0.0)


def sleep_cycles_per_us(cycles: int = 10_000_000, samples: int = 5) -> float:
    """GPU cycles per µs of torch.cuda._sleep on the current GPU: `cycles` timed by CUDA events, median of
    `samples` (after one untimed launch, which loads the kernel)."""
    torch.cuda._sleep(cycles)
    rates = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rates.append(cycles / (start.elapsed_time(end) * 1e3))
    return _quantile(rates, 0.5)


class PaddedToT4:
    """`dequantize` with each call followed by a GPU sleep (on the current stream, after the call's kernels) that
    brings the call's GPU time to a T4's for its bytes (t4_pad_us): the same padding for every method, since it
    depends on the bytes only. Host time stays this machine's; the sleep's own launch adds a little to every call."""

    def __init__(self, dequantize: Callable, copy_gbs: float, cycles_per_us: float,
                 sleep: Callable[[int], None] = torch.cuda._sleep):
        self.dequantize = dequantize
        self.copy_gbs = copy_gbs
        self.cycles_per_us = cycles_per_us
        self.sleep = sleep

    def __call__(self, layer):
        out = self.dequantize(layer)
        state = layer.weight.quant_state
        pad_us = t4_pad_us(state.shape.numel(), state.dtype, self.copy_gbs)
        self.sleep(round(pad_us * self.cycles_per_us))
        return out


def emulate_t4(test_dequantize: Callable, methods: dict[str, Callable], reference: Callable, copy_gbs: float,
               rounds: int = 1, cycles_per_us: float | None = None,
               sleep: Callable[[int], None] = torch.cuda._sleep) -> dict:
    """The procedure (`test_dequantize(methods, reference, rounds)`, the notebook's) on this GPU with every call
    padded to a T4's GPU time (PaddedToT4); bnb left out where the classic path runs its kernels (SAME_KERNELS).
    Returns how (`what`, cycles_per_us, the padding per case), each method's median seconds and each baseline's
    median ratio to ours over the rounds."""
    cycles_per_us = cycles_per_us or sleep_cycles_per_us()
    launched_by_another = {same for twin, same in SAME_KERNELS.items() if twin in methods}
    padded = {name: PaddedToT4(method, copy_gbs, cycles_per_us, sleep)
              for name, method in methods.items() if name not in launched_by_another}
    result = test_dequantize(padded, reference, rounds=rounds)
    pad_us = [t4_pad_us(hd * m, dtype, copy_gbs) for _, _, hd, m, _, dtype in PROCEDURE_CASES]
    return {"what": EMULATION_METHOD, "cycles_per_us": cycles_per_us, "pad_us": pad_us, "rounds": rounds,
            "seconds": {name: r["median_s"] for name, r in result.items()},
            "ratios": {name: round_ratios(result, name)["median"] for name in result if name in BASELINES}}


# 5. torch.compile: what compiles on this GPU, and what it matches ----------------------------
def inductor_refusal(error: BaseException) -> str | None:
    """Why Inductor refused to compile a graph (a SkipFrame: on a GPU without native bf16, compile_fx.py
    _check_triton_bf16_support), found along the error chain, where fullgraph=True wraps it in an
    InductorError; None when `error` is no such refusal."""
    from torch._dynamo.exc import SkipFrame
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, SkipFrame):
            return f"{type(error).__name__}: {error}"
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def _fresh(function: Callable) -> Callable:
    """A copy of `function` with its own code object, on which torch.compile keeps what it compiled: the
    copy compiles afresh without torch.compiler.reset(), which would drop every function the user compiled."""
    return types.FunctionType(function.__code__.replace(), function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)


def compile_report(dequantize: Callable, dtypes=(torch.float16, torch.bfloat16), hd: int = PROCEDURE_CASES[0][2],
                   m: int = PROCEDURE_CASES[0][3], seed: int = PROCEDURE_CASES[0][4]) -> dict:
    """torch.compile(fullgraph=True) of the procedure's MLP, its weights dequantized by `dequantize` in the
    graph, per dtype on the current GPU: what compiled and matched, or why Inductor refused (reported: it
    refuses bf16 on a T4; other errors raise). Each compile is of a `_fresh` copy (no other compiled
    function is dropped); random states are restored. {"gpu", "capability", "bf16_native", "dtypes":
    {str(dtype): checks, bools but the max abs difference, or {"compiled": False, "reason", ...}}}."""
    import torch._inductor.config
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._dynamo.utils import counters
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
        with kept_random_state():
            torch.manual_seed(seed)
            mlp = MLP(hd, m, dtype, "cuda")
            X = torch.randn(2, 333, hd, dtype=dtype, device="cuda")
        layers = mlp.layers()
        eager_weights, eager_out = forward(X, *layers)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                compiled = torch.compile(_fresh(forward), fullgraph=True)
                weights, out = compiled(X, *layers)
            except Exception as error:
                if inductor_refusal(error) is None:
                    raise
                report["dtypes"][str(dtype)] = {
                    "compiled": False, "refused_by": "Inductor", "reason": inductor_refusal(error),
                    "warnings": sorted({str(w.message) for w in caught if "_inductor" in w.filename})}
                continue
        graphs = counters["stats"]["unique_graphs"]
        repeats = [compiled(X, *layers) for _ in range(3)]
        recompiled = counters["stats"]["unique_graphs"] != graphs
        on_eager_weights = torch.compile(_fresh(mlp_only), fullgraph=True)(X, *eager_weights)
        with torch._inductor.config.patch(emulate_precision_casts=True):
            _, emulated = torch.compile(_fresh(forward), fullgraph=True)(X, *layers)
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
            "recompiled": recompiled}
        del mlp, X, eager_weights, eager_out, weights, out, repeats, on_eager_weights, emulated
    return report


def compile_claim(report: dict) -> str:
    """The marking cell's torch.compile evidence: exactly what `report` (compile_report) shows."""
    compiled = {dtype_name(n): r for n, r in report["dtypes"].items() if r["compiled"]}
    refused = {dtype_name(n): r for n, r in report["dtypes"].items() if not r["compiled"]}
    good = [name for name, r in compiled.items()
            if r["weights_bit_identical"] and r["mlp_bit_identical_to_compiled_mlp_on_eager_weights"]
            and r["repeats_identical"] and not r["recompiled"]]
    emulated = [name for name in good if compiled[name]["mlp_bit_identical_to_eager_with_emulate_precision_casts"]]
    also = f"; the MLP too with emulate_precision_casts ({', '.join(emulated)})" if emulated else ""
    parts = [f"{', '.join(good)}: fullgraph, no recompilation; weights bit-identical to eager{also}"] if good else []
    parts += [f"{name}: compiled but NOT as claimed: {r}" for name, r in compiled.items() if name not in good]
    parts += [f"{name}: not compiled on this GPU ({report['gpu']}, compute capability {report['capability']}): "
              f"Inductor refused the graph ({r['reason']})"
              + ("; Inductor reports no native bf16 here" if not report["bf16_native"] else "")
              for name, r in refused.items()]
    return "; ".join(parts) if parts else "nothing was compiled"


# 6. Result files --------------------------------------------------------------------------------
MEASUREMENT = {"kernel": GPU_TIME_METHOD, "host": HOST_TIME_METHOD, "floor": LAUNCH_REFERENCE_METHOD,
               "procedure": PROCEDURE_METHOD, "split": CALL_SPLIT_METHOD}  # how each clock measures: every result file


def results_dir(env: dict) -> Path:
    """results/<gpu>/ beside this file (results/cpu/ without a GPU), created if missing."""
    path = ROOT / "results" / gpu_slug(env["gpu"] if env["capability"] else "cpu")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown_path(path: Path) -> str:
    """A path as printed and stored: relative to the repository (results/<gpu>/x.json), never the machine's."""
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def write_results(path: Path, env: dict, **tables) -> str:
    """One JSON file: the environment (GPU, driver, versions, date), how each clock measures (MEASUREMENT,
    or a `measurement` table given) and the tables. Returns the path as `shown_path` prints it."""
    Path(path).write_text(json.dumps({"environment": env, "measurement": MEASUREMENT, **tables},
                                     indent=2, default=str) + "\n")
    return shown_path(path)

"""How the NF4 notebook sets up what it measures, in its order; timing.py (fetched beside it) times it and
report.py shows it. Nothing here imports the kernel: functions take the callables they run
(benchmarks/cells.py loads the kernel cells for the commands and tests).

  0. Installing what is missing    PACKAGES, UNSLOTH, install_missing (the first cell's; triton only with a GPU)
  1. Environment and device facts  wrap, environment, paste_unit_sha256, is_t4, short_dtype, bytes_moved
  2. The test procedure            METHODS, OURS, BASELINES, SAME_KERNELS, PROCEDURE_CASES, KERNEL_SHAPES,
                                   make_layer, exactness, dequantizers, check_baselines, usable, MLP,
                                   call_bytes, procedure_bytes, procedure_result, round_ratios (the procedure
                                   itself is the notebook's cell tagged `procedure`)
  3. torch.compile and the PTX     quiet_torch_compile, compile_report, compile_claim, compile_points, kernel_ptx
  4. Result files                  results_dir, write_results, shown_path, pack_run

Anything global a function changes is restored.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import importlib.util
import linecache
import json
import logging
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Sequence

try:
    import torch
except ModuleNotFoundError as error:
    if error.name != "torch":  # torch is there, but something it imports is not: its own error says what
        raise
    raise RuntimeError("torch is not installed: install PyTorch for this machine "
                       "(https://pytorch.org/get-started/locally/), then run this cell again.") from None
ROOT = Path(__file__).resolve().parent
NOTEBOOK_NAME = "Unsloth_Puzzles_NF4.ipynb"
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
    keep = {package: package_version(package) for package in KEPT if importlib.util.find_spec(package) is not None}
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
        installed = [f"{package} {package_version(package)}" for package in missing]
    if missing_unsloth:
        result = _pip_install(missing_unsloth.values(), keep, "--no-deps")
        if result.returncode == 0:
            installed.append(f"unsloth {package_version('unsloth')} (kernels only)")
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
        found = "(" + ", ".join(f"{package} {package_version(package)}" for package in shown) + ")"
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


def package_version(package: str) -> str:
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


def environment(cells: dict | None = None, gpu: bool | None = None) -> dict:
    """The current GPU's facts (with `gpu` False, none: an analysis that runs without one) and the library versions:
    printed, in every plot's subtitle and result file; with `cells` (the kernel cells' namespace: the notebook's
    globals(), or vars() of the module benchmarks/cells.py loads) the hash of the cells that ran
    (paste_unit_sha256)."""
    facts = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "python": platform.python_version(), "torch": torch.__version__, "triton": package_version("triton"),
             "bitsandbytes": package_version("bitsandbytes"), "unsloth": package_version("unsloth"),
             "unsloth_nf4_sha256": _unsloth_nf4_sha256(),
             "gpu": "none (CPU, TRITON_INTERPRET=1)", "capability": None, "driver": None, "sm_count": None,
             "peak_bandwidth_gbs": None}
    if gpu is None:
        gpu = torch.cuda.is_available()
    if gpu:
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        facts.update(device=device, gpu=props.name, capability=f"{props.major}.{props.minor}",
                     sm_count=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                     l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1))
        with contextlib.suppress(Exception):  # memory clock x bus width x 2 (DDR); if unreported, plots omit it
            import triton  # here only, with a GPU: without one the notebook turns on Triton's interpreter later
            driver = triton.runtime.driver.active.utils.get_device_properties(device)
            facts["peak_bandwidth_gbs"] = round(2 * driver["mem_clock_rate"] * driver["mem_bus_width"] / 8e6, 1)
        try:  # one driver serves every GPU of the machine
            facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=20).stdout.split()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            facts["driver"] = "unknown"
    if cells is not None:
        facts["paste_unit_sha256"] = paste_unit_sha256(cells)
    return facts


def paste_unit_sha256(cells: dict) -> str:
    """The sha256 of the kernel cells that ran, as they ran: the source files that define their kernel, wrapper
    and launch path (in a notebook each cell is a file of its own in linecache; loaded as a module, one file),
    joined by a blank line as the notebook's cells are hashed (benchmarks/cells.py)."""
    entry_points = (cells["_dequantize_4bit_kernel"].fn, cells["dequantize_nf4_via_triton"], cells["dequantize_nf4"])
    files = list(dict.fromkeys(function.__code__.co_filename for function in entry_points))
    sources = ["".join(linecache.getlines(name)).rstrip("\n") for name in files]
    return hashlib.sha256("\n\n".join(sources).encode()).hexdigest()


def is_t4(env: dict) -> bool:
    """Whether `env` (environment()) is a T4's: compute capability 7.5 or 'T4' in the GPU's name."""
    return env.get("capability") == "7.5" or "T4" in str(env.get("gpu"))


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


def dequantizers(ours: Callable, ours_via_triton: Callable | None = None) -> tuple[dict[str, Callable], dict[str, str]]:
    """(methods, skipped): each NF4 dequantization this machine can run (`ours`, a layer's; `ours_via_triton`,
    W's and its QuantState's: the kernel cells' own launch through Triton; unsloth fused and classic, bnb
    dequantize_4bit), and {name: reason} for each baseline it cannot (skipped, never raised)."""
    import bitsandbytes.functional as bnbf
    methods, skipped = {"ours": ours}, {}
    if ours_via_triton is not None:  # called as the baselines are
        methods["ours_via_triton"] = lambda layer: ours_via_triton(layer.weight, layer.weight.quant_state)
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
            median = quantile(rounds, 0.5)
            cases.append({"case": f"{bsz}x{qlen}, {hd}->{m}", "weight": f"{m}x{hd}", "dtype": dtype_name(dtype),
                          "calls": 3 * iterations, "median_s": median,
                          "procedure_us": median / (3 * iterations) * 1e6})
        results[name] = {"median_s": quantile(runs, 0.5), "min_s": min(runs), "max_s": max(runs), "runs_s": runs,
                         "cases": cases}
    return results


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of values by linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    return ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (position - low)


def round_ratios(procedure: dict, baseline: str, ours: str = "ours") -> dict:
    """The puzzle's speedup, baseline time / ours, per round: the median over the rounds, min, max."""
    ratios = [b / o for b, o in zip(procedure[baseline]["runs_s"], procedure[ours]["runs_s"])]
    return {"median": quantile(ratios, 0.5), "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


# 3. torch.compile: what compiles on this GPU, and what it matches; the PTX it runs ---------------
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


@contextlib.contextmanager
def quiet_torch_compile():
    """Nothing torch.compile warns or logs in the block reaches the output (on a T4 Inductor warns of its bf16
    refusal and, its caches off, logs the temporary folder it kept: a machine path): warnings go into the list it
    yields, the records of torch's loggers (torch's and each with handlers of its own) to a NullHandler. Restored."""
    loggers = [logging.getLogger("torch")]
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and logger.handlers:
            loggers.append(logger)
    kept = [(logger.handlers, logger.propagate) for logger in loggers]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for logger in loggers:
                logger.handlers, logger.propagate = [logging.NullHandler()], False
            yield caught
        finally:
            for logger, (handlers, propagate) in zip(loggers, kept):
                logger.handlers, logger.propagate = handlers, propagate


def compile_report(dequantize: Callable, dtypes=(torch.float16, torch.bfloat16), hd: int = PROCEDURE_CASES[0][2],
                   m: int = PROCEDURE_CASES[0][3], seed: int = PROCEDURE_CASES[0][4]) -> dict:
    """torch.compile(fullgraph=True) of the procedure's MLP, its weights dequantized by `dequantize` in the
    graph, per dtype on the current GPU: what compiled and matched, or why Inductor refused (reported: it
    refuses bf16 on a T4; other errors raise), under quiet_torch_compile. Each compile is of a `_fresh` copy
    (no other compiled function is dropped); random states are restored. {"gpu", "capability", "bf16_native", "dtypes":
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
        with quiet_torch_compile() as caught:
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


def compile_points(report: dict) -> int:
    """The rubric's torch.compile points from `report` (compile_report): +1 where a dtype compiled and every
    one that compiled gave bitsandbytes' weights in the graph, once (no recompilation); else -1."""
    compiled = [r for r in report["dtypes"].values() if r["compiled"]]
    exact = all(r["weights_bit_identical"] and r["mlp_bit_identical_to_compiled_mlp_on_eager_weights"]
                and not r["recompiled"] for r in compiled)
    return 1 if compiled and exact else -1


def kernel_ptx(cells: dict) -> str:
    """The PTX this GPU runs for the kernel cells' kernel (`cells`: the notebook's globals): what Triton's own
    launch compiles for a 4096 x 1024 bf16 layer, through the cells' validate, launch_setup, launch_via_triton."""
    layer = make_layer(4096, 1024, torch.bfloat16)
    layout = cells["validate"](layer.weight, layer.weight.quant_state)
    capability, config, out, on_its_gpu = cells["launch_setup"](layout)
    with on_its_gpu:
        return cells["launch_via_triton"](layout, out, config, capability).asm["ptx"]


# 4. Result files --------------------------------------------------------------------------------
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


def write_results(path: Path, env: dict, measurement: dict, **tables) -> str:
    """One JSON file: the environment (GPU, driver, versions, date, and the kernel cells that were measured:
    paste_unit_sha256, which it must hold), how each clock measures and the tables. Returns the path as
    `shown_path` prints it."""
    if not env.get("paste_unit_sha256"):
        raise ValueError("the environment names no paste_unit_sha256: which cells made these numbers?")
    Path(path).write_text(json.dumps({"environment": env, "measurement": measurement, **tables},
                                     indent=2, default=str) + "\n")
    return shown_path(path)


def executed_notebook() -> dict | None:
    """The running notebook with its outputs so far, where the runtime lets a cell read it (Colab, by its own
    private request for the open notebook); else None (run.sh writes the executed notebook itself)."""
    if runtime_name() != "Colab":
        return None
    try:
        from google.colab import _message
        return _message.blocking_request("get_ipynb", timeout_sec=120)["ipynb"]
    except Exception:  # a Colab that answers otherwise: the archive goes without it
        return None


def pack_run(directory: Path, notebook: dict | None = None) -> str:
    """Every file of results/<gpu>/ (its JSON, plots, and an executed notebook run.sh left there), and `notebook`
    (default: executed_notebook()) as its Unsloth_Puzzles_NF4.ipynb, in results/<gpu>.zip, named as in the
    repository. On Colab the browser is offered it; on Kaggle it is copied into the output folder. Returns where it
    is (how a maintainer adopts it is the README's For maintainers section, not a reader's page)."""
    directory = Path(directory)
    archive = directory.with_suffix(".zip")
    notebook = notebook or executed_notebook()
    inside = shown_path(directory)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as packed:
        for path in sorted(directory.iterdir()):
            if path.is_file():
                packed.write(path, f"{inside}/{path.name}")
        if notebook is not None:
            packed.writestr(f"{inside}/{NOTEBOOK_NAME}", json.dumps(notebook, indent=1, ensure_ascii=False))
    with zipfile.ZipFile(archive) as packed:
        names = packed.namelist()
    where = f"{len(names)} files of {inside}/ in {shown_path(archive)}"
    if runtime_name() == "Colab":
        from google.colab import files
        files.download(str(archive))
        where += " (offered as a download)"
    elif runtime_name() == "Kaggle":
        shutil.copy(archive, Path("/kaggle/working") / archive.name)
        where += f" (also /kaggle/working/{archive.name}, this notebook's output)"
    if f"{inside}/{NOTEBOOK_NAME}" in names:
        return wrap(f"Packed {where}, with the executed notebook.")
    return wrap(f"Packed {where}; the executed notebook is this page itself (File → Download).")

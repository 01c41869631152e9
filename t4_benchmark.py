"""The T4's code on this GPU: our kernel, unsloth's fused kernel and a plain copy kernel, each
compiled for sm_75 exactly as Triton's JIT would compile it for a T4, the PTX loaded here through
the CUDA driver's JIT and timed on this GPU. Not a T4 time: the same instructions on a GPU with far
more bandwidth per instruction. What it does show is how the T4's instruction streams compare with
each other, and that they give bitsandbytes' bits.

    python t4_benchmark.py                  # T4_CANDIDATES, unsloth's sm_75 build and the copy kernel on
                                            # the four shapes: results/<gpu>/t4_code.json and t4_code.png
    python t4_benchmark.py --wide           # a wider grid than T4_CANDIDATES: t4_code_wide.json / .png
    python t4_benchmark.py --recommend [results/<gpu>/t4_code.json]
                                            # per shape the best candidate and a LAUNCH_CONFIGS[(7, 5)]
                                            # entry, from a results file (runs anywhere, no GPU)

How one sm_75 launch is made (Sm75Launch): the kernel is launched once through Triton on this GPU,
which builds the JIT's kernel for this GPU and its C launcher; the same source, with the same
specialization and options, is compiled for sm_75; its PTX is loaded through the driver's JIT; the
arguments Triton passes to the C launcher are recorded during one more Triton launch (nothing runs
then), and from there on the launcher is called with exactly those arguments, only the function,
its launch metadata (warps, CTAs, shared memory) and the tensors swapped.

tests/test_t4_gpu.py runs the same machinery on many layouts, bit for bit against bitsandbytes;
scripts/t4_static.py counts the sm_75 SASS of each T4_CANDIDATES entry.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import helpers  # noqa: E402
from kernel_cells import PASTE_UNIT, kernel_cell_sources, load_kernel_cells  # noqa: E402  (tests/)

T4 = (7, 5)          # the T4's compute capability
T4_ARCH = 75
LOOKUPS = {0: "L1", 1: "gathered"}  # LaunchConfig.lookup: how code[nibble] is read

# The configurations a T4 may use: (weights_per_program, num_warps, lookup, evict_first), the fields
# of the kernel's LaunchConfig (ptx left True). Each is built for sm_75 and timed here, checked bit
# for bit in tests/test_t4_gpu.py, and counted by scripts/t4_static.py; LAUNCH_CONFIGS[(7, 5)] is
# drawn from these (`--recommend`). Why these: the WIDE grid's sm_75 builds on an H200
# (results/nvidia-h200/t4_code_wide.json, 2026-11-22) ranked the gathered table ahead of the L1
# table and evict-first ahead of none at every shape and work per thread, 4 warps ahead of 8.
# Kept: the steadiest (4096 weights on 4 warps, gathered, evict-first: within 2.4% of the fastest
# at every shape), the fastest at the two small shapes (2048) and at the two large ones (8192 on 4
# warps, though its sm_75 build spills 48 bytes in fp16 and fits 24 warps an SM in bf16: see
# results/t4-static), 8192 on 8 warps (the third round's pick), and as controls the steadiest
# without evict-first and with the L1 table. Dropped: the L1 table on 8 warps and 1024 weights with
# the L1 table (slower than unsloth's sm_75 build at every shape), and all that no shape ranks first.
T4_CANDIDATES = (
    (4096, 4, 1, True),
    (2048, 4, 1, True),
    (8192, 4, 1, True),
    (8192, 8, 1, True),
    (4096, 4, 1, False),
    (4096, 4, 0, True),
)
# --wide: every work-per-thread from 8 to 64 weights on 4 or 8 warps, both table lookups, both
# eviction settings.
WIDE = tuple((w, warps, lookup, evict) for w in (1024, 2048, 4096, 8192) for warps in (4, 8)
             for lookup in (0, 1) for evict in (True, False) if 8 <= w // (32 * warps) <= 64)
# The procedure's three weight shapes (out, in) and a 70B-class MLP weight.
SHAPES = helpers.KERNEL_SHAPES
# The copy kernel's sweep: (weights per program, warps, evict-first); its fastest is the ceiling.
COPY_SWEEP = tuple((w, warps, evict) for w, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8),
                                                      (16384, 8)) for evict in (True, False))
CALLS, ROUNDS = 40, 7  # launches per timed round, rounds per measurement
TITLE = "the T4's sm_75 instructions run on {gpu} through the driver's JIT: not a T4 time"
METHOD = ("Each kernel compiled for sm_75 with the specialization and options Triton's JIT gives it, the PTX "
          "loaded through the CUDA driver's JIT on this GPU and called through Triton's own C launcher with the "
          "arguments Triton passed it (function, launch metadata and tensors swapped). GPU time per call: "
          f"{CALLS} back-to-back launches queued behind torch.cuda._sleep, CUDA events around them, "
          f"{ROUNDS} rounds (best and median reported). Each launch reads and writes its own copy of the "
          "weight's tensors, rotating over enough copies that consecutive launches share nothing in L2 (a "
          "T4's 4 MB L2 holds none of these weights either). Every timed launch's output is compared bit for "
          "bit with bitsandbytes.functional.dequantize_4bit afterwards.")


def load_kernel():
    """The notebook's kernel cells as a module, as the tests load them."""
    return load_kernel_cells()


def kernel_sources() -> list[str]:
    """The sources of the cells tagged `kernel` (for a hash of what was measured)."""
    return kernel_cell_sources(tags=PASTE_UNIT)


def t4_configs(kernel, candidates=T4_CANDIDATES) -> list:
    """The candidates as the kernel's LaunchConfig."""
    return [kernel.LaunchConfig(*c) for c in candidates]


def describe(config) -> str:
    """(2048, 4, 1, True, True) -> '2048 w, 4 warps, gathered, evict-first'."""
    w, warps, lookup, evict = tuple(config)[:4]
    return f"{w} w, {warps} warps, {LOOKUPS.get(lookup, lookup)}" + (", evict-first" if evict else "")


# ---------------------------------------------------------------------------------------------
# The sm_75 build of a Triton launch, run on this GPU
# ---------------------------------------------------------------------------------------------
def record_launch(compiled, launch_again: Callable[[], object]) -> tuple:
    """The positional arguments Triton hands to `compiled`'s C launcher while `launch_again()`
    launches it through Triton (nothing reaches the GPU: the launcher's function is swapped for a
    recorder on this thread during that one call). Up to Triton 3.6 the kernel's arguments follow
    the launch fields flat; from 3.7 they come as one tuple at the end: both are recorded as given."""
    launcher = compiled.run
    real = launcher.launch
    recorded, thread = [], threading.get_ident()

    def recorder(*args):
        if threading.get_ident() != thread:
            return real(*args)  # another thread's launch goes through
        recorded.append(args)

    launcher.launch = recorder
    try:
        launch_again()
    finally:
        launcher.launch = real
    if len(recorded) != 1:
        raise RuntimeError(f"Triton called the launcher {len(recorded)} times for one launch")
    return recorded[0]


def _hashable(value):
    # compiled metadata comes back from JSON with lists where the options held tuples
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


def options_for(target, metadata) -> dict:
    """The compile options of a JIT build (its metadata), for compiling the same source for another
    target: every option whose default is the same on both targets, as the JIT set it; the options
    whose defaults depend on the target (arch, fp8 types, ...) are left to the backend."""
    from triton.compiler.compiler import make_backend
    here = make_backend(metadata.target).parse_options({})
    there = make_backend(target).parse_options({})
    target_dependent = {name for name in vars(here) if getattr(here, name) != getattr(there, name)} | {"arch"}
    return {name: _hashable(getattr(metadata, name)) for name in vars(here)
            if name not in target_dependent and hasattr(metadata, name)}


def _swapped(value, swaps: dict):
    # a recorded launcher argument with every tensor in `swaps` (by identity) replaced, nested tuples too
    if isinstance(value, torch.Tensor):
        return swaps.get(id(value), value)
    if type(value) is tuple:
        return tuple(_swapped(v, swaps) for v in value)
    return value


def _occurrences(value, tensor) -> int:
    if value is tensor:
        return 1
    return sum(_occurrences(v, tensor) for v in value) if type(value) is tuple else 0


class Sm75Build(NamedTuple):
    compiled: object   # triton's CompiledKernel for sm_75 (not loaded by Triton)
    function: int      # its PTX loaded through the driver's JIT on this GPU
    registers: int
    spills: int


_SM75_BUILDS: dict = {}  # the JIT build's hash -> its Sm75Build (a build per specialization, not per call)


def sm75_build(compiled) -> Sm75Build:
    """`compiled` (a JIT build for this GPU) compiled again for sm_75 with the same source,
    specialization and options, and its PTX loaded on this GPU through the driver's JIT."""
    key = compiled.hash
    if key in _SM75_BUILDS:
        return _SM75_BUILDS[key]
    from triton.backends.compiler import GPUTarget
    target = GPUTarget("cuda", T4_ARCH, compiled.metadata.target.warp_size)
    options = options_for(target, compiled.metadata)
    sm75 = triton.compile(compiled.src, target=target, options=options)
    ptx = sm75.asm["ptx"]
    if ".target sm_75" not in ptx:
        raise RuntimeError("the PTX is not written for sm_75")
    for name, value in options.items():
        if _hashable(getattr(sm75.metadata, name)) != value:
            raise RuntimeError(f"compile option {name} differs between the JIT build and the sm_75 build")
    for name in ("global_scratch_size", "profile_scratch_size", "num_ctas", "launch_cooperative_grid",
                 "launch_pdl"):
        # the JIT build's launcher allocates scratch and sets these: the sm_75 build must need the same
        if hasattr(compiled.metadata, name) and getattr(sm75.metadata, name) != getattr(compiled.metadata, name):
            raise RuntimeError(f"{name} differs between the JIT build and the sm_75 build")
    driver = triton.runtime.driver.active
    # null-terminated PTX where a cubin would go: the driver compiles it for this GPU
    loaded = driver.utils.load_binary(sm75.name, ptx.encode() + b"\0", sm75.metadata.shared,
                                      driver.get_current_device())
    build = _SM75_BUILDS[key] = Sm75Build(sm75, loaded[1], loaded[2], loaded[3])
    return build


class Sm75Launch:
    """One Triton launch, `jit_function[grid](*args, **constexprs, **options)`, with its sm_75 build
    in place of the JIT's. Constructing it launches the JIT's build once (into the `out` among
    `args`); `launch(swaps)` then runs the sm_75 build with the recorded launcher arguments, tensors
    swapped by identity ({id(tensor in args): replacement}); `arguments(swaps)` gives them without
    launching."""

    def __init__(self, jit_function, grid, args, constexprs, options, out):
        run = lambda: jit_function[grid](*args, **constexprs, **options)  # noqa: E731
        compiled = run()  # the JIT's build for this GPU, launched once: `out` holds its result
        self.jit_compiled, self.build = compiled, sm75_build(compiled)
        recorded = list(record_launch(compiled, run))
        if recorded[4] != compiled.function:
            raise RuntimeError("the function handle is not the launcher's fifth argument")
        recorded[4] = self.build.function
        metadata = tuple(compiled.packed_metadata)
        at = [i for i, value in enumerate(recorded) if type(value) is tuple and value == metadata]
        if len(at) != 1:
            raise RuntimeError(f"the launch metadata {metadata} is not one of the launcher's arguments")
        recorded[at[0]] = tuple(self.build.compiled.packed_metadata)  # warps, CTAs, sm_75 shared memory
        if sum(_occurrences(v, out) for v in recorded) != 1:
            raise RuntimeError("the output is not passed to the launcher once")
        self.recorded, self.launcher, self.out = tuple(recorded), compiled.run, out

    def arguments(self, swaps: dict | None = None) -> tuple:
        return tuple(_swapped(v, swaps or {}) for v in self.recorded)

    def launch(self, swaps: dict | None = None):
        self.launcher.launch(*self.arguments(swaps))

    def facts(self) -> dict:
        sm75 = self.build.compiled
        return {"registers": self.build.registers, "spills": self.build.spills, "shared_bytes": sm75.metadata.shared,
                "num_warps": sm75.metadata.num_warps, "ptx_bytes": len(sm75.asm["ptx"]),
                "jit_target": self.jit_compiled.metadata.target.arch}


# ---------------------------------------------------------------------------------------------
# The three kernels, as launches
# ---------------------------------------------------------------------------------------------
def ours(kernel, layout, out, config) -> Sm75Launch:
    """Our kernel with `config` and the T4's constexprs (capability 7.5: Triton's own bf16 cast)."""
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, T4)
    return Sm75Launch(kernel._dequantize_4bit_kernel, grid, args, constexprs, options, out)


class Unsloth(NamedTuple):
    utils: object  # unsloth.kernels.utils
    nf4: object    # unsloth.kernels.nf4: the fused kernel, its configuration table and launch


def import_unsloth() -> Unsloth | None:
    """unsloth's kernel modules (without running unsloth's package __init__, see helpers), or None
    without unsloth or where it has no fused NF4 path."""
    utils = helpers.import_unsloth_kernels()
    nf4 = sys.modules.get("unsloth.kernels.nf4")
    return Unsloth(utils, nf4) if utils is not None and nf4 is not None else None


def unsloth_launch_arguments(unsloth: Unsloth, W, quant_state, out, capability=T4) -> tuple:
    """(kernel, grid, args, constexprs, options) of the launch unsloth's eager dequantize_nf4 makes
    for this weight on a GPU of `capability` (its own configuration table and choice; nothing is
    launched): its launch helper is replaced by a recorder and its capability lookup answers
    `capability` for the one call."""
    nf4 = unsloth.nf4
    absmax, shape, dtype, blocksize, code, code2, absmax2, offset, blocksize2 = \
        unsloth.utils._unpack_quant_state(quant_state)
    seen = []

    def capture(kernel, grid, args, n_tensors, constexprs, device_index, **options):
        seen.append((kernel, grid, args, constexprs, options))
        return None  # "no cache entry": unsloth returns the output

    launch, lookup = nf4.launch, nf4._capability
    nf4.launch, nf4._capability = capture, (lambda index: capability)
    try:
        nf4.dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=out)
    finally:
        nf4.launch, nf4._capability = launch, lookup
    if len(seen) != 1:
        raise RuntimeError(f"unsloth's dequantize_nf4 launched {len(seen)} times")
    return seen[0]


def unsloth_config(constexprs, options, blocksize) -> dict:
    rows = constexprs["ROWS"]
    return {"rows": rows, "weights_per_program": rows * blocksize, "packed_bytes_per_program": rows * blocksize // 2,
            "num_warps": options["num_warps"], "int32_loads": bool(constexprs["WORDS"]),
            "evict": constexprs["EVICT"] or "none", "lut_mode": constexprs["LUT_MODE"],
            "enable_fp_fusion": options.get("enable_fp_fusion")}


@triton.jit
def _copy_kernel(
    packed_ptr,   # uint8: the packed weight's bytes, HALF per absmax block
    absmax_ptr,   # uint8: one absmax code per block
    out_ptr,      # int16 [2 * bytes]: two 16-bit values per packed byte
    ROWS: tl.constexpr,    # absmax blocks per program
    HALF: tl.constexpr,    # packed bytes per block
    STREAM: tl.constexpr,  # evict-first hints
):
    # A dequantization's traffic with no decoding: each byte and its block's absmax code read once,
    # two 16-bit values written per byte (the byte in the low half, the code in the high half, so
    # neither load can be dropped). Whole tiles only: the shapes here are.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    hint: tl.constexpr = "evict_first" if STREAM else ""
    packed = tl.load(packed_ptr + rows[:, None] * HALF + tl.arange(0, HALF)[None, :], eviction_policy=hint)
    absmax = tl.load(absmax_ptr + rows)
    word = packed.to(tl.int16) | (absmax.to(tl.int16) << 8)[:, None]
    tl.store(out_ptr + rows[:, None] * (2 * HALF) + tl.arange(0, 2 * HALF)[None, :], tl.interleave(word, word),
             eviction_policy=hint)


def copy_launch(packed, absmax, out, weights_per_program, num_warps, evict_first, blocksize=64) -> Sm75Launch:
    rows = weights_per_program // blocksize
    n_blocks = absmax.numel()
    if n_blocks % rows:
        raise ValueError(f"{n_blocks} blocks are not whole tiles of {rows}")
    return Sm75Launch(_copy_kernel, (n_blocks // rows,), (packed, absmax, out),
                      dict(ROWS=rows, HALF=blocksize // 2, STREAM=evict_first), dict(num_warps=num_warps), out)


def copy_expected(packed, absmax, blocksize=64) -> torch.Tensor:
    """What the copy kernel writes, as int16."""
    word = packed.view(torch.uint8).reshape(-1, blocksize // 2).to(torch.int32) \
        | (absmax.to(torch.int32) << 8)[:, None]
    word = torch.where(word >= 2**15, word - 2**16, word).to(torch.int16).reshape(-1)
    return torch.stack((word, word), dim=1).reshape(-1)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
class GpuTime(NamedTuple):
    best_us: float
    median_us: float
    rounds_us: list
    host_bound_rounds: int  # rounds whose launches took the host longer than the sleep before them


_SLEEP_US_PER_MCYCLE: list = []


def _sleep_us_per_mcycle() -> float:
    """How long torch.cuda._sleep(1_000_000) keeps this GPU busy, in µs (measured once)."""
    if not _SLEEP_US_PER_MCYCLE:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # warm
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        _SLEEP_US_PER_MCYCLE.append(start.elapsed_time(end) * 1e3)
    return _SLEEP_US_PER_MCYCLE[0]


def gpu_time(launches: Sequence[Callable[[], None]], calls: int = CALLS, rounds: int = ROUNDS) -> GpuTime:
    """GPU time per call of `launches` run in turn, `calls` of them back to back per round: they are
    queued behind a sleeping kernel that outlasts their issue, so the events between them time the
    GPU alone."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_mcycle = _sleep_us_per_mcycle()
    host_us, samples, host_bound = 500.0, [], 0
    for _ in range(rounds):
        sleep_us = max(1000.0, 3 * host_us)
        torch.cuda._sleep(int(sleep_us / per_mcycle * 1e6))
        issued = time.perf_counter()
        start.record()
        for i in range(calls):
            launches[i % len(launches)]()
        end.record()
        host_us = (time.perf_counter() - issued) * 1e6
        end.synchronize()
        host_bound += host_us > sleep_us
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return GpuTime(min(samples), statistics.median(samples), [round(s, 3) for s in samples], host_bound)


def copies_needed(bytes_per_call: int) -> int:
    """Rotating copies so that the launches between two uses of one copy move twice the L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20
    return max(1, math.ceil(2 * l2 / bytes_per_call))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def timed_and_checked(launch: Sm75Launch, rotations: list[dict], outputs: list[torch.Tensor],
                      expected: torch.Tensor) -> tuple[GpuTime, bool]:
    """GPU time of `launch` rotating over `rotations` (swaps), and whether every output the timed
    launches wrote (filled with 0xFF bytes first) has the expected bits."""
    for out in outputs:
        out.view(torch.uint8).fill_(0xFF)
    arguments = [launch.arguments(swaps) for swaps in rotations]
    raw = launch.launcher.launch
    timing = gpu_time([lambda a=a: raw(*a) for a in arguments])
    torch.cuda.synchronize()
    bits = _bits(expected)
    exact = all(torch.equal(_bits(out).reshape(-1), bits.reshape(-1)) for out in outputs)
    return timing, exact


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
def measure_shape(kernel, unsloth, out_features, in_features, dtype, configs) -> dict:
    import bitsandbytes.functional as bnbf
    layer = helpers.make_layer(out_features, in_features, dtype)
    W, qs = layer.weight, layer.weight.quant_state
    reference = bnbf.dequantize_4bit(W, qs)
    layout = kernel.validate(W, qs).layout
    n = reference.numel()
    n_bytes = helpers.bytes_moved(n, dtype)
    copies = copies_needed(n_bytes)
    packed = [layout.packed.clone() for _ in range(copies)]
    absmax = [layout.absmax.clone() for _ in range(copies)]
    outputs = [torch.empty_like(reference) for _ in range(copies)]
    row = {"shape": f"{out_features}x{in_features}", "dtype": helpers.short_dtype(dtype), "weights": n,
           "bytes_moved": n_bytes, "rotating_copies": copies}

    def rotations(packed_arg, absmax_arg, out_arg, outs):
        # the swaps of each rotation: the launch's own packed bytes, absmax codes and output -> a copy
        return [{id(packed_arg): p, id(absmax_arg): a, id(out_arg): o} for p, a, o in zip(packed, absmax, outs)]

    # ours, every candidate
    row["ours"] = {}
    for config in configs:
        out = torch.empty_like(reference)
        launch = ours(kernel, layout, out, config)
        jit_exact = torch.equal(_bits(out), _bits(reference))
        timing, exact = timed_and_checked(launch, rotations(layout.packed, layout.absmax, out, outputs), outputs,
                                           reference)
        row["ours"][str(list(config))] = {
            "config": list(config), "best_us": round(timing.best_us, 3), "median_us": round(timing.median_us, 3),
            "rounds_us": timing.rounds_us, "host_bound_rounds": timing.host_bound_rounds,
            "sm75_bit_exact": exact, "jit_build_bit_exact": jit_exact, **launch.facts()}
        print(f"  {row['shape']} {row['dtype']} ours {describe(config):<40} {timing.best_us:9.2f} us "
              f"(median {timing.median_us:.2f}){'' if exact else '  NOT EXACT'}", flush=True)

    # the first candidate with the kernel's hand rounding to bf16 (BF16_RNE, the interpreter's path)
    # in place of Triton's own conversion: what the T4 build ran before
    if dtype == torch.bfloat16:
        out = torch.empty_like(reference)
        grid, args, constexprs, options = kernel.launch_arguments(layout, out, configs[0], T4)
        launch = Sm75Launch(kernel._dequantize_4bit_kernel, grid, args, {**constexprs, "BF16_RNE": True}, options, out)
        timing, exact = timed_and_checked(launch, rotations(layout.packed, layout.absmax, out, outputs), outputs,
                                          reference)
        row["hand_bf16_rounding"] = {"config": list(configs[0]), "best_us": round(timing.best_us, 3),
                                     "median_us": round(timing.median_us, 3), "sm75_bit_exact": exact}
        print(f"  {row['shape']} {row['dtype']} ours {describe(configs[0])}, hand bf16 rounding "
              f"{timing.best_us:9.2f} us{'' if exact else '  NOT EXACT'}", flush=True)

    # unsloth's fused kernel with the configuration it picks for capability 7.5
    if unsloth is not None:
        out = torch.empty_like(reference)
        fn, grid, args, constexprs, options = unsloth_launch_arguments(unsloth, W, qs, out)
        launch = Sm75Launch(fn, grid, args, constexprs, options, out)
        jit_exact = torch.equal(_bits(out), _bits(reference))
        timing, exact = timed_and_checked(launch, rotations(args[0], args[1], out, outputs), outputs, reference)
        row["unsloth"] = {"config": unsloth_config(constexprs, options, qs.blocksize),
                          "best_us": round(timing.best_us, 3), "median_us": round(timing.median_us, 3),
                          "rounds_us": timing.rounds_us, "host_bound_rounds": timing.host_bound_rounds,
                          "sm75_bit_exact": exact, "jit_build_bit_exact": jit_exact, **launch.facts()}
        print(f"  {row['shape']} {row['dtype']} unsloth sm_75 {timing.best_us:9.2f} us{'' if exact else '  NOT EXACT'}",
              flush=True)

    # the copy kernel's sweep: its fastest is the ceiling
    outputs.clear()  # room for the copy kernel's outputs
    copy_out = [torch.empty(n, dtype=torch.int16, device=reference.device) for _ in range(copies)]
    expected = copy_expected(layout.packed, layout.absmax, qs.blocksize)
    sweep = []
    for weights, warps, evict in COPY_SWEEP:
        out = torch.empty(n, dtype=torch.int16, device=reference.device)
        launch = copy_launch(layout.packed, layout.absmax, out, weights, warps, evict, qs.blocksize)
        timing, exact = timed_and_checked(launch, rotations(layout.packed, layout.absmax, out, copy_out), copy_out,
                                          expected)
        if not exact:
            raise RuntimeError(f"the copy kernel ({weights}, {warps}, {evict}) wrote something else")
        sweep.append({"weights_per_program": weights, "num_warps": warps, "evict_first": evict,
                      "best_us": round(timing.best_us, 3), "median_us": round(timing.median_us, 3)})
    best = min(sweep, key=lambda s: s["best_us"])
    row["copy"] = {"best_us": best["best_us"], "median_us": best["median_us"],
                   "config": {k: best[k] for k in ("weights_per_program", "num_warps", "evict_first")},
                   "sweep": sweep}
    print(f"  {row['shape']} {row['dtype']} copy kernel {best['best_us']:9.2f} us", flush=True)
    for entry in row["ours"].values():
        entry["vs_unsloth"] = round(row["unsloth"]["best_us"] / entry["best_us"], 4) if "unsloth" in row else None
        entry["of_copy_speed"] = round(best["best_us"] / entry["best_us"], 4)
    if "unsloth" in row:
        row["unsloth"]["of_copy_speed"] = round(best["best_us"] / row["unsloth"]["best_us"], 4)
    return row


def run(candidates, out_dirs: Sequence[Path], name: str = "t4_code") -> dict:
    kernel = load_kernel()
    unsloth = import_unsloth()
    env = helpers.environment()
    if unsloth is not None:
        nf4_sha = hashlib.sha256(Path(unsloth.nf4.__file__).read_bytes()).hexdigest()
        env["unsloth_nf4_sha256"] = nf4_sha  # environment() names the version by it where metadata is missing
    configs = t4_configs(kernel, candidates)
    report = {
        "what": TITLE.format(gpu=env["gpu"]),
        "environment": env,
        "method": METHOD,
        "kernel_cells_sha256": hashlib.sha256("\n\n".join(kernel_sources()).encode()).hexdigest(),
        "candidates": [list(c) for c in configs],
        "unsloth_t4_config_rule": unsloth_rule() if unsloth else "unsloth not installed",
        "shapes": [],
    }
    print(report["what"], flush=True)
    for out_features, in_features, dtype in SHAPES:
        report["shapes"].append(measure_shape(kernel, unsloth, out_features, in_features, dtype, configs))
        torch.cuda.empty_cache()
    report["recommendation"] = recommend(report)
    for directory in out_dirs:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        plot(report, directory / f"{name}.png")
        print("wrote", helpers.shown_path(directory / f"{name}.json"), f"and {name}.png")
    return report


def unsloth_rule() -> str:
    newer = tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 7)
    return ("unsloth.kernels.nf4's own eager dequantize_nf4, its capability lookup answering (7, 5): on Triton "
            f"{triton.__version__} that is " + ("its (7, 5) entry (512 bytes a program, 8 warps, int32 loads, "
                                                "evict-first)" if newer else
                                                "its default table (its (7, 5) entry exists on Triton >= 3.7 only)"))


# ---------------------------------------------------------------------------------------------
# Reading the results: table, recommendation, plot
# ---------------------------------------------------------------------------------------------
def table(report: dict) -> str:
    """µs per call (best round) and the ratio unsloth / ours, per shape; lines under 120 characters."""
    shapes = report["shapes"]
    with_unsloth = all("unsloth" in s for s in shapes)

    def row(label, entries):
        # entries: per shape (µs, exact) or None
        cells = []
        for s, entry in zip(shapes, entries):
            if entry is None:
                cells.append(f"{'-':>11}{'':8}")
                continue
            us, exact = entry
            ratio = f"({s['unsloth']['best_us'] / us:.2f}x)" if "unsloth" in s else ""
            cells.append(f"{us:>11.2f}{'' if exact else '!':1}{ratio:<7}")
        return f"{label:<44}" + "".join(cells)

    lines = [report["what"], f"GPU µs per call, best of {ROUNDS} rounds; (x) = unsloth's sm_75 time / this",
             f"{'sm_75 build':<44}" + "".join(f"{s['shape'] + ' ' + s['dtype']:>19}" for s in shapes)]
    if with_unsloth:
        lines.append(row("unsloth fused, its choice for 7.5",
                         [(s["unsloth"]["best_us"], s["unsloth"]["sm75_bit_exact"]) for s in shapes]))
    lines.append(row("copy kernel (same bytes, best of sweep)", [(s["copy"]["best_us"], True) for s in shapes]))
    hand = [s.get("hand_bf16_rounding") for s in shapes]
    for i, key in enumerate(shapes[0]["ours"]):
        lines.append(row("ours " + describe(shapes[0]["ours"][key]["config"]),
                         [(s["ours"][key]["best_us"], s["ours"][key]["sm75_bit_exact"]) for s in shapes]))
        if i == 0 and any(hand):  # measured with the first candidate
            lines.append(row("  the same, hand bf16 rounding (before)",
                             [(h["best_us"], h["sm75_bit_exact"]) if h else None for h in hand]))
    exact = (all(e["sm75_bit_exact"] and e["jit_build_bit_exact"] for s in shapes for e in s["ours"].values())
             and all(s["unsloth"]["sm75_bit_exact"] for s in shapes if "unsloth" in s)
             and all(h["sm75_bit_exact"] for h in hand if h))
    lines.append("every output bit-identical to bitsandbytes: " + ("yes" if exact else "NO (marked !)"))
    return "\n".join(lines)


REGRET = 0.03  # an entry may be this much slower than the fastest candidate at a shape


def _config_text(config) -> str:
    # LaunchConfig(...) as the kernel cells write it (ptx=True is its default)
    fields = list(config)[:4] if len(config) == 5 and config[4] else list(config)
    return f"LaunchConfig({', '.join(map(str, fields))})"


def _limit_between(below: int, above: int) -> int:
    """A size limit between two shapes' weight counts: the power of two nearest their geometric
    mean, if it lies between them, else that mean."""
    mean = math.sqrt(below * above)
    power = 1 << round(math.log2(mean))
    return power if below <= power < above else int(mean)


def recommend(report: dict) -> dict:
    """Per shape the fastest exact candidate; a LAUNCH_CONFIGS[(7, 5)] entry: the fewest size
    ranges (shapes in order of weights, split into contiguous groups, one configuration a group:
    the one whose worst slowdown against the fastest candidate in the group is least) whose
    configurations are all within REGRET of the fastest at every shape, else the split with the
    least worst slowdown; and the candidates that lose to unsloth's sm_75 build at every shape."""
    shapes = sorted(report["shapes"], key=lambda s: s["weights"])
    keys = list(shapes[0]["ours"])
    exact = [k for k in keys if all(s["ours"][k]["sm75_bit_exact"] for s in shapes)]
    best = {s["shape"]: min(exact, key=lambda k: s["ours"][k]["best_us"]) for s in shapes}

    def slowdown(k, s):
        return s["ours"][k]["best_us"] / s["ours"][best[s["shape"]]]["best_us"] - 1

    def pick(group):  # (worst slowdown, key) of the steadiest configuration over the group
        return min((max(slowdown(k, s) for s in group), k) for k in exact)

    options = []
    for cuts in range(1 << (len(shapes) - 1)):  # every split of the ordered shapes into groups
        groups, current = [], [shapes[0]]
        for i, s in enumerate(shapes[1:]):
            if cuts >> i & 1:
                groups.append(current)
                current = []
            current.append(s)
        groups.append(current)
        picks = [pick(g) for g in groups]
        options.append((max(w for w, _ in picks), groups, [k for _, k in picks]))
    within = [o for o in options if o[0] <= REGRET]
    worst, groups, picks = (min(within, key=lambda o: (len(o[1]), o[0])) if within
                            else min(options, key=lambda o: (o[0], len(o[1]))))
    entry = []
    for i, (group, k) in enumerate(zip(groups, picks)):
        limit = None if i == len(groups) - 1 else _limit_between(group[-1]["weights"], groups[i + 1][0]["weights"])
        if entry and entry[-1][1] == shapes[0]["ours"][k]["config"]:
            entry[-1][0] = limit  # the same configuration as the range below: one range
        else:
            entry.append([limit, shapes[0]["ours"][k]["config"]])
    ranges = "one configuration for every size" if len(entry) == 1 else f"{len(entry)} size ranges"
    why = (f"{ranges}, at most {worst:.1%} slower than the fastest candidate at any shape"
           + ("" if within else f" (no split keeps every shape within {REGRET:.0%})"))
    losers = [k for k in keys if all("unsloth" in s and s["ours"][k]["best_us"] >= s["unsloth"]["best_us"]
                                     for s in shapes)]
    geomean = {k: math.exp(statistics.fmean(math.log(s["ours"][k]["vs_unsloth"]) for s in shapes))
               for k in keys if all(s["ours"][k].get("vs_unsloth") for s in shapes)}
    return {
        "per_shape_best": {s["shape"]: {"config": s["ours"][best[s["shape"]]]["config"],
                                        "best_us": s["ours"][best[s["shape"]]]["best_us"],
                                        "vs_unsloth": s["ours"][best[s["shape"]]]["vs_unsloth"],
                                        "of_copy_speed": s["ours"][best[s["shape"]]]["of_copy_speed"]}
                           for s in shapes},
        "worst_slowdown_per_candidate": {k: round(max(slowdown(k, s) for s in shapes), 4) for k in exact},
        "geomean_vs_unsloth_per_candidate": {k: round(v, 4) for k, v in geomean.items()},
        "launch_configs_t4": entry,
        "worst_slowdown_of_entry": round(worst, 4),
        "why": why,
        "lose_to_unsloth_everywhere": [shapes[0]["ours"][k]["config"] for k in losers],
        "not_exact": [k for k in keys if k not in exact],
    }


def recommendation_text(report: dict) -> str:
    rec = report.get("recommendation") or recommend(report)
    lines = ["per shape, the fastest candidate (sm_75 build):"]
    for shape, b in rec["per_shape_best"].items():
        vs = f", {b['vs_unsloth']:.2f}x unsloth's sm_75" if b["vs_unsloth"] else ""
        lines.append(f"  {shape:>11}: {describe(b['config'])}: {b['best_us']:.2f} us{vs}, "
                     f"{b['of_copy_speed']:.0%} of the copy kernel's speed")
    lines.append("proposed LAUNCH_CONFIGS[(7, 5)]:")
    lines.append(f"  ({rec['why']})")
    body = "".join(f"        ({limit}, {_config_text(config)}),\n" for limit, config in rec["launch_configs_t4"])
    lines.append(f"    (7, 5): [\n{body}    ],")
    if rec["lose_to_unsloth_everywhere"]:
        lines.append("slower than unsloth's sm_75 build at every shape (drop):")
        lines += [f"  {describe(c)}" for c in rec["lose_to_unsloth_everywhere"]]
    if rec["not_exact"]:
        lines.append("NOT bit-exact somewhere (never use): " + "; ".join(rec["not_exact"]))
    return "\n".join(lines)


def plot(report: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    env, shapes = report["environment"], report["shapes"]
    labels = [f"{s['shape']}\n{s['dtype']}" for s in shapes]
    x = list(range(len(shapes)))
    keys = list(shapes[0]["ours"])
    with_unsloth = all("unsloth" in s for s in shapes)
    # one above the other, 9 inches wide at 100 dpi, text 9 pt or more: read at its own size on GitHub and Colab
    fig, (left, right) = plt.subplots(2, 1, figsize=(9, 4.6 + 0.26 * len(keys)), layout="constrained",
                                      gridspec_kw={"height_ratios": (3.4, 1.2 + 0.26 * len(keys))})
    # left: effective bandwidth (bytes a dequantization moves / GPU time): copy kernel, unsloth, ours
    rec = report.get("recommendation") or recommend(report)
    series = [("copy kernel (same bytes, no math)", [s["copy"]["best_us"] for s in shapes], "0.6")]
    if with_unsloth:
        series.append(("unsloth fused, its choice for 7.5", [s["unsloth"]["best_us"] for s in shapes], "tab:orange"))
    series.append(("ours, fastest candidate", [s["ours"][str(rec["per_shape_best"][s["shape"]]["config"])]["best_us"]
                                               for s in shapes], "tab:blue"))
    width = 0.8 / len(series)
    top = 0
    for i, (name, times, color) in enumerate(series):
        values = [s["bytes_moved"] / us / 1e3 for s, us in zip(shapes, times)]
        top = max(top, *values)
        left.bar([xi + (i - (len(series) - 1) / 2) * width for xi in x], values, width, label=name, color=color)
    left.set_ylim(0, top * 1.3)
    left.set_xticks(x, labels)
    left.set_ylabel("GB/s (bytes moved / GPU time)")
    left.set_title("sm_75 builds: effective bandwidth", fontsize=10)
    left.legend(fontsize=9, loc="upper left", ncol=2)
    # right: unsloth's sm_75 time / ours, every candidate at every shape
    if with_unsloth:
        ratios = [[s["ours"][k]["vs_unsloth"] for s in shapes] for k in keys]
        spread = max(abs(r - 1) for row in ratios for r in row) or 0.1
        # the colour scale reaches past the data, so that every cell stays light enough for dark text
        image = right.imshow(ratios, cmap="RdBu", vmin=1 - 1.6 * spread, vmax=1 + 1.6 * spread, aspect="auto")
        for row, values in enumerate(ratios):
            for col, value in enumerate(values):
                right.text(col, row, f"{value:.2f}x", ha="center", va="center", fontsize=9,
                           fontweight="bold" if value >= 1.15 else "normal", color="black")
        right.set_xticks(x, labels)
        right.set_yticks(range(len(keys)), [describe(shapes[0]["ours"][k]["config"]) for k in keys], fontsize=9)
        right.set_title("unsloth's sm_75 time / ours, per candidate (bold: 1.15x or more)", fontsize=10)
        fig.colorbar(image, ax=right, fraction=0.04).set_label("unsloth's sm_75 time / ours", fontsize=9)
    fig.suptitle(TITLE.format(gpu=env["gpu"]) + f"\n{helpers.versions_line(env, date=False)}", fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wide", action="store_true", help="time the WIDE grid instead of T4_CANDIDATES")
    parser.add_argument("--recommend", nargs="?", const="", metavar="RESULTS",
                        help="print the recommendation of a results file (default: this GPU's) and stop")
    parser.add_argument("--also", type=Path, action="append", default=[], help="write the results here too")
    args = parser.parse_args(argv)
    if args.recommend is not None:
        path = Path(args.recommend) if args.recommend else helpers.results_dir(helpers.environment()) / "t4_code.json"
        report = json.loads(path.read_text())
        print(table(report))
        print(recommendation_text(report))
        return report
    if not torch.cuda.is_available():
        sys.exit("t4_benchmark.py runs the sm_75 builds on a CUDA GPU (--recommend runs anywhere)")
    directory = helpers.results_dir(helpers.environment())
    report = run(WIDE if args.wide else T4_CANDIDATES, [directory, *args.also],
                 "t4_code_wide" if args.wide else "t4_code")
    print(table(report))
    print(recommendation_text(report))
    return report


if __name__ == "__main__":
    main()

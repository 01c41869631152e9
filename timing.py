"""How the notebook's times are made, in its order: kernel-only GPU time from the profiler, host time,
the split of a call in the procedure's loop, and what a T4 would take (an emulation on this GPU). helpers.py
sets up what they time; report.py shows the numbers.

  GPU time        gpu_time, gpu_samples, l2_flush, kernel_table (beside a copy kernel), device_copy_gbs
  Host time       host_time (the notebook's host time per call is the procedure's split: add_call_split)
  A call's split  timed_calls, add_call_split (wall = issue + wait, GPU time beside)
  A T4            T4_COPY_GBS, emulate_t4 and PaddedToT4 (measured), EMULATION_ASSUMES
  Launch config   pick_launch_config: the paste unit's configuration picked on this GPU, where LAUNCH_CONFIGS' entry
                  was measured on other GPU models (CONFIG_MEASURED_ON); launch_config_line says which ran

Every number names its clock (MEASUREMENT): GPU time, the GPU's own kernel durations through CUPTI (host time
cannot leak in as into CUDA events around a Python call); host time; the procedure's wall clock and its split.
CUDA events time one thing here, the GPU sleep a T4's padding is made of (sleep_cycles_per_us).
"""
from __future__ import annotations

import collections
import functools
import time
import warnings
from typing import Callable, Iterable, NamedTuple, Sequence

import torch

from helpers import (BASELINES, KERNEL_SHAPES, PROCEDURE_CASES, PROCEDURE_METHOD, SAME_KERNELS, bitsandbytes_bits,
                     bytes_moved, call_bytes, dtype_name, make_layer, quantile, round_ratios)

# triton only with a GPU, for the GPU's kernels here: without one the notebook turns on Triton's interpreter,
# and triton.language imported before that keeps tl.interleave and the like out of the interpreter
triton = None
if torch.cuda.is_available():
    try:
        import triton
        import triton.language as tl
    except ModuleNotFoundError as error:  # a torch without triton, until install_missing installs it
        if error.name != "triton":
            raise

# GPU and host timing ------------------------------------------------------------------------------
GPU_TIME_METHOD = ("GPU time: summed durations of every kernel, copy and memset one call launches "
                   "(CUPTI via torch.profiler), L2 flushed before each call")
HOST_TIME_METHOD = "host time: perf_counter around one call issued with the GPU idle (synchronized before, untimed)"
CALL_SPLIT_METHOD = ("a call of the procedure's loop timed by perf_counter in two parts, issue (the call to its "
                     "return, .t() included) and wait (inside torch.cuda.synchronize()): wall = issue + wait")
FLUSH_KERNEL = "_l2_flush_before_timed_call"
_FLUSHES: dict[int, L2Flush] = {}  # device index -> its flush, made on first use


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
        return cls(*(quantile(samples_us, q) for q in (0.5, 0.2, 0.8)), len(samples_us), kernels)

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


def synchronize(device=None):
    """Wait for `device`'s GPU work (the current GPU's unless told); nothing without a GPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize(device)


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


def gpu_samples(fn: Callable[[], object], calls: int, flush: L2Flush) -> tuple[list[float], int]:
    """The GPU time (µs) of each of `calls` calls of fn, L2 flushed before each, and GPU operations per call (mode):
    one profiled run of the calls and a last flush to close the last one, after three unprofiled calls (they
    compile, validate, tune: not what is timed)."""
    for _ in range(3):
        flush()
        fn()

    def work():
        for _ in range(calls):
            flush()
            fn()
        flush()

    per_call = calls_between_flushes(_profiled(work))
    if len(per_call) != calls:
        raise RuntimeError(f"{len(per_call)} calls found between flushes, {calls} were made")
    counts = collections.Counter(len(call) for call in per_call)
    return [sum(e.end_us - e.start_us for e in call) for call in per_call], counts.most_common(1)[0][0]


def gpu_time(fn: Callable[[], object], calls: int = 100, flush: L2Flush | None = None) -> Timing:
    """GPU time per call of fn (GPU_TIME_METHOD) on the current device, over `calls` calls."""
    return Timing.of(*gpu_samples(fn, calls, flush or l2_flush()))


def host_time(fn: Callable[[], object], calls: int = 500, device=None) -> Timing:
    """Host time of one call of fn (HOST_TIME_METHOD): the GPU is idle when each call starts, as after
    the procedure's synchronize, so no call waits behind another's GPU work. `device`: the GPU fn's work
    runs on, where it is not the current one."""
    for _ in range(20):
        fn()
    samples = []
    for _ in range(calls):
        synchronize(device)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    synchronize(device)
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


SPLIT_WARM_UP = 100  # iterations of each method's loop, untimed, before a case's split is timed


def add_call_split(procedure: dict, methods: dict[str, Callable], build_case: Callable, rounds: int = 5,
                   iterations: int = 100, synchronize: Callable[[], None] = torch.cuda.synchronize,
                   clock: Callable[[], float] = time.perf_counter, profile: Callable | None = None) -> None:
    """Where a call's time goes, added to each case of `procedure` per method (issue_us, wait_us, wall_us, gpu_us,
    gpu_kernels, split_calls, split_rounds), on layers rebuilt by `build_case(*case)`. The procedure's loop
    (timed_calls: up, gate, down) SPLIT_WARM_UP times untimed, then `rounds` rounds of `iterations`, the methods in
    turn, the order rotated each round; kept: the round of median wall, its issue and wait per call (means over its
    calls), so wall_us is issue_us + wait_us exactly. GPU time per call (durations of the GPU operations, `profile`: the profiler, no L2
    flush as in the procedure) comes from one more round, profiled: beside the sum, not in it."""
    profile = profile or _profiled
    names = list(procedure)
    calls = 3 * iterations
    for c, case in enumerate(PROCEDURE_CASES):
        mlp, _ = build_case(*case)
        layers = (mlp.up_proj, mlp.gate_proj, mlp.down_proj)  # the procedure's order
        for name in names:
            timed_calls(methods[name], layers, SPLIT_WARM_UP, synchronize, clock)  # untimed: a warm host
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
    ceiling (`ceiling_*`) in the fastest configuration of a small sweep (`ceiling_config`). Ours through
    Triton's own launch runs ours' kernel: it is not timed again."""
    flush, rows = l2_flush(), []
    for out_features, in_features, dtype in KERNEL_SHAPES:
        layer = make_layer(out_features, in_features, dtype)
        n = out_features * in_features
        ceiling = min(((1024, 4), (2048, 4), (4096, 8), (8192, 8)),  # (bytes per program, warps)
                      key=lambda c: gpu_time(ceiling_launch(n, *c), calls=30, flush=flush).median_us)
        timed = {name: (lambda fn=fn: fn(layer)) for name, fn in methods.items() if name != "ours_via_triton"}
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


# A T4, emulated on this GPU ---------------------------------------------------------------------
# A T4's device-to-device copy, bytes read + written (as device_copy_gbs counts them): CUDA's bandwidthTest
# measured 239.6 GB/s device to device on a T4. Its datasheet's 320 GB/s is a peak no copy reaches.
T4_COPY_GBS = 240
EMULATION_METHOD = "each call padded to a T4's GPU time for its bytes (torch.cuda._sleep on the current stream)"
EMULATION_ASSUMES = ("the kernels keep on a T4 the gap they have here (a call's GPU time there: its time here plus "
                     f"how much longer a T4 copies its bytes at {T4_COPY_GBS} GB/s), and the host is this machine's")


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
    return quantile(rates, 0.5)


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
               rounds: int = 3, cycles_per_us: float | None = None,
               sleep: Callable[[int], None] = torch.cuda._sleep) -> dict:
    """The procedure (`test_dequantize(methods, reference, rounds)`, the notebook's: the order rotated from round to
    round) on this GPU with every call padded to a T4's GPU time (PaddedToT4); bnb left out where the classic path
    runs its kernels (SAME_KERNELS). Returns how (`what`, cycles_per_us, the padding per case), each method's
    seconds per round (round_seconds) and median, each baseline's ratio to ours (the median over the rounds) and
    its min - max, and each method's spread over the rounds (max / min - 1): the padding is the same in every
    round, so what spreads is this host's time per call."""
    cycles_per_us = cycles_per_us or sleep_cycles_per_us()
    launched_by_another = {same for twin, same in SAME_KERNELS.items() if twin in methods}
    padded = {name: PaddedToT4(method, copy_gbs, cycles_per_us, sleep)
              for name, method in methods.items() if name not in launched_by_another}
    result = test_dequantize(padded, reference, rounds=rounds)
    pad_us = [t4_pad_us(hd * m, dtype, copy_gbs) for _, _, hd, m, _, dtype in PROCEDURE_CASES]
    ratios = {name: round_ratios(result, name) for name in result if name in BASELINES}
    return {"what": EMULATION_METHOD, "cycles_per_us": cycles_per_us, "pad_us": pad_us, "rounds": rounds,
            "round_seconds": {name: r["runs_s"] for name, r in result.items()},
            "seconds": {name: r["median_s"] for name, r in result.items()},
            "ratios": {name: ratio["median"] for name, ratio in ratios.items()},
            "ratio_range": {name: [ratio["min"], ratio["max"]] for name, ratio in ratios.items()},
            "spread": {name: r["max_s"] / r["min_s"] - 1 for name, r in result.items()}}


# The launch configuration, picked on this GPU ----------------------------------------------------------------
# The GPU models (torch.cuda.get_device_name) each LAUNCH_CONFIGS entry was measured on: the models whose results
# folders the paste unit's comment names (tests/test_tooling_config_pick.py holds the two together). An entry
# measured on other models (the T4's: sm_75 builds timed on Hopper, never on a T4) or DEFAULT_CONFIG is picked here.
CONFIG_MEASURED_ON = {
    (9, 0): ("NVIDIA H200", "NVIDIA H100 80GB HBM3"),
    (7, 5): (),
}
# What a pick times beside the table's entry, (weights per program, warps, lookup, evict-first). A T4: the
# candidates benchmarks/t4_code.py times and tests/test_t4_gpu.py checks as sm_75 builds (its T4_CANDIDATES).
# Elsewhere: the fastest on the procedure's three weights in the H100's and H200's sweeps (results/<gpu>/sweep.json).
PICK_CANDIDATES = {
    (7, 5): ((4096, 4, 1, True), (2048, 4, 1, True), (8192, 4, 1, True), (8192, 8, 1, True), (4096, 4, 1, False),
             (4096, 4, 0, True)),
}
OTHER_CANDIDATES = ((2048, 4, 1, False), (2048, 4, 1, True), (1024, 2, 1, False), (4096, 8, 1, False),
                    (2048, 2, 0, False), (4096, 4, 0, True))
PICK_ROUNDS = 2  # rounds over the candidates, the order rotated: a T4 throttles, so candidates interleave
PICK_CALLS = 10  # GPU-timed calls of a candidate per weight and round
LOOKUP_NAMES = {0: "L1", 1: "gathered"}  # LaunchConfig.lookup
PICK_METHOD = (
    "each candidate launched by the paste unit's launch_via_triton on one weight per procedure case (its gate "
    "weight: up, gate and down hold as many weights in one dtype, so they run one compiled kernel on one grid), "
    "checked bit for bit (torch.equal) against bitsandbytes, then the exact ones timed by GPU time (gpu_samples, "
    "L2 flushed; median per weight over the rounds); the winner: the least total over the weights, a tie the "
    "table's entry")


def config_measured_here(capability: tuple, gpu_name: str, launch_configs: dict) -> bool:
    """Whether launch_configs (the paste unit's LAUNCH_CONFIGS) holds an entry for `capability` that was measured on
    this GPU model (CONFIG_MEASURED_ON). DEFAULT_CONFIG, where no entry is, was measured on no GPU in particular."""
    return capability in launch_configs and gpu_name in CONFIG_MEASURED_ON.get(capability, ())


def table_entry(cells: dict, capability: tuple) -> tuple:
    """What the paste unit launches with on `capability` without an override, and its name:
    (LAUNCH_CONFIGS[capability], 'LAUNCH_CONFIGS[(7, 5)]') or (DEFAULT_CONFIG, 'DEFAULT_CONFIG')."""
    if capability in cells["LAUNCH_CONFIGS"]:
        return cells["LAUNCH_CONFIGS"][capability], f"LAUNCH_CONFIGS[{capability}]"
    return cells["DEFAULT_CONFIG"], "DEFAULT_CONFIG"


def launch_candidates(cells: dict, capability: tuple) -> list:
    """The configurations a pick times on a GPU of `capability`, as the paste unit's LaunchConfig: the table's entry
    first, then PICK_CANDIDATES' (OTHER_CANDIDATES for a capability it does not list), each once."""
    entry, _ = table_entry(cells, capability)
    candidates = [entry]
    for fields in PICK_CANDIDATES.get(capability, OTHER_CANDIDATES):
        config = cells["LaunchConfig"](*fields)
        if config not in candidates:
            candidates.append(config)
    return candidates


def describe_config(fields: Sequence) -> str:
    """A LaunchConfig or its fields as words: (2048, 4, 1, True) -> '2048 w, 4 warps, gathered, evict-first'."""
    weights, warps, lookup, evict_first = tuple(fields)[:4]
    text = f"{weights} w, {warps} warps, {LOOKUP_NAMES.get(lookup, lookup)}"
    if evict_first:
        text += ", evict-first"
    if len(fields) > 4 and not fields[4]:
        text += ", no PTX"
    return text


def pick_layers(device: str = "cuda") -> list:
    """One layer per procedure case, in its order: the case's gate layer (make_layer with the case's seed draws what
    build_case draws first)."""
    return [make_layer(m, hd, dtype, device=device, seed=seed) for _, _, hd, m, seed, dtype in PROCEDURE_CASES]


def measure_candidates(cells: dict, candidates: Sequence, capability: tuple, layers: Sequence,
                       rounds: int = PICK_ROUNDS, calls: int = PICK_CALLS) -> tuple[list[dict], dict]:
    """Each candidate on each layer's weight, launched by the paste unit's launch_via_triton with the candidate
    (CONFIG_OVERRIDE untouched). First checked: one launch into an output of 0xFF bytes (NaN), torch.equal to
    bitsandbytes_bits; this builds the candidate. Then the exact ones timed: `rounds` rounds, the candidates' order
    rotated each round, of gpu_samples(`calls`) per weight. Returns per candidate its fields, exactness and median GPU
    µs per weight and their total (None where not exact), and the cost: counts and seconds of the check and timing."""
    launch = cells["launch_via_triton"]
    layouts = [cells["validate"](layer.weight, layer.weight.quant_state) for layer in layers]
    references = [bitsandbytes_bits(layer) for layer in layers]
    outputs = [torch.empty_like(reference) for reference in references]
    started = time.perf_counter()
    exact = {}
    for config in candidates:
        exact[config] = []
        for layout, out, reference in zip(layouts, outputs, references):
            out.view(torch.uint8).fill_(0xFF)  # every value must be written
            launch(layout, out, config, capability)
            exact[config].append(torch.equal(out, reference))
    checked = time.perf_counter()
    timed = [config for config in candidates if all(exact[config])]
    samples = {config: [[] for _ in layouts] for config in timed}
    flush = l2_flush()
    for round_index in range(rounds):
        shift = round_index % max(len(timed), 1)
        for config in timed[shift:] + timed[:shift]:
            for weight, (layout, out) in enumerate(zip(layouts, outputs)):
                call = functools.partial(launch, layout, out, config, capability)
                samples[config][weight] += gpu_samples(call, calls, flush)[0]
    finished = time.perf_counter()
    results = []
    for config in candidates:
        gpu_us = None
        if config in samples:
            gpu_us = [quantile(times, 0.5) for times in samples[config]]
        results.append({"config": list(config), "label": describe_config(config), "exact": exact[config],
                        "gpu_us": gpu_us, "total_us": None if gpu_us is None else sum(gpu_us)})
    dtypes = {layout.dtype for layout in layouts}
    cost = {"builds_at_most": len(candidates) * len(dtypes), "checked_launches": len(candidates) * len(layouts),
            "timed_launches": len(timed) * len(layouts) * rounds * (3 + calls),
            "profiler_sessions": len(timed) * len(layouts) * rounds,
            "check_s": checked - started, "timing_s": finished - checked}
    return results, cost


def pick_winner(candidates: Sequence[dict]) -> int:
    """The winner's index among measured candidates (the table's entry first): the least total GPU time over the
    weights among the bit-exact ones; a tie goes to the earlier, so to the entry. An error where none is exact."""
    best = None
    for index, candidate in enumerate(candidates):
        if not all(candidate["exact"]):
            continue
        if best is None or candidate["total_us"] < candidates[best]["total_us"]:
            best = index
    if best is None:
        raise RuntimeError("no candidate launch configuration gives bitsandbytes' bits on this GPU")
    return best


def use_launch_config(cells: dict, config) -> None:
    """config as every later launch's: the paste unit's CONFIG_OVERRIDE. The plans of weights called before keep the
    configuration they were made with, so they are dropped: each such weight's next call validates and plans again."""
    cells["CONFIG_OVERRIDE"] = config
    plans = cells.get("_plans")
    if plans is not None:
        plans.clear()


def this_gpu(cells: dict) -> tuple[str, tuple]:
    """The current GPU's model name and its capability as the paste unit reads it (its device_capability)."""
    device = torch.device("cuda", torch.cuda.current_device())
    return torch.cuda.get_device_name(device), cells["device_capability"](device)


def pick_launch_config(cells: dict, gpu: bool, rounds: int = PICK_ROUNDS, calls: int = PICK_CALLS) -> dict:
    """The launch configuration for this GPU, in `cells` (the kernel cells' namespace: the notebook's globals(), or
    vars() of the module benchmarks/cells.py loads). Without a GPU, or where LAUNCH_CONFIGS' entry was measured on this
    GPU model (config_measured_here), nothing is timed or set. Elsewhere the candidates (launch_candidates) are
    measured on the procedure's weights (pick_layers, measure_candidates) and the winner (pick_winner) becomes
    CONFIG_OVERRIDE (use_launch_config). Returns notebook.json's launch_config_pick: gpu (its model, None without
    one), capability, picked, table_entry (its name), replaced (the entry's fields), winner (the fields that run);
    where picked: entry_slower, weights, candidates (fields, label, exact and gpu_us per weight, total_us), cost.

    Cost on a T4 (at most 30 s asked), by default: builds, each candidate in each of the weights' dtypes: 6 x 2 = 12
    at most, 10 in the notebook (its correctness cell built the entry's); 18 checked launches and 3 bitsandbytes
    dequantizations; 6 x 3 x 2 x (3 + 10) = 468 timed launches, each after an L2 flush, in 36 profiler sessions.
    Forecast from an H100 (capability patched to 7.5 so the T4's candidates build, TRITON_CACHE_DIR a new folder so
    nothing comes from the disk cache): a build is host work (Triton, LLVM, ptxas), about the same for sm_75 and
    sm_90, so a T4's check takes cost's check_s x 10 / builds x h, h the host's slowness (Colab's, unmeasured: 1-3
    as hosts vary); the timing, cost's timing_s x h (there nearly all host: launches, profiler sessions, the
    process's first of which starts CUPTI: measure in a fresh process, as the notebook's is its first) plus
    the T4's GPU work: per candidate and round 13 calls of each weight at call_bytes / T4_COPY_GBS (176 + 44 +
    615 µs) and 39 flushes of 32 MiB (140 µs each), 16 ms; 12 of them, 0.2 s."""
    if not gpu:
        return {"what": PICK_METHOD, "gpu": None, "capability": None, "picked": False}
    gpu_name, capability = this_gpu(cells)
    entry, entry_name = table_entry(cells, capability)
    pick = {"what": PICK_METHOD, "gpu": gpu_name, "capability": list(capability), "table_entry": entry_name,
            "replaced": list(entry), "winner": list(entry), "picked": False}
    if config_measured_here(capability, gpu_name, cells["LAUNCH_CONFIGS"]):
        return pick
    candidates = launch_candidates(cells, capability)
    layers = pick_layers()
    results, cost = measure_candidates(cells, candidates, capability, layers, rounds, calls)
    best = pick_winner(results)
    use_launch_config(cells, candidates[best])
    entry_slower = None  # the entry's total over the winner's, less 1; None where the entry is not exact
    if all(results[0]["exact"]):  # launch_candidates puts the entry first
        entry_slower = results[0]["total_us"] / results[best]["total_us"] - 1
    weights = [f"{m}x{hd} {dtype_name(dtype)}" for _, _, hd, m, _, dtype in PROCEDURE_CASES]
    pick.update(picked=True, winner=list(candidates[best]), entry_slower=entry_slower, weights=weights,
                candidates=results, cost=cost)
    return pick


def launch_config_line(pick: dict) -> str:
    """One line for the T4 section (pick: pick_launch_config's): which configuration ran and where it was picked."""
    if pick["gpu"] is None:
        return "Launch configuration: none picked without a GPU (the interpreter runs DEFAULT_CONFIG); nothing timed."
    entry = f"{pick['table_entry']} ({describe_config(pick['replaced'])})"
    if not pick["picked"]:
        return f"Launch configuration: {entry}, measured on this GPU model ({pick['gpu']}): not re-picked."
    where = f"picked on this {pick['gpu']} from {len(pick['candidates'])} candidates"
    if pick["winner"] == pick["replaced"]:
        return f"Launch configuration: {entry}, {where}: the table's entry was the fastest."
    if pick["entry_slower"] is None:
        verdict = "was not bit-exact"
    else:
        verdict = f"was {pick['entry_slower']:.1%} slower"
    return f"Launch configuration: {describe_config(pick['winner'])}, {where}; the table's {entry} {verdict}."


# how each clock the notebook's run uses measures: in its result file (host_time is benchmarks.host_cost's)
MEASUREMENT = {"kernel": GPU_TIME_METHOD, "procedure": PROCEDURE_METHOD, "split": CALL_SPLIT_METHOD}

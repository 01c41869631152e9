"""The clocks: GPU time is the GPU's (kernel durations, not the host's time around a call), host
time is the host's, and the procedure's time splits into the two; one flush buffer per device, and
torch.compile's report leaves the user's compiled functions alone. CPU tests use synthetic
profiler events; GPU tests time work whose duration is known."""
import time
import types

import numpy
import pytest
import torch

import helpers
import timing
from timing import DeviceEvent, FLUSH_KERNEL


def _busy_wait(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


# ---------------------------------------------------------------------------------------------
# CPU: the logic, on synthetic data
# ---------------------------------------------------------------------------------------------
def test_calls_between_flushes_groups_each_calls_gpu_operations():
    flush = lambda t: DeviceEvent(t, t + 30.0, FLUSH_KERNEL)
    kernel = lambda t, d, name="k": DeviceEvent(t, t + d, name)
    events = [kernel(0.0, 5.0, "before the first flush"),
              flush(10.0), kernel(41.0, 2.0, "absmax"), kernel(44.0, 1.5, "offset"), kernel(47.0, 9.0, "weights"),
              flush(60.0), kernel(91.0, 12.5, "fused"),
              flush(110.0), kernel(150.0, 4.0, "after the last flush")]
    calls = timing.calls_between_flushes(reversed(events))  # any order: sorted by start
    assert [[e.name for e in call] for call in calls] == [["absmax", "offset", "weights"], ["fused"]]
    assert [sum(e.end_us - e.start_us for e in call) for call in calls] == [2.0 + 1.5 + 9.0, 12.5]


def test_a_call_that_launched_nothing_is_an_error():
    events = [DeviceEvent(0.0, 1.0, FLUSH_KERNEL), DeviceEvent(2.0, 3.0, FLUSH_KERNEL),
              DeviceEvent(4.0, 5.0, "k"), DeviceEvent(6.0, 7.0, FLUSH_KERNEL)]
    with pytest.raises(ValueError, match="no GPU work"):
        timing.calls_between_flushes(events)


def test_timing_statistics_are_numpys_percentiles():
    samples = list(numpy.random.default_rng(3).gamma(2.0, 5.0, size=137))
    measured = timing.Timing.of(samples, kernels=3)
    assert measured.median_us == pytest.approx(numpy.percentile(samples, 50))
    assert measured.p20_us == pytest.approx(numpy.percentile(samples, 20))
    assert measured.p80_us == pytest.approx(numpy.percentile(samples, 80))
    assert (measured.samples, measured.kernels) == (137, 3)
    assert measured.gbs(2e6) == pytest.approx(2e6 / (measured.median_us * 1e-6) / 1e9)


def test_host_time_measures_the_host():
    measured = timing.host_time(lambda: _busy_wait(200e-6), calls=50)
    assert 200 <= measured.median_us < 2000
    assert measured.p20_us <= measured.median_us <= measured.p80_us


class FakeMachine:
    """A clock that moves only when work is done, for add_call_split without a GPU: a method's call takes its
    issue time (times the layer's `scale`) on the host and leaves its wait for the next synchronize; its GPU
    operation, of the method's GPU duration, is recorded for the fake profiler."""

    def __init__(self):
        self.now = 0.0
        self.pending_wait = 0.0
        self.events = []
        self.calls = {}

    def clock(self):
        return self.now

    def synchronize(self):
        self.now += self.pending_wait
        self.pending_wait = 0.0

    def profile(self, work):
        first = len(self.events)
        work()
        return self.events[first:]

    def method(self, name, issue_s, wait_s, gpu_us, hiccup_call=None):
        """A dequantize; its call number `hiccup_call` (0 = the first, warm-up included) takes 1 s longer."""
        self.calls[name] = 0

        def dequantize(layer):
            number = self.calls[name]
            self.calls[name] += 1
            self.now += issue_s * layer.scale + (1.0 if number == hiccup_call else 0.0)
            self.pending_wait = wait_s
            self.events.append(DeviceEvent(0.0, gpu_us, name))
            return torch.empty(2, 3)

        return dequantize


def test_the_call_split_adds_up_and_keeps_gpu_time_beside():
    machine = FakeMachine()
    built = []

    def build_case(*case):
        built.append(case)
        factor = len(built)  # the cases' calls take 1x, 2x, 3x as long on the host
        layers = {name: types.SimpleNamespace(scale=factor * s) for name, s in (("up", 1), ("gate", 1), ("down", 4))}
        mlp = types.SimpleNamespace(up_proj=layers["up"], gate_proj=layers["gate"], down_proj=layers["down"])
        return mlp, None

    iterations, rounds = 4, 3
    # ours: a call of the first timed round (after the untimed warm-up's iterations, 3 calls each) takes 1 s more:
    # not the median
    warm_up = timing.SPLIT_WARM_UP
    methods = {"ours": machine.method("ours", 10e-6, 5e-6, gpu_us=1000.0, hiccup_call=warm_up * 3),
               "bnb": machine.method("bnb", 30e-6, 2e-6, gpu_us=7.0)}
    procedure = {name: {"median_s": 1.0, "cases": [{"calls": 3000} for _ in helpers.PROCEDURE_CASES]}
                 for name in methods}
    timing.add_call_split(procedure, methods, build_case, rounds=rounds, iterations=iterations,
                           synchronize=machine.synchronize, clock=machine.clock, profile=machine.profile)
    assert built == list(helpers.PROCEDURE_CASES)
    for name, issue_us, wait_us, gpu_us in (("ours", 10.0, 5.0, 1000.0), ("bnb", 30.0, 2.0, 7.0)):
        for factor, case in enumerate(procedure[name]["cases"], start=1):
            assert case["wall_us"] == case["issue_us"] + case["wait_us"]  # exactly, in the stored numbers
            # a call's issue, times the layers' scales (1, 1, 4: a mean of 2), the case's factor
            assert case["issue_us"] == pytest.approx(issue_us * 2 * factor, rel=1e-9)
            assert case["wait_us"] == pytest.approx(wait_us, rel=1e-9)
            assert case["gpu_us"] == gpu_us and case["gpu_kernels"] == 1.0  # beside the sum: ours' GPU time > wall
            assert (case["split_calls"], case["split_rounds"], case["calls"]) == (3 * iterations, rounds, 3000)
    assert procedure["ours"]["cases"][0]["wall_us"] < procedure["ours"]["cases"][0]["gpu_us"]
    # each method: the warm-up's iterations, `rounds` timed and 1 profiled, per case, 3 calls each
    assert machine.calls == {name: 3 * 3 * (warm_up + rounds * iterations + iterations) for name in methods}


def test_timed_calls_runs_the_procedures_loop_in_its_order():
    order, machine = [], FakeMachine()
    layers = [types.SimpleNamespace(scale=1, name=name) for name in ("up", "gate", "down")]

    def dequantize(layer):
        order.append(layer.name)
        machine.now += 3e-6
        machine.pending_wait = 1e-6
        return torch.empty(2, 3)

    issue_s, wait_s = timing.timed_calls(dequantize, layers, 2, machine.synchronize, machine.clock)
    assert order == ["up", "gate", "down"] * 2
    assert issue_s == pytest.approx(6 * 3e-6) and wait_s == pytest.approx(6 * 1e-6)
    assert machine.now == pytest.approx(issue_s + wait_s)


def _quant_layer(out_features, in_features, dtype):
    state = types.SimpleNamespace(shape=torch.Size((out_features, in_features)), dtype=dtype)
    return types.SimpleNamespace(weight=types.SimpleNamespace(quant_state=state))


def test_the_emulation_pads_each_call_by_its_bytes_alike_for_every_method():
    slept, run = [], []
    seconds_per_case = {"ours": 1.0, "unsloth_fused": 1.25, "unsloth_classic": 1.5, "bnb": 2.0}

    def test_dequantize(methods, reference, rounds):
        run.append(list(methods))
        seconds = {}
        for name, method in methods.items():
            for _, _, hd, m, _, dtype in helpers.PROCEDURE_CASES:
                assert method(_quant_layer(m, hd, dtype)) == name  # the method's own result, passed on
            seconds[name] = [[seconds_per_case[name]] * rounds for _ in helpers.PROCEDURE_CASES]
        return helpers.procedure_result(seconds, iterations=1000)

    methods = {name: (lambda layer, name=name: name) for name in seconds_per_case}
    emulated = timing.emulate_t4(test_dequantize, methods, None, copy_gbs=480.0, rounds=2, cycles_per_us=1000.0,
                                  sleep=slept.append)
    assert run == [["ours", "unsloth_fused", "unsloth_classic"]]  # bnb: the classic path runs its kernels
    # 8192x2048 fp16: 8388608 packed + 262144 absmax + 33554432 written + 4096 absmax2 bytes = 42209280; at
    # 240 GB/s minus at 480 GB/s: 42209280 / 480e3 µs = 87.936 µs, x 1000 cycles per µs
    assert slept[0] == 87936
    n_bytes = [helpers.call_bytes(hd * m, dtype) for _, _, hd, m, _, dtype in helpers.PROCEDURE_CASES]
    assert emulated["pad_us"] == pytest.approx([b / 480e3 for b in n_bytes])
    assert slept == [round(b / 480e3 * 1000) for b in n_bytes] * 3  # the same padding for every method
    assert emulated["seconds"] == pytest.approx({"ours": 3.0, "unsloth_fused": 3.75, "unsloth_classic": 4.5})
    assert emulated["ratios"] == pytest.approx({"unsloth_fused": 1.25, "unsloth_classic": 1.5})
    assert emulated["rounds"] == 2 and emulated["what"] == timing.EMULATION_METHOD
    # each method's seconds round by round, the ratio's range over the rounds, each method's spread
    assert {name: list(map(round, s, [2] * 2)) for name, s in emulated["round_seconds"].items()} == {
        "ours": [3.0, 3.0], "unsloth_fused": [3.75, 3.75], "unsloth_classic": [4.5, 4.5]}
    assert {name: [round(r, 2) for r in range_] for name, range_ in emulated["ratio_range"].items()} == {
        "unsloth_fused": [1.25, 1.25], "unsloth_classic": [1.5, 1.5]}
    assert emulated["spread"] == pytest.approx({"ours": 0.0, "unsloth_fused": 0.0, "unsloth_classic": 0.0})
    assert timing.t4_pad_us(1 << 20, torch.float16, copy_gbs=200.0) == 0.0  # no faster than a T4: no padding


def test_a_t4_is_known_by_its_capability_or_its_name():
    assert helpers.is_t4({"gpu": "Tesla T4", "capability": "7.5"})
    assert helpers.is_t4({"gpu": "Some GPU", "capability": "7.5"})
    assert not helpers.is_t4({"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0"})
    assert not helpers.is_t4({"gpu": "none (CPU, TRITON_INTERPRET=1)", "capability": None})


def test_procedure_result_sums_each_round_over_the_cases():
    # seconds[method][case][round]; the speedup is taken round by round, not from the medians
    seconds = {"ours": [[1.0, 2.0, 1.0], [0.5, 0.5, 0.7], [2.0, 2.0, 2.0]],
               "bnb": [[3.0, 3.0, 3.3], [1.0, 1.5, 1.0], [6.0, 5.0, 6.0]]}
    result = helpers.procedure_result(seconds, iterations=10, scale=16)
    assert result["ours"]["runs_s"] == [3.5, 4.5, 3.7] and result["bnb"]["runs_s"] == [10.0, 9.5, 10.3]
    assert (result["ours"]["median_s"], result["ours"]["min_s"], result["ours"]["max_s"]) == (3.7, 3.5, 4.5)
    assert [c["weight"] for c in result["ours"]["cases"]] == ["512x128", "256x64", "896x256"]
    assert [c["case"] for c in result["bnb"]["cases"]] == ["2x208, 128->512", "5x48, 64->256", "3x128, 256->896"]
    assert [c["median_s"] for c in result["bnb"]["cases"]] == [3.0, 1.0, 6.0]
    assert all(c["calls"] == 30 and c["procedure_us"] == pytest.approx(c["median_s"] / 30 * 1e6)
               for c in result["bnb"]["cases"])
    ratios = helpers.round_ratios(result, "bnb")
    assert ratios == {"median": pytest.approx(10.3 / 3.7), "min": pytest.approx(9.5 / 4.5),
                      "max": pytest.approx(10 / 3.5), "rounds": 3}
    assert ratios["median"] != pytest.approx(result["bnb"]["median_s"] / result["ours"]["median_s"])


def test_the_procedures_bytes_are_601_gb():
    # per call n/2 packed bytes, n/64 absmax codes, 4 bytes of absmax2 per 16384 weights, 2n written
    expected = sum(3000 * (hd * m / 2 + hd * m / 64 + 4 * hd * m / 16384 + 2 * hd * m)
                   for _, _, hd, m, _, _ in helpers.PROCEDURE_CASES)
    assert helpers.procedure_bytes() == pytest.approx(expected, rel=1e-9)
    assert round(helpers.procedure_bytes() / 1e9) == 601
    assert timing.T4_COPY_GBS == 240  # a T4's device-to-device copy (CUDA's bandwidthTest: 239.6 GB/s)
    assert round(helpers.procedure_bytes() / 1e9 / timing.T4_COPY_GBS, 2) == 2.51


def test_the_floor_and_each_methods_multiple_of_it(tmp_path):
    import report
    from tooling_data import procedure
    result = procedure()
    text = report.format_floor(result, helpers.procedure_bytes(), 4000.0)
    floor_s = helpers.procedure_bytes() / 1e9 / 4000.0
    flat = " ".join(text.split())
    assert f"601 GB / 4000 GB/s = {floor_s:.3f} s" in flat and "601 GB / 240 GB/s = 2.51 s" in flat
    for name, r in result.items():  # each method's median beside its multiple of the floor
        assert f"{helpers.METHODS[name].column} {r['median_s']:.3f} s ({r['median_s'] / floor_s:.2f}x)" in flat
    without_gpu = report.format_floor(None, helpers.procedure_bytes(), None)
    assert "|" not in without_gpu and "601 GB / 240 GB/s = 2.51 s" in " ".join(without_gpu.split())
    assert max(map(len, (text + "\n" + without_gpu).splitlines())) <= helpers.MAX_LINE


@pytest.fixture(scope="module")
def procedure_cell():
    from benchmarks.cells import load_procedure_cell
    return load_procedure_cell()


def _bnb(layer):
    import bitsandbytes.functional as bnbf
    return bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)


def test_the_procedure_cell_builds_a_case_as_the_procedure_does(procedure_cell):
    from transformers import set_seed
    case = helpers.PROCEDURE_CASES[1]
    torch.set_default_dtype(torch.float64)
    try:
        mlp, X = procedure_cell.build_case(*case, scale=16)
        assert torch.get_default_dtype() == torch.float32  # the procedure sets it, per case
        # the same seed, the layers built first, then X: the procedure's order of random draws
        set_seed(case[4])
        again = helpers.MLP(case[2] // 16, case[3] // 16, case[5], procedure_cell.DEVICE)
        X_again = torch.randn(case[0], case[1] // 16, case[2] // 16, dtype=case[5], device=procedure_cell.DEVICE)
        assert torch.equal(X, X_again)
    finally:
        torch.set_default_dtype(torch.float32)
    assert [tuple(layer.weight.quant_state.shape) for layer in mlp.layers()] == [(256, 64), (256, 64), (64, 256)]
    for layer, other in zip(mlp.layers(), again.layers()):
        assert torch.equal(layer.weight, other.weight)


def test_the_procedure_cell_times_every_method_in_rotated_rounds(procedure_cell):
    order = []
    methods = {name: (lambda layer, name=name: order.append(name) or _bnb(layer)) for name in ("a", "b", "c")}
    result = procedure_cell.test_dequantize(methods, _bnb, rounds=3, iterations=1, scale=16)
    assert set(result) == {"a", "b", "c"} and all(len(r["runs_s"]) == 3 for r in result.values())
    assert [c["weight"] for c in result["a"]["cases"]] == ["512x128", "256x64", "896x256"]
    # per case: two warm-up rounds of 3 weights each method, then the rounds, each method's 3 calls in turn
    timed = [name for i, name in enumerate(order) if i % (2 * 3 * 3 + 3 * 3 * 3) >= 2 * 3 * 3]
    assert timed[::3][:9] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_the_procedure_cell_warm_up_rejects_a_wrong_weight(procedure_cell):
    mlp, X = procedure_cell.build_case(*helpers.PROCEDURE_CASES[0], scale=16)
    procedure_cell.warm_up(_bnb, _bnb, mlp, X, torch.float16)  # the reference passes its own checks
    with pytest.raises(AssertionError):
        procedure_cell.warm_up(lambda layer: _bnb(layer) * 1.01, _bnb, mlp, X, torch.float16)
    with pytest.raises(AssertionError):  # the weight itself, not transposed: its strides differ
        procedure_cell.warm_up(lambda layer: _bnb(layer).t().contiguous().t(), _bnb, mlp, X, torch.float16)


# ---------------------------------------------------------------------------------------------
# GPU: work of known duration
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_time_is_kernel_time_not_host_time():
    buffer = torch.empty(1 << 22, device="cuda")
    kernel = lambda: buffer.fill_(1.0)

    def slow_host_then_kernel():
        _busy_wait(200e-6)  # longer than the L2 flush before the call: the GPU idles, waiting
        kernel()

    alone = timing.gpu_time(kernel, calls=50)
    slowed = timing.gpu_time(slow_host_then_kernel, calls=50)
    assert alone.kernels == slowed.kernels == 1
    assert abs(slowed.median_us - alone.median_us) <= 0.2 * alone.median_us + 1.0
    # the premise: CUDA events around the call (what do_bench does) count the host's 200 us
    flush = timing.l2_flush()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush()
    start.record()
    slow_host_then_kernel()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) * 1e3 > 150


@pytest.mark.gpu
def test_gpu_time_sums_every_kernel_of_a_call():
    small, large = torch.empty(1 << 20, device="cuda"), torch.empty(1 << 24, device="cuda")
    first, second = timing.gpu_time(lambda: small.fill_(1.0)), timing.gpu_time(lambda: large.fill_(2.0))

    def two_kernels_with_a_host_gap():
        small.fill_(1.0)
        _busy_wait(100e-6)  # the GPU idles between the two: not GPU time
        large.fill_(2.0)

    both = timing.gpu_time(two_kernels_with_a_host_gap)
    assert both.kernels == 2
    expected = first.median_us + second.median_us
    assert abs(both.median_us - expected) <= 0.1 * expected + 1.0


@pytest.mark.gpu
def test_host_time_does_not_wait_for_the_gpu():
    gpu_busy = lambda: torch.cuda._sleep(5_000_000)  # millions of GPU cycles: milliseconds
    assert timing.gpu_time(gpu_busy, calls=10).median_us > 1000
    assert timing.host_time(gpu_busy, calls=50).median_us < 500


def _captured(work):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
        work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph


def _replay_us(graph):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _graph_time_us(fn, calls=20):
    """A second clock for GPU time: graphs of `calls` (L2 flush, call) pairs and of `calls` flushes replayed in
    turn, timed by CUDA events; the median of their differences over `calls` (it counts launch gaps too)."""
    flush = timing.l2_flush()

    def calls_and_flushes():
        for _ in range(calls):
            flush()
            fn()

    def flushes():
        for _ in range(calls):
            flush()

    with_calls, flushes_only = _captured(calls_and_flushes), _captured(flushes)
    samples = [(_replay_us(with_calls) - _replay_us(flushes_only)) / calls for _ in range(11)]
    return sorted(samples[1:])[5]  # the first replay uploads the graph


@pytest.mark.gpu
def test_graph_replay_cross_check_sees_the_same_kernel():
    buffer = torch.empty(1 << 24, device="cuda")
    kernel = lambda: buffer.fill_(1.0)
    gpu, graph_us = timing.gpu_time(kernel), _graph_time_us(kernel)
    assert 0.8 * gpu.median_us <= graph_us <= 1.5 * gpu.median_us + 5.0  # plus launch gaps


@pytest.mark.gpu
def test_every_method_agrees_with_a_second_profiler_reading(kernel):
    # The acceptance check of the GPU-time table at one shape: the per-call median against the
    # profiler's plain total over another run of flushed calls (no split into calls), within 5%.
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    flush = timing.l2_flush()
    for name, method in helpers.dequantizers(kernel.triton_dequantize_nf4)[0].items():
        measured = timing.gpu_time(lambda: method(layer), calls=100, flush=flush)

        def flushed_calls():
            for _ in range(100):
                flush()
                method(layer)

        events = timing._profiled(flushed_calls)
        mean = sum(e.end_us - e.start_us for e in events if FLUSH_KERNEL not in e.name) / 100
        assert abs(mean / measured.median_us - 1) <= 0.05, (name, measured, mean)
        assert measured.kernels == (1 if name in ("ours", "unsloth_fused") else 3), (name, measured.kernels)


@pytest.mark.gpu
def test_the_procedure_split_on_the_gpu(kernel):
    import bitsandbytes.functional as bnbf
    methods = {"ours": kernel.triton_dequantize_nf4,
               "bnb": lambda layer: bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)}
    from benchmarks.cells import load_procedure_cell
    cell = load_procedure_cell()
    procedure = cell.test_dequantize(methods, methods["bnb"], rounds=1, iterations=20, scale=4)
    timing.add_call_split(procedure, methods, lambda *case: cell.build_case(*case, scale=4), rounds=3,
                           iterations=10)
    for case in procedure["ours"]["cases"]:
        assert case["gpu_kernels"] == 1.0 and 0 < case["gpu_us"] < case["wall_us"]
        assert case["wall_us"] == case["issue_us"] + case["wait_us"] and case["issue_us"] > 0 < case["wait_us"]
    assert all(case["gpu_kernels"] == 3.0 for case in procedure["bnb"]["cases"])


@pytest.mark.gpu
def test_the_padding_adds_a_t4s_gpu_time_on_the_current_stream():
    # one 8192x2048 fp16 call padded to a T4's time for its bytes: its GPU time (CUPTI) grows by the padding
    layer = helpers.make_layer(8192, 2048, torch.float16)
    copy_gbs = timing.device_copy_gbs()
    padded = timing.PaddedToT4(_bnb, copy_gbs, timing.sleep_cycles_per_us())
    pad_us = timing.t4_pad_us(8192 * 2048, torch.float16, copy_gbs)
    alone = timing.gpu_time(lambda: _bnb(layer), calls=20).median_us
    with_pad = timing.gpu_time(lambda: padded(layer), calls=20).median_us
    assert pad_us > 0 and abs(with_pad - alone - pad_us) <= 0.15 * pad_us + 2.0


@pytest.mark.gpu
def test_one_flush_buffer_per_device_on_the_current_device():
    flush = timing.l2_flush()
    assert timing.l2_flush() is flush and flush.device == torch.cuda.current_device()
    assert flush.buffer.device == torch.device("cuda", torch.cuda.current_device())
    assert helpers.environment()["device"] == torch.cuda.current_device()


@pytest.mark.gpu
def test_compile_report_leaves_the_users_compiled_functions_alone(kernel):
    # torch.compiler.reset() would drop the user's compiled function: its next call would compile again
    from torch._dynamo.utils import counters
    users = torch.compile(lambda x: torch.sin(x) * 2, fullgraph=True)
    x = torch.randn(64, device="cuda")
    users(x)
    report = helpers.compile_report(kernel.triton_dequantize_nf4, (torch.float16,), hd=256, m=512)
    graphs = counters["stats"]["unique_graphs"]
    users(x)
    assert counters["stats"]["unique_graphs"] == graphs, "the user's compiled function was dropped"
    fp16 = report["dtypes"]["torch.float16"]
    assert fp16["compiled"] and fp16["weights_bit_identical"] and not fp16["recompiled"]
    assert fp16["mlp_bit_identical_to_eager_with_emulate_precision_casts"]
    # a second report compiles afresh: the same answers
    again = helpers.compile_report(kernel.triton_dequantize_nf4, (torch.float16,), hd=256, m=512)
    assert again["dtypes"]["torch.float16"] == fp16

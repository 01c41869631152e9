"""The clocks: GPU time is the GPU's (kernel durations, not the host's time around a call), host
time is the host's, and the procedure's time splits into the two; one flush buffer per device, and
torch.compile's report leaves the user's compiled functions alone. CPU tests use synthetic
profiler events; GPU tests time work whose duration is known."""
import time

import numpy
import pytest
import torch

import helpers
from helpers import DeviceEvent, FLUSH_KERNEL


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
    calls = helpers.calls_between_flushes(reversed(events))  # any order: sorted by start
    assert [[e.name for e in call] for call in calls] == [["absmax", "offset", "weights"], ["fused"]]
    assert [sum(e.end_us - e.start_us for e in call) for call in calls] == [2.0 + 1.5 + 9.0, 12.5]


def test_a_call_that_launched_nothing_is_an_error():
    events = [DeviceEvent(0.0, 1.0, FLUSH_KERNEL), DeviceEvent(2.0, 3.0, FLUSH_KERNEL),
              DeviceEvent(4.0, 5.0, "k"), DeviceEvent(6.0, 7.0, FLUSH_KERNEL)]
    with pytest.raises(ValueError, match="no GPU work"):
        helpers.calls_between_flushes(events)


def test_timing_statistics_are_numpys_percentiles():
    samples = list(numpy.random.default_rng(3).gamma(2.0, 5.0, size=137))
    timing = helpers.Timing.of(samples, kernels=3)
    assert timing.median_us == pytest.approx(numpy.percentile(samples, 50))
    assert timing.p20_us == pytest.approx(numpy.percentile(samples, 20))
    assert timing.p80_us == pytest.approx(numpy.percentile(samples, 80))
    assert (timing.samples, timing.kernels) == (137, 3)
    assert timing.gbs(2e6) == pytest.approx(2e6 / (timing.median_us * 1e-6) / 1e9)


def test_host_time_measures_the_host():
    timing = helpers.host_time(lambda: _busy_wait(200e-6), calls=50)
    assert 200 <= timing.median_us < 2000
    assert timing.p20_us <= timing.median_us <= timing.p80_us


def _case(calls, wall, gpu, host):
    return {"case": f"case {calls}", "weight": "64x32", "dtype": "float16", "calls": calls,
            "median_s": wall * calls / 1e6, "wall_us": wall, "gpu_us": gpu, "host_us": host}


def test_time_split_and_the_saving_per_call():
    # two cases of different lengths: the saving is weighted by calls
    ours = [(3000, 30.0, 12.0, 9.0), (1000, 20.0, 4.0, 8.0)]
    fused = [(3000, 60.0, 13.0, 45.0), (1000, 50.0, 5.0, 44.0)]
    procedure = {"ours": {"median_s": 0.1, "cases": [_case(*c) for c in ours]},
                 "unsloth_fused": {"median_s": 0.2, "cases": [_case(*c) for c in fused]}}
    rows = helpers.time_split(procedure)
    assert [(r["method"], r["rest_us"]) for r in rows] == [
        ("ours", 30.0 - 12.0 - 9.0), ("ours", 20.0 - 4.0 - 8.0),
        ("unsloth_fused", 60.0 - 13.0 - 45.0), ("unsloth_fused", 50.0 - 5.0 - 44.0)]
    split = helpers.saved_per_call(procedure, "unsloth_fused")
    calls = 3000 + 1000
    assert split["saved_us"] == pytest.approx((3000 * (60 - 30) + 1000 * (50 - 20)) / calls)
    assert split["kernel_us"] == pytest.approx((3000 * (13 - 12) + 1000 * (5 - 4)) / calls)
    assert split["launch_path_us"] == pytest.approx(split["saved_us"] - split["kernel_us"])


def test_results_without_the_split_have_none():
    procedure = {"ours": {"median_s": 0.3}, "bnb": {"median_s": 0.7}}
    assert helpers.time_split(procedure) == []
    assert helpers.saved_per_call(procedure, "bnb") is None


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
    assert all(c["calls"] == 30 and c["wall_us"] == pytest.approx(c["median_s"] / 30 * 1e6)
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
    assert round(helpers.procedure_bytes() / 1e9 / helpers.T4_COPY_GBS, 2) == 1.88


def test_the_floor_table(tmp_path):
    import report
    from tooling_data import procedure
    result = procedure()
    text = report.format_floor(result, helpers.procedure_bytes(), 4000.0)
    floor_s = helpers.procedure_bytes() / 1e9 / 4000.0
    flat = " ".join(text.split())
    assert f"601 GB / 4000 GB/s = {floor_s:.3f} s" in flat and "601 GB / 320 GB/s = 1.88 s" in flat
    for name, r in result.items():
        assert f"| {helpers.METHODS[name].column} | {r['median_s']:.3f} | {r['median_s'] / floor_s:.2f}x |" in text
    without_gpu = report.format_floor(None, helpers.procedure_bytes(), None)
    assert "|" not in without_gpu and "601 GB / 320 GB/s = 1.88 s" in " ".join(without_gpu.split())
    assert max(map(len, (text + "\n" + without_gpu).splitlines())) <= helpers.MAX_LINE


@pytest.fixture(scope="module")
def procedure_cell():
    from kernel_cells import load_procedure_cell
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
        again = helpers.MLP(case[2] // 16, case[3] // 16, case[5], "cpu")
        assert torch.equal(X, torch.randn(case[0], case[1] // 16, case[2] // 16, dtype=case[5]))
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

    alone = helpers.gpu_time(kernel, calls=50)
    slowed = helpers.gpu_time(slow_host_then_kernel, calls=50)
    assert alone.kernels == slowed.kernels == 1
    assert abs(slowed.median_us - alone.median_us) <= 0.2 * alone.median_us + 1.0
    # the premise: CUDA events around the call (what do_bench does) count the host's 200 us
    flush = helpers.l2_flush()
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
    first, second = helpers.gpu_time(lambda: small.fill_(1.0)), helpers.gpu_time(lambda: large.fill_(2.0))

    def two_kernels_with_a_host_gap():
        small.fill_(1.0)
        _busy_wait(100e-6)  # the GPU idles between the two: not GPU time
        large.fill_(2.0)

    both = helpers.gpu_time(two_kernels_with_a_host_gap)
    assert both.kernels == 2
    expected = first.median_us + second.median_us
    assert abs(both.median_us - expected) <= 0.1 * expected + 1.0


@pytest.mark.gpu
def test_host_time_does_not_wait_for_the_gpu():
    gpu_busy = lambda: torch.cuda._sleep(5_000_000)  # millions of GPU cycles: milliseconds
    assert helpers.gpu_time(gpu_busy, calls=10).median_us > 1000
    assert helpers.host_time(gpu_busy, calls=50).median_us < 500


@pytest.mark.gpu
def test_graph_replay_cross_check_sees_the_same_kernel():
    import benchmark
    buffer = torch.empty(1 << 24, device="cuda")
    kernel = lambda: buffer.fill_(1.0)
    gpu, graph = helpers.gpu_time(kernel), benchmark.graph_time(kernel)
    assert graph is not None
    assert 0.8 * gpu.median_us <= graph.median_us <= 1.5 * gpu.median_us + 5.0  # plus launch gaps


@pytest.mark.gpu
def test_every_method_agrees_with_a_second_profiler_reading(kernel):
    # The acceptance check of the GPU-time table at one shape: the per-call median against the
    # profiler's plain total over the same kind of run (benchmark.py --verify), within 5%.
    import benchmark
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    flush = helpers.l2_flush()
    for name, method in helpers.dequantizers(kernel.triton_dequantize_nf4)[0].items():
        timing = helpers.gpu_time(lambda: method(layer), calls=100, flush=flush)
        mean = benchmark.profiled_mean_us(lambda: method(layer), calls=100, flush=flush)
        assert abs(mean / timing.median_us - 1) <= 0.05, (name, timing, mean)
        assert timing.kernels == (1 if name in ("ours", "unsloth_fused") else 3), (name, timing.kernels)


@pytest.mark.gpu
def test_the_procedure_split_on_the_gpu(kernel):
    import bitsandbytes.functional as bnbf
    methods = {"ours": kernel.triton_dequantize_nf4,
               "bnb": lambda layer: bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)}
    from kernel_cells import load_procedure_cell
    cell = load_procedure_cell()
    procedure = cell.test_dequantize(methods, methods["bnb"], rounds=1, iterations=20, scale=4)
    helpers.add_splits(procedure, methods, lambda *case: cell.build_case(*case, scale=4))
    for case in procedure["ours"]["cases"]:
        assert case["gpu_kernels"] == 1.0 and 0 < case["gpu_us"] < case["wall_us"]
        assert 0 < case["host_us"] < case["wall_us"]
    assert all(case["gpu_kernels"] == 3.0 for case in procedure["bnb"]["cases"])
    assert len(helpers.time_split(procedure)) == 2 * len(helpers.PROCEDURE_CASES)
    assert helpers.saved_per_call(procedure, "bnb") is not None


@pytest.mark.gpu
def test_cpu_cost_floor_is_a_compiled_launch(kernel):
    table = helpers.cpu_cost_table({"ours": kernel.triton_dequantize_nf4})
    assert table["floor"] == helpers.LAUNCH_REFERENCE_METHOD
    for name in ("ours", "floor", "empty", "triton_launch"):
        assert 0 < table[f"{name}_p20_us"] <= table[f"{name}_us"] <= table[f"{name}_p80_us"]


@pytest.mark.gpu
def test_one_flush_buffer_per_device_on_the_current_device():
    flush = helpers.l2_flush()
    assert helpers.l2_flush() is flush and flush.device == torch.cuda.current_device()
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

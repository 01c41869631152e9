"""Benchmark the notebook's kernel against unsloth's fast_dequantize (fused and classic paths) and
bitsandbytes on the GPU this runs on; print the tables and write results/<gpu>/benchmark.json.

    python benchmark.py              # kernel-only GPU time with a CUDA-graph cross-check, host time
                                     # per call, the procedure and where its time goes
    python benchmark.py --sweep      # also time every configuration in SWEEP: results/<gpu>/sweep.json
    python benchmark.py --verify results/<gpu>/notebook.json
                                     # re-measure that file's kernel table with the profiler
    python benchmark.py --host-cost OLD.ipynb
                                     # host time per call of these cells, of OLD's and of the floor,
                                     # interleaved: results/<gpu>/host_cost.json
    python benchmark.py --headline [results/<gpu>]
                                     # rewrite the README's and the notebook's headline tables

--headline runs anywhere (no GPU).
"""
from __future__ import annotations

import argparse
import copy
import inspect
import itertools
import json
import re
import statistics
import sys
import textwrap
from pathlib import Path

import torch

import helpers
import report

sys.path.insert(0, str(helpers.ROOT / "tests"))
from kernel_cells import NOTEBOOK, load_kernel_cells, load_procedure_cell  # noqa: E402  (tests/: its cells)

# Candidate launch configurations: (weights per program, num_warps, LOOKUP, STREAM), each tried
# for every size. The sweep behind the shipped table: results/<gpu>/sweep.json.
SWEEP = [cfg for cfg in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8), (0, 1), (True, False))
         if cfg[0] // (32 * cfg[1]) >= 8]
README = helpers.ROOT / "README.md"
HEADLINE = re.compile(r"<!-- headline:start (?P<source>\S+) -->\n(?P<body>.*?)<!-- headline:end -->", re.S)
AGREEMENT = 0.05  # --verify: the largest relative difference accepted
GRAPH_TIME_METHOD = ("CUDA-graph replay of (L2 flush, call) x N minus N flushes, CUDA events: counts "
                     "the gaps before and between a call's kernels too")


# ---------------------------------------------------------------------------------------------
# Measuring (GPU)
# ---------------------------------------------------------------------------------------------
def sweep(kernel, capability):
    """GPU time of every SWEEP configuration, each passed explicitly and checked exact."""
    import bitsandbytes.functional as bnbf
    flush = helpers.l2_flush()
    rows, cases = [], []
    for out_features, in_features, dtype in helpers.KERNEL_SHAPES:
        layer = helpers.make_layer(out_features, in_features, dtype)
        layout = kernel.validate(layer.weight, layer.weight.quant_state).layout
        reference = bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
        cases.append((f"{out_features}x{in_features}", layout, reference, torch.empty_like(reference)))
    for config in SWEEP:
        config = kernel.LaunchConfig(*config)
        row = {"config": list(config)}
        for name, layout, reference, out in cases:
            grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, capability)
            launch = lambda: kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)
            launch()
            assert torch.equal(out, reference), config
            row[name] = helpers.gpu_time(launch, calls=30, flush=flush).median_us
        rows.append(row)
        print(row, flush=True)
    return rows


HOST_COST_FLOOR = ("torch.empty of the output plus Triton's C launcher called with the arguments Triton passed it, "
                   "nothing checked (a plan's own recorded launch, allocating with torch.empty)")
FIXED_CALL = ("the compiled launcher's Python entry called directly with the same arguments, nothing checked "
              "(unsloth's triton_launch.py style), allocating with torch.empty_strided as the replay does")
FIRST_CALL = ("a new weight's first call: a QuantState the launch path has not seen, with its own absmax and codebook "
              "tensors (bitsandbytes makes them per weight), its launch's template recorded before (by an earlier weight "
              "of its key): validation, the weight's plan made from the template (its fields watched, a finalizer "
              "on its QuantState), its launch")


def _unchecked(plan, kernel, W, q) -> dict:
    """The floor (HOST_COST_FLOOR), the replay alone and the fixed call (FIXED_CALL), built from W's plan: its own
    allocation and recorded launch, with its checks left out."""
    out = plan(W, q)
    size, stride, dtype, device, gpu = plan.size, plan.stride, plan.dtype, plan.device, plan.gpu

    def launch_into(new):
        plan.launch.into(new, gpu)
        return new

    layout = kernel.validate(W, q).layout
    capability = kernel.device_capability(out.device)
    config = kernel.launch_config(capability)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, capability)
    compiled = kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)
    constants = [constexprs[name] for name in kernel._dequantize_4bit_kernel.arg_names[len(args):]]
    constants = constants if kernel.TRITON_VERSION >= (3, 3) else []  # Triton 3.2's launcher takes no constexprs
    addresses, at = [a.data_ptr() if torch.is_tensor(a) else a for a in args], [a is out for a in args].index(True)
    before, after, grid3 = addresses[:at], [*addresses[at + 1:], *constants], (*grid, 1, 1)[:3]

    def fixed_call():
        new = torch.empty_strided(size, stride, dtype=dtype, device=device)
        stream = torch._C._cuda_getCurrentRawStream(gpu)
        compiled.run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *before, new.data_ptr(), *after)
        return new

    return {"floor": lambda: launch_into(torch.empty(size, dtype=dtype, device=device)),
            "replay": lambda: launch_into(torch.empty_strided(size, stride, dtype=dtype, device=device)),
            "fixed_call": fixed_call}


def _slow_path_parts(kernel, W, q) -> dict:
    """The steps of a call the plans cannot take (dequantize_nf4_via_triton), each timed alone."""
    layout = kernel.validate(W, q).layout
    device = layout.packed.device
    capability = kernel.device_capability(device)
    config = kernel.launch_config(capability)
    out = torch.empty(layout.shape, dtype=layout.dtype, device=device)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, capability)
    return {"part: validate": lambda: kernel.validate(W, q).layout,
            "part: device_capability": lambda: kernel.device_capability(device),
            "part: launch_config + launch_arguments": lambda: kernel.launch_arguments(
                layout, out, kernel.launch_config(capability), capability),
            "part: torch.empty": lambda: torch.empty(layout.shape, dtype=layout.dtype, device=device),
            "part: Triton's launch, kernel[grid](...)": lambda: kernel._dequantize_4bit_kernel[grid](
                *args, **constexprs, **options)}


def host_cost(old_notebook: Path, rounds: int = 45, calls: int = 200) -> dict:
    """Host time per call (helpers.HOST_TIME_METHOD) of triton_dequantize_nf4 from these cells and from
    `old_notebook`'s, of the floor (HOST_COST_FLOOR), of the replay alone (the floor allocating with
    torch.empty_strided, as a plan does), of the fixed call (FIXED_CALL), of a weight's first call (FIRST_CALL),
    of Triton's own launch path (dequantize_nf4_via_triton: what a call the plans cannot take costs), of its
    parts, and of unsloth's fused path, in `rounds` interleaved rounds of `calls`; the median of the round
    medians, on the procedure's first weight. Many short rounds: the GPU machines' hosts switch between a fast
    and a slow mode within seconds, and a long round can catch one method in the other mode."""
    new = load_kernel_cells()
    # an older notebook's cells by their tags then: the paste unit (once split, `fast-launch`) and the model
    # patch cell, which now is model_patch.py (a notebook holding neither loads its `kernel` cells alone)
    old = load_kernel_cells(old_notebook, name="nf4_old_cells", tags=("kernel", "fast-launch", "model-patch"))
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    W, q = layer.weight, layer.weight.quant_state
    for cells in (new, old):
        assert torch.equal(cells.triton_dequantize_nf4(layer), cells.triton_dequantize_nf4(layer))
    methods, skipped = helpers.dequantizers(new.triton_dequantize_nf4)

    fresh = [copy.copy(q) for _ in range(rounds * (calls + 20) + 2)]  # a new weight each, W shared
    for state in fresh:
        state.absmax, state.code = q.absmax.clone(), q.code.clone()
    fresh = iter(fresh)

    timed = {"new": lambda: new.triton_dequantize_nf4(layer), "old": lambda: old.triton_dequantize_nf4(layer),
             **_unchecked(new._plans[new._identity(q)], new, W, q),
             "first_call": lambda: new.dequantize_nf4(W, next(fresh)),
             "via_triton": lambda: new.dequantize_nf4_via_triton(W, q), **_slow_path_parts(new, W, q)}
    if "unsloth_fused" in methods:
        timed["unsloth_fused"] = lambda: methods["unsloth_fused"](layer)
    assert all(torch.equal(timed[name](), timed["old"]()) for name in timed if not name.startswith("part:"))
    samples = {name: [] for name in timed}
    for _ in range(rounds):
        for name, fn in timed.items():
            samples[name].append(helpers.host_time(fn, calls=calls).median_us)
    medians = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    fused = medians.get("unsloth_fused")
    return {"layer": str(helpers.KERNEL_SHAPES[0]), "method": helpers.HOST_TIME_METHOD, "floor": HOST_COST_FLOOR,
            "fixed_call": FIXED_CALL, "first_call": FIRST_CALL,
            "old_notebook": Path(old_notebook).name, "calls_per_round": calls,
            "rounds_us": samples, "median_us": medians, "new_over_floor": medians["new"] / medians["floor"],
            "old_over_floor": medians["old"] / medians["floor"], "new_over_replay": medians["new"] / medians["replay"],
            "fixed_call_over_replay": medians["fixed_call"] / medians["replay"],
            "first_call_over_fused": medians["first_call"] / fused if fused else None,
            "via_triton_over_fused": medians["via_triton"] / fused if fused else None,
            "skipped_baselines": skipped}


def _capture(work) -> "torch.cuda.CUDAGraph":
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


def graph_time(fn, flush: helpers.L2Flush | None = None) -> helpers.Timing | None:
    """GPU time per call by CUDA-graph replay (GRAPH_TIME_METHOD), or None where fn cannot be captured:
    graphs of 20 (flush, call) pairs and of 20 flushes replayed in turn, ten times; each sample is
    their difference over 20."""
    flush, calls = flush or helpers.l2_flush(), 20

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
    samples = [(_replay_us(with_calls) - _replay_us(flushes_only)) / calls for _ in range(11)]
    return helpers.Timing.of(samples[1:])  # the first replay uploads the graph


def _row_calls(row: dict, methods: dict) -> dict:
    """The calls a kernel_table row timed, on the same weight (make_layer's seed) and copy ceiling."""
    out_features, in_features = map(int, row["shape"].split("x"))
    layer = helpers.make_layer(out_features, in_features, getattr(torch, row["dtype"]))
    timed = {name: (lambda fn=fn: fn(layer)) for name, fn in methods.items() if f"{name}_us" in row}
    if "ceiling_config" in row:
        timed["ceiling"] = helpers.ceiling_launch(out_features * in_features, *row["ceiling_config"])
    return timed


def graph_cross_check(rows: list[dict], methods: dict) -> None:
    """Adds `<name>_graph_us` to each kernel_table row: its calls timed by `graph_time` (None where
    capture fails), which counts the gaps before and between a call's kernels too."""
    flush = helpers.l2_flush()
    for row in rows:
        timed = _row_calls(row, methods)
        for name, fn in timed.items():
            graph = graph_time(fn, flush)
            row[f"{name}_graph_us"] = graph.median_us if graph else None
        del timed


def format_graph_check(rows: list[dict], methods: list[str]) -> str:
    """graph_cross_check's times as markdown, a column per method and the copy ceiling."""
    cell = lambda r, n: "no capture" if r[f"{n}_graph_us"] is None else f"{r[f'{n}_graph_us']:.2f}"
    table = report.markdown_table(
        ["weight", *(helpers.METHODS[n].column for n in methods), "copy ceiling"],
        [[f"{r['shape']} {helpers.short_dtype(r['dtype'])}", *(cell(r, n) for n in [*methods, "ceiling"])]
         for r in rows])
    return textwrap.fill(f"Cross-check, µs per call: {GRAPH_TIME_METHOD}.", helpers.MAX_LINE) + "\n\n" + table


def profiled_mean_us(fn, calls: int = 100, flush: helpers.L2Flush | None = None) -> float:
    """A second reading of GPU time, for checking `helpers.gpu_time`: every non-flush GPU operation
    of another profiled run of `calls` flushed calls, summed, over `calls` (no split into calls)."""
    events = helpers.profiled_calls(fn, calls, flush or helpers.l2_flush())
    return sum(e.end_us - e.start_us for e in events if helpers.FLUSH_KERNEL not in e.name) / calls


def verify(path: Path, methods: dict) -> bool:
    """Re-measure every method and shape of a results file's kernel table (and its ceiling) with
    `profiled_mean_us`, a profiler reading that does not split calls; print both and return
    whether all agree within AGREEMENT."""
    rows = json.loads(Path(path).read_text())["kernel"]
    flush = helpers.l2_flush()
    agree = True
    print(f"{'shape':>16} {'method':>16} {'file':>9} {'profiler':>9} {'diff':>7}")
    for row in rows:
        timed = _row_calls(row, methods)
        for name, fn in timed.items():
            measured = profiled_mean_us(fn, calls=100, flush=flush)
            difference = measured / row[f"{name}_us"] - 1
            agree &= abs(difference) <= AGREEMENT
            print(f"{row['shape'] + ' ' + helpers.short_dtype(row['dtype']):>16} {name:>16} "
                  f"{row[f'{name}_us']:>9.2f} {measured:>9.2f} {difference:>+7.1%}")
        del timed
    return agree


# ---------------------------------------------------------------------------------------------
# The headline tables of the README and the notebook, from a results directory
# ---------------------------------------------------------------------------------------------
def _ratio(base: float, ours: float, bold: bool = False) -> str:
    text = f"{base / ours:.2f}x"
    return f"**{text}**" if bold else text


def _speedup(procedure: dict, baseline: str) -> str:
    """'**2.51x** (2.31–2.70x over 5 rounds)': the median of the rounds' ratios, bold, and their range."""
    median, _, rest = report.format_ratio(helpers.round_ratios(procedure, baseline)).partition(" ")
    return f"**{median}** {rest}"


def _load(directory: Path, name: str) -> dict | None:
    path = helpers.ROOT / directory / name
    return json.loads(path.read_text()) if path.exists() else None


def _measured_on(env: dict) -> str:
    return (f"**{env['gpu']}** (driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
            f"bitsandbytes {env['bitsandbytes']}, unsloth {env['unsloth']}), {env['date']}")


def _kernel_method(results: dict) -> str:
    if "measurement" in results:
        samples = results["kernel"][0].get("ours_samples")
        return ("GPU time per call (CUPTI kernel durations via torch.profiler, L2 flushed before each "
                f"call), median of {samples} calls")
    return ("`triton.testing.do_bench` (CUDA events around the Python call), median: measured before "
            "this project timed kernels by GPU time, so host time can leak in where a method's host "
            "cost is longer than the L2 flush before it")


def _summary(results: dict, source: str) -> list[str]:
    """What a reader needs first, from a notebook run's results: where and when, the score, the procedure's speedup,
    the kernel's ratios against the copy kernel, and what a T4 should give (a forecast, labelled as one)."""
    env, procedure, rows = results["environment"], results["procedure"], results["kernel"]
    baselines = [m for m in helpers.BASELINES if m in procedure]
    score = results.get("score")
    facts = f"**Reference run** (the outputs committed here; `{source}/notebook.json`): {_measured_on(env)}."
    if score:
        facts += f" Score card {score['total']} / {score['max']}; Run all took {score['run_all_s'] / 60:.1f} minutes."
    if "peak_memory_gib" in results:
        facts += f" Peak GPU memory allocated: {results['peak_memory_gib']:.2f} GiB (a T4 has 15 GiB)."
    lines = [facts, ""]
    speedups = [f"{helpers.round_ratios(procedure, b)['median']:.2f}x {helpers.METHODS[b].name}" for b in baselines]
    if speedups:
        speedups[0] = (f"**{report.format_ratio(helpers.round_ratios(procedure, baselines[0]))}** "
                       f"{helpers.METHODS[baselines[0]].name}")
    n_bytes = helpers.procedure_bytes()
    floor = ""
    if results.get("device_copy_gbs"):
        floor = f" (floor {report.floor_arithmetic(n_bytes, results['device_copy_gbs'])})"
    lines.append(f"- The published procedure: ours {procedure['ours']['median_s']:.3f} s{floor}; speedup "
                 + ", ".join(speedups) + ".")
    fused = "unsloth_fused" if "unsloth_fused" in baselines else (baselines[0] if baselines else None)
    if fused and rows:
        ratios = [r[f"{fused}_us"] / r["ours_us"] for r in rows]
        ceiling = [r["ceiling_us"] / r["ours_us"] for r in rows if "ceiling_us" in r]
        lines.append(f"- The kernel alone (GPU time): {min(ratios):.2f}x to {max(ratios):.2f}x "
                     f"{helpers.METHODS[fused].prose}"
                     + (f"; a copy kernel moving the same bytes takes {min(ceiling):.0%} to {max(ceiling):.0%} of "
                        "ours" if ceiling else "") + ".")
    forecast = results.get("t4_forecast")
    if forecast and fused in forecast.get("ratios", {}):
        ratios, seconds = forecast["ratios"][fused], forecast["seconds"]["ours"]
        t4_floor = report.floor_arithmetic(n_bytes, helpers.T4_COPY_GBS, 2)
        line = (f"- **On a T4, a forecast, not a measurement**: ours {min(seconds):.2f}–{max(seconds):.2f} s "
                f"(floor {t4_floor}), "
                f"{min(ratios):.2f}x–{max(ratios):.2f}x {helpers.METHODS[fused].prose} (a host 1–3x slower than "
                "this one)")
        emulated = forecast.get("emulated") or {}
        if emulated.get("ratios", {}).get(fused):
            line += f"; emulated on this GPU with a T4's GPU time per call: {emulated['ratios'][fused]:.2f}x"
        lines.append(line + ". No T4 number is measured here.")
    return lines + [""]


def headline(source: str, where: str) -> str:
    """The headline block (between the markers) for `where`: the notebook's is the summary (_summary); the README's
    goes on with the table, how it was measured, and benchmark.json's, host_cost.json's and model.json's results.
    Made from `source`/notebook.json and the files beside it."""
    results = _load(source, "notebook.json")
    if results is None:
        raise FileNotFoundError(f"{source}/notebook.json")
    if where == "notebook":
        return "\n".join(_summary(results, source)).rstrip("\n") + "\n"
    env, procedure, rows = results["environment"], results["procedure"], results["kernel"]
    baselines = [m for m in helpers.BASELINES if m in procedure]
    methods = ["ours", *baselines]
    runs = len(procedure["ours"]["runs_s"])
    lines = _summary(results, source) + [
             "`python benchmark.py --headline` writes this block from that file. Procedure "
             "speedup: a round's baseline time / ours, the median over the rounds (min–max); in brackets elsewhere: "
             "baseline time / ours.",
             "",
             "| | " + " | ".join(helpers.METHODS[m].name for m in methods) + " |",
             "|---" * (len(methods) + 1) + "|"]
    ours_s = procedure["ours"]["median_s"]
    lines.append(f"| published `test_dequantize` procedure, s (wall clock, median of {runs} rounds), and its "
                 f"speedup | {ours_s:.3f} | "
                 + " | ".join(f"{procedure[b]['median_s']:.3f}, {_speedup(procedure, b)}" for b in baselines) + " |")
    n_bytes, copy_gbs = helpers.procedure_bytes(), results.get("device_copy_gbs")
    if copy_gbs:
        floor_s = n_bytes / 1e9 / copy_gbs
        floor = report.floor_arithmetic(n_bytes, copy_gbs)
        lines.append(f"| the procedure as a multiple of this GPU's floor (its device copy: {floor}) | "
                     + " | ".join(f"{procedure[m]['median_s'] / floor_s:.2f}x" for m in methods) + " |")
    if all(_has_split(procedure[m]) for m in methods):
        means = [report.mean_split(procedure[m]["cases"]) for m in methods]
        lines.append("| one call in the procedure's loop, µs: wall = issue + wait (GPU time beside, not in the sum) | "
                     + " | ".join(f"{s['wall_us']:.1f} = {s['issue_us']:.1f} + {s['wait_us']:.1f} "
                                  f"(GPU {s['gpu_us']:.1f})" for s in means) + " |")
    forecast = results.get("t4_forecast")
    if forecast:
        lines += _forecast_rows(forecast, methods)
    cost = results.get("cpu_cost", {})
    if all(f"{m}_us" in cost for m in methods):
        lines.append("| host time to issue one call, µs (reference, no lower bound: `torch.empty` + one launch of a "
                     f"trivial compiled kernel, {cost['floor_us']:.1f}) | "
                     + " | ".join(f"{cost[f'{m}_us']:.1f}" for m in methods) + " |")
    for r in rows:
        lines.append(f"| kernel only, {r['shape']} {helpers.short_dtype(r['dtype'])}, µs | {r['ours_us']:.1f} | "
                     + " | ".join(f"{r[f'{b}_us']:.1f} ({_ratio(r[f'{b}_us'], r['ours_us'])})" for b in baselines)
                     + " |")
    calls = sum(case["calls"] for case in procedure["ours"].get("cases", [])) or 9000
    lines += ["", f"Procedure: {helpers.PROCEDURE_METHOD} ({calls} calls). Kernel rows: {_kernel_method(results)}."]
    fused = "unsloth_fused" if "unsloth_fused" in baselines else (baselines[0] if baselines else None)
    ratio_sentence = ""
    if fused:
        kernel_ratios = [r[f"{fused}_us"] / r["ours_us"] for r in rows]
        sentence = (f"On this GPU the procedure ratio against {helpers.METHODS[fused].prose} is "
                    f"{report.format_ratio(helpers.round_ratios(procedure, fused))}, its kernel ratios "
                    f"{min(kernel_ratios):.2f}x to {max(kernel_ratios):.2f}x")
        saved = report.saved_split(procedure, fused)
        if saved:
            sentence += (f": of the {saved['wall_us']:.1f} µs saved per call in the procedure's loop, "
                         f"{saved['issue_us']:.1f} µs is issue (the call until it returns) and "
                         f"{saved['wait_us']:.1f} µs wait (inside synchronize); GPU time saved, beside: "
                         f"{saved['gpu_us']:.1f} µs (see *Where the time goes*)")
        ratio_sentence = sentence + "."
    t4_sentences = []
    if not helpers.is_t4(env):
        t4_sentences.append(
            f"What a T4 should give: the procedure moves {n_bytes / 1e9:.0f} GB, so at a T4's {helpers.T4_COPY_GBS} "
            f"GB/s ({report.T4_COPY_SOURCE}) it takes at least "
            f"{report.floor_arithmetic(n_bytes, helpers.T4_COPY_GBS, 2)} whatever the kernel (arithmetic, not a "
            "measurement), and "
            f"the host time of its {calls} synchronized calls adds on top.")
    if forecast:
        t4_sentences.append(_forecast_sentence(forecast))
    for paragraph in (ratio_sentence, " ".join(t4_sentences)):
        if paragraph:
            lines += ["", paragraph]
    lines += _benchmark_paragraph(source) + _model_paragraph(source)
    return "\n".join(lines) + "\n"


def _has_split(result: dict) -> bool:
    """Whether a method's procedure result carries the split of each case (older result files do not)."""
    cases = result.get("cases", [])
    return bool(cases) and all("issue_us" in case for case in cases)


def _forecast_rows(forecast: dict, methods: list[str]) -> list[str]:
    """The headline's T4 forecast row (seconds over the host factors, baseline / ours) and, where it ran, the
    emulation's row; a method the forecast or the emulation lacks gets an empty cell."""
    factors = forecast["inputs"]["host_factors"]
    cells = []
    for name in methods:
        seconds, ratios = forecast["seconds"].get(name), forecast["ratios"].get(name)
        cell = f"{min(seconds):.2f}–{max(seconds):.2f}" if seconds else ""
        cells.append(cell + (f", {min(ratios):.2f}–{max(ratios):.2f}x" if ratios else ""))
    rows = [f"| **T4 forecast, not a measurement**, s: this run's split, GPU time scaled to a T4's copy bandwidth, "
            f"issue time x{factors[0]} to x{factors[-1]}; baseline / ours | " + " | ".join(cells) + " |"]
    emulated = forecast.get("emulated")
    if emulated:
        cells = []
        for name in methods:
            seconds, ratio = emulated["seconds"].get(name), emulated["ratios"].get(name)
            cell = f"{seconds:.2f}" if seconds is not None else ""
            cells.append(cell + (f" ({ratio:.2f}x)" if ratio else ""))
        rows.append(f"| emulated on this GPU, s: the procedure, {emulated['what']} | " + " | ".join(cells) + " |")
    return rows


def _forecast_sentence(forecast: dict) -> str:
    """How the headline's forecast row is made and how far its model is from this GPU's own procedure times."""
    worst = max(abs(error["error"]) for error in forecast["model_error"].values())
    inputs = forecast["inputs"]
    factors = inputs["host_factors"]
    return ("The T4 forecast row is arithmetic on this run's own split (a forecast, never a measurement): per call, "
            f"GPU time x {inputs['gpu_scale']:.2f} (this GPU's copy bandwidth over a T4's), issue time x "
            f"{factors[0]} to {factors[-1]} (Colab's host is slower by a factor not measured), the wait beyond GPU "
            f"time as measured; at this GPU's own bandwidth the same model lands within {worst:.1%} of this run's "
            f"procedure times. {report.T4_PUBLIC_RUNS}")


def _model_paragraph(source: str) -> list[str]:
    """The README's table of model_benchmark.py's results (`source`/model.json), if there are any."""
    results = _load(source, "model.json")
    if results is None:
        return []
    env, models = results["environment"], results["models"]
    lines = ["", f"In a model, `model_patch.use_triton_dequantize(dequantize_nf4)` (`python model_benchmark.py`, "
                 f"`{source}/model.json`, "
                 f"{env['date']}; transformers {env['transformers']}, peft {env['peft']}): "
                 + "; ".join(f"{name}: {info['parameters'] / 1e9:.2f}B parameters, {info['weights_4bit']} "
                             f"4-bit weights" for name, info in models.items())
                 + f". Times: {results['method']['step']}. `saved` is wall-clock time, host time included: "
                 "most of it is the launch path (bitsandbytes' dequantize launches three kernels and runs its "
                 "Python for every weight, ours one direct launch); the dequantize GPU time the kernel itself "
                 "saves is the share column. Single steps at these sizes vary by a few percent from run to run.",
             "",
             "| model | workload | bitsandbytes, ms | ours, ms | saved | dequantize share of the step, "
             "bitsandbytes -> ours | same output |", "|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        share = r["dequantize_share"]
        lines.append(f"| {r['model']} | {r['workload']} | {r['bitsandbytes_ms']:.2f} | {r['triton_ms']:.2f} | "
                     f"{r['saved_ms'] / r['bitsandbytes_ms']:.1%} | {share['bitsandbytes']:.1%} -> "
                     f"{share['triton']:.1%} | {'yes' if r['same_output'] else 'NO'} |")
    return lines


def _benchmark_paragraph(source: str) -> list[str]:
    results, lines = _load(source, "benchmark.json"), []
    if results is not None:
        lines += ["", f"A separate run of `python benchmark.py` on the same machine ({results['environment']['date']}) "
                      f"is linked, not restated here: [`{source}/benchmark.json`]({source}/benchmark.json) holds its "
                      "procedure, kernel-only table (with a CUDA-graph cross-check) and host times."]
    sweep_results = _load(source, "sweep.json")
    if sweep_results is not None:
        lines += ["", f"The launch-configuration sweep behind `LAUNCH_CONFIGS` is `{source}/sweep.json` "
                      f"({sweep_results['environment']['date']})."]
    host = _load(source, "host_cost.json")
    if host is not None:
        table, when = host["host_cost"], host["environment"]["date"]
        us = table["median_us"]
        lines += ["", f"The launch path's host time per call (`python benchmark.py --host-cost`, "
                      f"`{source}/host_cost.json`, {when}; GPU idle before each call): ours {us['new']:.2f} µs "
                      f"against {us['floor']:.2f} µs for `torch.empty` plus Triton's C launcher called with the "
                      f"arguments Triton passed, nothing checked ({table['new_over_floor']:.2f}x; the cells of "
                      f"`{Path(table['old_notebook']).name}` {table['old_over_floor']:.2f}x). The replay alone, "
                      f"allocating with `torch.empty_strided`, takes {us['replay']:.2f} µs: the per-call checks cost "
                      f"ours {table['new_over_replay']:.2f}x that."]
        if "fixed_call" in us:
            lines[-1] += (f" Calling the compiled launcher's Python entry instead of its C launch (unsloth's "
                          f"`triton_launch.py` style; the same allocation, nothing checked) takes "
                          f"{us['fixed_call']:.2f} µs, {table['fixed_call_over_replay']:.2f}x the replay.")
        if table.get("first_call_over_fused"):
            lines[-1] += (f" A new weight's first call (its launch's template recorded by an earlier weight of its "
                          f"kind) costs {us['first_call']:.2f} µs and a call "
                          f"through Triton's own launch {us['via_triton']:.2f} µs, against {us['unsloth_fused']:.2f}"
                          f" µs for unsloth's fused path ({table['first_call_over_fused']:.2f}x and "
                          f"{table['via_triton_over_fused']:.2f}x).")
            rounds = table["rounds_us"]
            paired = sorted(a / b for a, b in zip(rounds["first_call"], rounds["unsloth_fused"]))
            lines[-1] += (f" Round by round the first call is {statistics.median(paired):.2f}x the fused path's "
                          f"time in the same round (median; below 1 in {sum(r < 1 for r in paired)} of "
                          f"{len(paired)} rounds): the margin is small beside this host's noise.")
    return lines


def headline_targets() -> dict[str, Path]:
    return {"readme": README, "notebook": NOTEBOOK}


def _headline_text(where: str) -> str:
    if where == "readme":
        return README.read_text()
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def current_headline(where: str) -> tuple[str, str]:
    """(source, body) between the headline markers in the README or the notebook's first
    markdown cell; LookupError when the markers are missing."""
    match = HEADLINE.search(_headline_text(where))
    if match is None:
        raise LookupError(f"no <!-- headline:start SOURCE --> ... <!-- headline:end --> in the {where}")
    return match["source"], match["body"]


def _replace(text: str, source: str, where: str) -> str:
    if HEADLINE.search(text) is None:
        raise LookupError(f"no <!-- headline:start SOURCE --> ... <!-- headline:end --> in the {where}")
    block = f"<!-- headline:start {source} -->\n{headline(source, where)}<!-- headline:end -->"
    return HEADLINE.sub(lambda _: block, text, count=1)


def write_headline(source: str | None = None) -> list[str]:
    """Rewrite the headline blocks of the README and the notebook's first markdown cell from
    `source`, a results directory in this repository (default: the one their markers name).
    Nothing is written unless both have their markers. Returns what was rewritten."""
    if source:
        path = (Path.cwd() / source).resolve()
        if helpers.ROOT not in path.parents:
            raise LookupError(f"{source} is not a results directory of this repository")
        source = path.relative_to(helpers.ROOT).as_posix()
    readme = _replace(README.read_text(), source or current_headline("readme")[0], "readme")
    notebook = json.loads(NOTEBOOK.read_text())
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "markdown")
    cell["source"] = _replace("".join(cell["source"]), source or current_headline("notebook")[0],
                              "notebook").splitlines(True)
    README.write_text(readme)
    NOTEBOOK.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return [helpers.shown_path(README), helpers.shown_path(NOTEBOOK)]


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="time every launch configuration too")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the published procedure")
    parser.add_argument("--headline", nargs="?", const="", metavar="RESULTS_DIR",
                        help="rewrite the README's and the notebook's headline tables from results")
    parser.add_argument("--verify", metavar="RESULTS_JSON", help="re-measure a kernel table with the profiler")
    parser.add_argument("--host-cost", metavar="OLD_NOTEBOOK", type=Path,
                        help="host time per call of these kernel cells, of OLD_NOTEBOOK's and of the floor")
    args = parser.parse_args(argv)
    try:
        if args.headline is not None:
            for path in write_headline(args.headline or None):
                print("wrote", path)
            return
    except (LookupError, FileNotFoundError) as error:
        sys.exit(f"benchmark.py: {error}")
    if not torch.cuda.is_available():
        sys.exit("benchmark.py needs a CUDA GPU (the notebook runs without one, in CPU mode)")

    if args.host_cost:
        env, table = helpers.environment(), host_cost(args.host_cost)
        print({name: round(us, 2) for name, us in table["median_us"].items()},
              f"new/floor {table['new_over_floor']:.3f}, old/floor {table['old_over_floor']:.3f}, "
              f"new/replay {table['new_over_replay']:.3f}, fixed call/replay {table['fixed_call_over_replay']:.3f}")
        print("wrote", helpers.write_results(helpers.results_dir(env) / "host_cost.json", env, host_cost=table))
        return
    kernel = load_kernel_cells()
    methods, skipped = helpers.dequantizers(kernel.triton_dequantize_nf4)
    layers = [helpers.make_layer(*shape) for shape in helpers.KERNEL_SHAPES[:2]]
    methods = helpers.usable(methods, {**skipped, **helpers.check_baselines(methods, methods["bnb"], layers)})
    del layers
    if args.verify:
        ok = verify(Path(args.verify), methods)
        print(f"all within {AGREEMENT:.0%}" if ok else f"NOT all within {AGREEMENT:.0%}")
        sys.exit(0 if ok else 1)

    env = helpers.environment()
    env["baselines"] = {name: helpers.METHODS[name].calls for name in methods if name != "ours"}
    print({k: v for k, v in env.items() if k != "baselines"})
    print("methods:", list(methods))
    capability = torch.cuda.get_device_capability()
    tables = {"launch_configs": kernel.LAUNCH_CONFIGS.get(capability)}
    if args.sweep:
        tables["sweep"] = sweep(kernel, capability)
    tables["kernel"] = helpers.kernel_table(methods)
    graph_cross_check(tables["kernel"], methods)
    tables["measurement"] = {**helpers.MEASUREMENT, "graph": GRAPH_TIME_METHOD}
    tables["device_copy_gbs"] = helpers.device_copy_gbs()
    tables["cpu_cost"] = helpers.cpu_cost_table(methods)
    reference = methods.get("unsloth_fused", methods["bnb"])
    procedure_cell = load_procedure_cell()  # the notebook's procedure, run as the notebook runs it
    tables["procedure"] = procedure_cell.test_dequantize(methods, reference, rounds=args.rounds)
    helpers.add_call_split(tables["procedure"], methods, procedure_cell.build_case)
    tables["t4_forecast"] = helpers.t4_forecast(tables["procedure"], tables["device_copy_gbs"])
    if not helpers.is_t4(env):
        tables["t4_forecast"]["emulated"] = helpers.emulate_t4(procedure_cell.test_dequantize, methods, reference,
                                                               tables["device_copy_gbs"], rounds=3)

    print(report.format_kernel_table(tables["kernel"], list(methods)))
    print(format_graph_check(tables["kernel"], list(methods)))
    print(f"device-to-device copy: {tables['device_copy_gbs']:.0f} GB/s; peak {env['peak_bandwidth_gbs']} GB/s")
    print(report.format_cpu_cost(tables["cpu_cost"], list(methods)))
    print(report.format_procedure(tables["procedure"]))
    print(report.format_time_split(tables["procedure"]))
    print(report.format_t4_forecast(tables["t4_forecast"], env))
    name = "sweep.json" if args.sweep else "benchmark.json"
    print("wrote", helpers.write_results(helpers.results_dir(env) / name, env, **tables))


if __name__ == "__main__":
    main()

"""How the NF4 notebook shows what helpers.py sets up and timing.py measures, in the order it shows it: the
score card, markdown tables and plots. Fetched beside them; nothing here measures.

  1. Score card and run clock  ScoreCard, RunClock, show, wrap, device_note, speedup_points, speedup_evidence,
                               t4_evidence, single_kernel_evidence
  2. Tables, as markdown       markdown_table, format_ratio, format_procedure, format_floor, format_t4_emulation,
                               format_kernel_table, describe_layer, split_rows, mean_split,
                               format_time_split, format_compile_report
  3. Plots                     plot_procedure, plot_kernel_speedups, plot_bandwidth, plot_time_split;
                               show_figure (with alt text), figure_alt

No printed line or table row is longer than MAX_LINE (Colab wraps longer ones), and no wrapped line
starts with a Markdown block marker ('>', '- ', '1. ', '#'): `wrap` keeps such a word on the line before.
Every plot names the GPU and the versions once, in a one-line subtitle; its text is 9 pt or more at the
size it is saved (at most 9 inches wide, 100 dpi), its legend inside or below the axes.
"""
from __future__ import annotations

import base64
import html
import io
import re
import time
from pathlib import Path
from typing import Iterable, Sequence

from helpers import (BASELINES, MAX_LINE, METHODS, OURS, PROCEDURE_METHOD, SAME_KERNELS, column, dtype_name, is_t4,
                     round_ratios, short_dtype, shown_path, versions_line, wrap)
from timing import EMULATION_ASSUMES, GPU_TIME_METHOD, SPLIT_WARM_UP, T4_COPY_GBS

# 1. Score card and run clock ------------------------------------------------------------------
# The puzzle's marking, in its order: key -> (the criterion and its points, the points it can give).
CRITERIA = {"single_kernel": ("single Triton kernel (+3)", (0, 3)),
            "speedup": ("speedup (-3 to +5)", (-3, 0, 1, 3, 5)),
            "torch_compile": ("works in torch.compile (+1, else -1)", (-1, 1)),
            "asm": ("custom asm that works (+3)", (0, 3)),
            "cache_eviction": ("uses cache eviction (+1)", (0, 1)),
            "fp16_bf16": ("tested in fp16 and bf16 (+1, else -1)", (-1, 1))}
MAX_SCORE = sum(max(points) for _, points in CRITERIA.values())
# What only a GPU can show: without one the card names these instead of a total that would read as a grade
GPU_CRITERIA = ("single_kernel", "speedup", "torch_compile", "asm", "cache_eviction")
GET_A_GPU = "run on a GPU (Colab: Runtime > Change runtime type > T4)"
SPEEDUP_RULE = ("speedup = baseline time / ours over the published procedure; at most 1.00: -3; at least 1.05: +1; "
                "at least 1.10: +3; at least 1.15: +5")
NOT_MEASURED = "not measured yet: a later cell fills this in"


def speedup_evidence(procedure: dict, baseline: str, env: dict) -> str:
    """The score card's speedup line: the ratio the procedure measured, and on which GPU."""
    return (f"{format_ratio(round_ratios(procedure, baseline))} on {env['gpu']}, the procedure vs "
            f"{METHODS[baseline].column}")


def t4_evidence(emulated: dict | None, baseline: str, env: dict) -> str:
    """What a T4 would give, beside the ratio another GPU measured: the emulation ('' on a T4, whose own
    procedure is the measurement, or where it did not run)."""
    if is_t4(env) or not emulated or baseline not in emulated["ratios"]:
        return ""
    low, high = emulated["ratio_range"][baseline]
    return (f"on a T4, not measured: emulated {emulated['ratios'][baseline]:.2f}x ({low:.2f}x - {high:.2f}x over "
            f"{emulated['rounds']} rounds)")


def single_kernel_evidence(rows: Sequence[dict], baseline: str) -> tuple[int, str]:
    """The score card's single-kernel points and line from the kernel table's rows: 3 where ours makes one GPU
    operation per call at every shape (profiler), and its kernel alone against the baseline's."""
    per_call = sorted({r["ours_kernels"] for r in rows})
    ratios = [r[f"{baseline}_us"] / r["ours_us"] for r in rows]
    operations = " or ".join(map(str, per_call))
    return 3 if per_call == [1] else 0, (
        f"{operations} GPU operation per call at every shape (profiler), no buffer but the output; the kernel "
        f"alone {min(ratios):.2f}x to {max(ratios):.2f}x {METHODS[baseline].column}")


PUZZLE_TARGET = 1.15  # the speedup the puzzle asks for


def speedup_points(ratio: float) -> int:
    """The puzzle's points for a speedup (SPEEDUP_RULE)."""
    return -3 if ratio <= 1.0 else sum(p for limit, p in ((1.05, 1), (1.10, 2), (1.15, 2)) if ratio >= limit)


class Shown:
    """Markdown for IPython's display whose text/plain is the same text (IPython's own Markdown saves
    '<IPython.core.display.Markdown object>' as the plain-text fallback a reader without a renderer sees)."""

    def __init__(self, data: str):
        self.data = data

    def _repr_markdown_(self) -> str:
        return self.data

    def __repr__(self) -> str:
        return self.data


def _fit(markdown: str) -> str:
    """Each line longer than MAX_LINE wrapped (`wrap`), but table rows; a list item's lines indented under it."""
    fitted = []
    for line in markdown.split("\n"):
        item = re.match(r"([-*+]|\d{1,9}[.)]) ", line)
        fitted.append(line if line.startswith("|") or len(line) <= MAX_LINE else
                      wrap(line, " " * len(item.group(0)) if item else ""))
    return "\n".join(fitted)


def _notebook_display():
    """IPython's display where a notebook's kernel runs this code, else None."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    return display if get_ipython() is not None else None


def show(markdown: str, display_id: bool = False):
    """Markdown rendered in a notebook (its plain-text fallback the same text), printed elsewhere; lines
    fitted to MAX_LINE (`_fit`). With display_id=True, returns the display's handle for `.update`
    (None outside a notebook)."""
    markdown = _fit(markdown)
    display = _notebook_display()
    if display is None:
        print(markdown)
        return None
    return display(Shown(markdown), display_id=display_id or None)


def device_note(env: dict) -> str:
    """What a reader should know of this GPU before its numbers ('' where nothing): on a GPU without bf16
    instructions (compute capability below 8.0, as a T4), how bf16 is made and what Inductor refuses."""
    capability = tuple(int(part) for part in str(env.get("capability") or "0.0").split("."))
    if env.get("capability") and capability < (8, 0):
        return ("No bf16 instructions on this GPU: Triton converts to bf16 in integer code, and Inductor compiles "
                "no bf16 graphs.")
    return ""


class RunClock:
    """Seconds since the clock was made (the start of Run all), and since its last lap; `laps` keeps each
    lap as (section, seconds it took, Run-all seconds at its end)."""

    def __init__(self):
        self.started = self.lap_started = time.monotonic()
        self.laps: list[tuple[str, float, float]] = []

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def lap(self, section: str) -> None:
        """Prints '<section> took N s; Run all so far M s'; the next section starts now."""
        now = time.monotonic()
        self.laps.append((section, now - self.lap_started, now - self.started))
        print(f"{section} took {self.laps[-1][1]:.1f} s; {self.so_far()}")
        self.lap_started = now

    def so_far(self) -> str:
        """'Run all so far M s', M the last lap's (the figure that lap printed); '' before the first lap."""
        return f"Run all so far {self.laps[-1][2]:.0f} s" if self.laps else ""


class ScoreCard:
    """The puzzle's marking (CRITERIA), filled in by the cells that make the evidence: a table of points
    per criterion and the total, under it this run's evidence for each, whole (wrapped, never cut), and
    the GPU, versions, baseline and Run-all time, each said once. Without a GPU (env's capability None)
    no total: the card scores what runs without one and names the GPU_CRITERIA it could not score.

    One card per notebook, live at the top, its saved output its final state:
        card = report.ScoreCard(env, "unsloth_fused")  # the top cell: names GPU and versions; nothing else need
        card.show()                                    #   print them (device_note(env) is on the card)
        card.set(key, points, evidence) / card.speedup(ratio, evidence)  # later cells: the display updates
        card.lap("Section")    # prints '<Section> took N s; Run all so far M s'; the card shows the same M
        card.show()            # at the end: updates the top display in place, adds no second copy
    Outside a notebook `show()` prints the card each time it is called. The Run-all time on the card is
    always the last lap's, so it never differs from the last lap printed."""

    def __init__(self, env: dict, baseline: str, clock: RunClock | None = None):
        self.env, self.baseline, self.clock = env, baseline, clock or RunClock()
        self.gpu = env.get("capability") is not None  # helpers.environment(): None without a GPU
        self.rows: dict[str, tuple[int, str]] = {}
        self.handle = None  # the notebook display, once shown

    def set(self, key: str, points: int, evidence: str) -> None:
        """Criterion `key` gets `points` (one it can give) and its evidence (one paragraph)."""
        if points not in CRITERIA[key][1]:
            raise ValueError(f"{key} gives one of {CRITERIA[key][1]} points, not {points}")
        self.rows[key] = (points, " ".join(str(evidence).split()))
        self._refresh()

    def add_evidence(self, key: str, evidence: str) -> None:
        """More evidence for a criterion already set, its points unchanged (nothing where evidence is '')."""
        if evidence:
            points, before = self.rows[key]
            self.set(key, points, f"{before}; {evidence}")

    def speedup(self, ratio: float, evidence: str) -> None:
        """The speedup row, its points from `ratio` (baseline time / ours) by SPEEDUP_RULE."""
        self.set("speedup", speedup_points(ratio), f"{ratio:.2f}x; {evidence}")

    def lap(self, section: str) -> None:
        """The clock's lap, and the card's Run-all time brought up to date (the figure the lap printed)."""
        self.clock.lap(section)
        self._refresh()

    def total(self) -> int:
        return sum(points for points, _ in self.rows.values())

    def needs_gpu(self) -> list[str]:
        """The GPU_CRITERIA this run leaves unscored for want of a GPU: none on a GPU."""
        if self.gpu:
            return []
        return [key for key in GPU_CRITERIA if key not in self.rows]

    def markdown(self) -> str:
        """The card: a heading line, versions, baseline and Run-all time, the points table, the evidence
        list, the speedup rule. Without a GPU: no total, and a line naming the criteria that need one
        in place of their rows. Every line at most MAX_LINE; no evidence is cut."""
        unscored = self.needs_gpu()
        shown = [key for key in CRITERIA if key not in unscored]
        table = [[CRITERIA[key][0], f"{self.rows[key][0]:+d}" if key in self.rows else "not yet"] for key in shown]
        evidence = [wrap(f"- **{CRITERIA[key][0]}**: {self.rows[key][1] if key in self.rows else NOT_MEASURED}", "  ")
                    for key in shown]
        if self.gpu:
            heading = f"**Score card, this run ({self.env.get('gpu')}): {self.total()} / {MAX_SCORE}**"
            table.append([f"**total** ({len(self.rows)} of {len(CRITERIA)} measured)",
                          f"**{self.total()} / {MAX_SCORE}**"])
            needs_gpu_line = ""
        else:
            heading = "**Score card, this run: no GPU, so the criteria that need one are not scored**"
            names = ", ".join(CRITERIA[key][0] for key in unscored)
            needs_gpu_line = wrap(f"Needs a GPU, not scored in this run: {names}: {GET_A_GPU}.") if unscored else ""
        speedup_rule = wrap(f"Speedup points: {SPEEDUP_RULE}.") if "speedup" in shown else ""
        baseline = METHODS[self.baseline].name if self.baseline in METHODS else self.baseline
        run_all = f" {self.clock.so_far()} (to the end of {self.clock.laps[-1][0]})." if self.clock.laps else ""
        return "\n\n".join(part for part in [
            heading, wrap(versions_line(self.env, date=False)),
            self.env.get("date", ""), wrap(f"Baseline: {baseline}.{run_all}"), wrap(device_note(self.env)),
            markdown_table(["criterion", "points"], table, "lr"), needs_gpu_line,
            "Evidence from this run:\n\n" + "\n".join(evidence), speedup_rule] if part)

    def show(self) -> None:
        """Displays the card; in a notebook only the first call makes a display, later calls update it."""
        if self.handle is not None:
            return self._refresh()
        self.handle = show(self.markdown(), display_id=True)  # None outside a notebook: printed there

    def _refresh(self):
        if self.handle is not None:
            self.handle.update(Shown(_fit(self.markdown())))

    def as_dict(self) -> dict:
        """For the results file: the points and whole evidence of each criterion filled in, those left
        unscored for want of a GPU (needs_gpu: none on a GPU), and the Run-all time when it was written
        (run_all_s) beside the laps so far."""
        return {"total": self.total(), "max": MAX_SCORE, "baseline": self.baseline, "needs_gpu": self.needs_gpu(),
                "run_all_s": round(self.clock.elapsed_s(), 1),
                "laps": [[section, round(took, 1), round(total, 1)] for section, took, total in self.clock.laps],
                "criteria": {key: {"points": p, "evidence": e} for key, (p, e) in self.rows.items()}}


# 2. Tables, as markdown (shown with `show`; no line longer than MAX_LINE) --------------------
def markdown_table(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> str:
    """A markdown table; `align` has a letter per column, 'l' or 'r' (default: the first column left,
    the others right). Cells are str()ed, '|' escaped."""
    line = lambda cells: "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    rule = "|" + "|".join({"l": ":--", "r": "--:"}[a] for a in align or "l" + "r" * (len(header) - 1)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def _weight(shape: str, dtype, between: str = " ") -> str:
    return f"{shape}{between}{short_dtype(dtype)}"


def format_ratio(ratios: dict) -> str:
    """helpers.round_ratios in one line: '2.51x (2.31–2.70x over 5 rounds)'."""
    if ratios["rounds"] == 1:
        return f"{ratios['median']:.2f}x (1 round)"
    return f"{ratios['median']:.2f}x ({ratios['min']:.2f}–{ratios['max']:.2f}x over {ratios['rounds']} rounds)"


def format_procedure(procedure: dict) -> str:
    """The procedure's table (helpers.procedure_result) as markdown: per method its seconds, the median and
    min - max over the rounds; per baseline the puzzle's speedup, baseline time / ours in each round, as the
    median over the rounds and its min - max."""
    rows = []
    for name, r in procedure.items():
        ratio = round_ratios(procedure, name) if name in BASELINES else None
        rows.append([column(name), f"{r['median_s']:.4f}", f"{r['min_s']:.4f} - {r['max_s']:.4f}",
                     f"{ratio['median']:.2f}x" if ratio else "",
                     f"{ratio['min']:.2f}x - {ratio['max']:.2f}x" if ratio else ""])
    rounds = len(procedure["ours"]["runs_s"])
    return "\n\n".join([wrap(f"The published procedure: {PROCEDURE_METHOD}, summed over its three cases, "
                              f"{rounds} round(s) in rotated order. Speedup: a round's baseline time / ours; its "
                              "median over the rounds is the puzzle's score."),
                        markdown_table(["method", "seconds, median", "min - max", "speedup, median", "min - max"],
                                       rows)])


T4_COPY_SOURCE = "its device-to-device copy by CUDA's bandwidthTest, bytes read + written"


def floor_arithmetic(n_bytes: int, gbs: float, digits: int = 3) -> str:
    """'601 GB / 240 GB/s = 2.51 s' (digits=2): the least time n_bytes take at gbs, as arithmetic to check."""
    return f"{n_bytes / 1e9:.0f} GB / {gbs:.0f} GB/s = {n_bytes / 1e9 / gbs:.{digits}f} s"


def format_floor(procedure: dict | None, n_bytes: int, copy_gbs: float | None) -> str:
    """The procedure's floor on this GPU, `n_bytes` (helpers.procedure_bytes) over its measured copy
    bandwidth `copy_gbs` (read + written), and each method's time as a multiple of it; without a copy
    bandwidth (no GPU) only the bytes and a T4's floor (helpers.T4_COPY_GBS), by arithmetic."""
    t4 = (f"On a T4 ({T4_COPY_GBS} GB/s, {T4_COPY_SOURCE}) the floor is {floor_arithmetic(n_bytes, T4_COPY_GBS, 2)}: "
          "arithmetic, not a measurement.")
    moved = (f"The procedure moves {n_bytes / 1e9:.0f} GB of DRAM traffic: each call reads n/2 packed bytes, "
             "n/64 absmax codes and an absmax2 value per 16384 weights, and writes 2n output bytes.")
    if copy_gbs is None or procedure is None:
        return wrap(f"{moved} {t4}")
    floor_s = n_bytes / 1e9 / copy_gbs
    multiples = ", ".join(f"{column(name)} {r['median_s']:.3f} s ({r['median_s'] / floor_s:.2f}x)"
                          for name, r in procedure.items())
    return wrap(f"{moved} At this GPU's device-to-device copy bandwidth, {copy_gbs:.0f} GB/s (bytes read + written), "
                f"that takes {floor_arithmetic(n_bytes, copy_gbs)} whatever the kernel: the floor. The procedure "
                f"synchronizes after each call, so host time adds on top; each method's median, and its multiple of "
                f"the floor: {multiples}. {t4}")


# Public T4 runs of the procedure, for a reader's bearings: their figures, not this project's measurements
T4_PUBLIC_RUNS = (
    "Public T4 runs of the procedure, for bearings (theirs, not measured here): fast_dequantize took 3.91 s on a "
    "Colab T4 (2026, huseyincavusbi/unsloth_puzzles) and 3.914 s on a Modal T4 (2025-11, "
    "Sohailm25/unsloth_challenges), most likely on its classic path (bitsandbytes' kernels).")


def format_t4_emulation(emulated: dict | None, env: dict) -> str:
    """The T4 estimate: timing.emulate_t4's result (format_emulation) where it ran, on a T4 that the procedure is
    the measurement; then public T4 runs for bearings."""
    parts = []
    if emulated:
        parts.append(format_emulation(emulated, env))
    elif is_t4(env):
        parts.append(wrap("This GPU is a T4: the procedure above is the measurement, so nothing is emulated."))
    parts.append(wrap(T4_PUBLIC_RUNS))
    return "\n\n".join(parts)


def format_emulation(emulated: dict, env: dict) -> str:
    """timing.emulate_t4's result: how, per method its seconds (median of the rounds), per baseline its time / ours
    (median, min - max over the rounds), and what spreads: each method's rounds differ by their host time alone."""
    shown = []
    for name, seconds in emulated["seconds"].items():
        text = f"{column(name)} {seconds:.2f} s"
        if name in emulated["ratios"]:
            low, high = emulated["ratio_range"][name]
            text += f" ({emulated['ratios'][name]:.2f}x, {low:.2f}x - {high:.2f}x)"
        shown.append(text)
    pads = ", ".join(f"{pad:.0f}" for pad in emulated["pad_us"])
    spread = ", ".join(f"{column(name)} {value:.1%}" for name, value in emulated["spread"].items())
    return wrap(f"**Emulated on {env['gpu']}, not measured on a T4**: {emulated['what']}, {pads} µs a call in the "
                f"three cases; the procedure in {emulated['rounds']} rounds, the order rotated, seconds (median) "
                f"and baseline / ours (median, min - max): {', '.join(shown)}. It assumes {EMULATION_ASSUMES}. The "
                f"padding is the same in every round, so the spread between rounds is this host's time per call: "
                f"{spread}.")


def format_kernel_table(rows: Sequence[dict], methods: Sequence[str]) -> str:
    """kernel_table's rows as one markdown table: GPU time per call with baseline / ours, the copy ceiling, and
    ours in GB/s with the copy ceiling's time as a share of ours (each method's GB/s and the calls' spread stay in
    the result file)."""
    kernels = ", ".join(f"{column(n)} {rows[0][f'{n}_kernels']}" for n in methods)
    header = ["weight", *map(column, methods), "copy ceiling", "ours, GB/s", "ceiling / ours"]
    table = []
    for r in rows:
        times = [f"{r[f'{n}_us']:.2f}" + ("" if n in OURS else f" ({r[f'{n}_us'] / r['ours_us']:.2f}x)")
                 for n in methods]
        table.append([_weight(r["shape"], r["dtype"]), *times, f"{r['ceiling_us']:.2f}", f"{r['ours_gbs']:.0f}",
                      f"{r['ceiling_us'] / r['ours_us']:.1%}"])
    return "\n\n".join([
        wrap(f"Kernel only. {GPU_TIME_METHOD}; µs per call, median of {rows[0]['ours_samples']} calls, "
             f"baseline / ours in brackets. GPU operations per call: {kernels}."),
        markdown_table(header, table)])


SPLIT_ROW_KEYS = ("case", "weight", "dtype", "procedure_us", "wall_us", "issue_us", "wait_us", "gpu_us")
SPLIT_AGREES = 0.15  # the split's wall per call within this of the procedure's own time per call


def split_rows(procedure: dict) -> list[dict]:
    """One row per method and case whose case carries helpers.add_call_split's split, cases in order within each
    method: the method and SPLIT_ROW_KEYS. Empty for older results."""
    rows = []
    for method, result in procedure.items():
        for case in result.get("cases", []):
            if "issue_us" not in case:
                continue
            row = {"method": method}
            for key in SPLIT_ROW_KEYS:
                row[key] = case[key]
            rows.append(row)
    return rows


def mean_split(cases: Sequence[dict]) -> dict:
    """A method's split per call over its cases, weighted by their calls: issue_us, wait_us, gpu_us, and
    wall_us = issue_us + wait_us."""
    calls = sum(case["calls"] for case in cases)
    mean = {key: sum(case["calls"] * case[key] for case in cases) / calls for key in ("issue_us", "wait_us", "gpu_us")}
    mean["wall_us"] = mean["issue_us"] + mean["wait_us"]
    return mean


SPLIT_COLUMNS = ("**wall** = **issue** + **wait**; issue: from the call to its return (.t() included); wait: inside "
                 "torch.cuda.synchronize(); **GPU**: the call's kernel durations (CUPTI) in the same loop, which run "
                 "during the issue and the wait: shown apart, not part of the sum")


def format_time_split(procedure: dict) -> str:
    """split_rows as markdown: per case the procedure's own time per call, then wall = issue + wait with GPU time
    beside (SPLIT_COLUMNS), for ours (both launches) and the first baseline measured (the other baselines' rows
    stay in the result file), and whether every method's walls agree with the procedure's times. Empty without
    the split."""
    rows = split_rows(procedure)
    if not rows:
        return ""
    first = next(case for case in procedure["ours"]["cases"] if "issue_us" in case)
    shown = [*OURS, next((name for name in BASELINES if name in procedure), None)]
    table = [[_weight(r["weight"], r["dtype"]), column(r["method"]),
              *(f"{r[key]:.1f}" for key in ("procedure_us", "wall_us", "issue_us", "wait_us", "gpu_us"))]
             for r in rows if r["method"] in shown]
    others = [column(name) for name in procedure if name not in shown]
    apart = [r for r in rows if abs(r["wall_us"] / r["procedure_us"] - 1) > SPLIT_AGREES]
    rounds = (f"per call the mean over the {first['split_calls']} calls of the median round by wall, of "
              f"{first['split_rounds']} rounds")
    agreement = (f"Every wall is within {SPLIT_AGREES:.0%} of the procedure's own time per call." if not apart else
                 f"{len(apart)} of {len(rows)} walls differ from the procedure's own time per call by more than "
                 f"{SPLIT_AGREES:.0%}: the split's loops are shorter ({first['split_calls']} calls a round against "
                 "the procedure's 3000), so the host's speed of the moment weighs more in them.")
    return "\n\n".join([
        wrap(f"One call of the procedure's loop, µs ({rounds}, on the procedure's layers built again, after "
             f"{SPLIT_WARM_UP} untimed iterations): {SPLIT_COLUMNS}. The procedure's own time per call "
             f"(its wall clock over its calls) is shown first. {agreement}"
             + (f" The split of {', '.join(others)}: in the result file." if others else "")),
        markdown_table(["weight", "method", "procedure", "wall", "issue", "wait", "GPU (apart)"], table,
                       "llrrrrr")])


# compile_report's checks (its keys, as in the result files) as a reader names them, in the order shown
COMPILE_CHECKS = {
    "weights_bit_identical": "weights bit-identical to eager's",
    "mlp_bit_identical_to_compiled_mlp_on_eager_weights": "MLP bit-identical to the compiled MLP on eager's weights",
    "mlp_bit_identical_to_eager_with_emulate_precision_casts": "MLP bit-identical to eager, emulate_precision_casts",
    "mlp_bit_identical_to_eager": "MLP bit-identical to eager (Inductor keeps silu(a) * b in fp32: expected no)",
    "mlp_max_abs_diff_to_eager": "MLP's largest absolute difference to eager",
    "mlp_close_to_eager": "MLP close to eager (allclose, atol = rtol = 0.01)",
    "repeats_identical": "repeated calls identical",
    "recompiled": "recompiled"}
COMPILE_NOTE = ("Inductor fuses the MLP's silu(gate) * up and keeps it in fp32, without eager's rounding to the "
                "dtype in between, so its MLP differs from eager's in the last bits (expected); with "
                "emulate_precision_casts it rounds as eager does. The weights, which our kernel makes inside the "
                "graph, are compared bit for bit.")


def format_compile_report(report: dict) -> str:
    """compile_report as markdown: a column per dtype, a row per check (COMPILE_CHECKS' names), after a note
    on why the MLP is not bit-identical to eager's (COMPILE_NOTE)."""
    results = report["dtypes"].values()
    value = lambda v: f"{v:.3g}" if isinstance(v, float) else {True: "yes", False: "no"}.get(v, v)
    found = next((list(r)[1:] for r in results if r["compiled"]), [])
    checks = [c for c in COMPILE_CHECKS if c in found] + [c for c in found if c not in COMPILE_CHECKS]
    rows = [["compiled (fullgraph)", *("yes" if r["compiled"] else f"no: {r['refused_by']} refused, {r['reason']}"
                                       for r in results)]]
    rows += [[COMPILE_CHECKS.get(check, check.replace("_", " ")), *(value(r[check]) if r["compiled"] else ""
                                                                    for r in results)] for check in checks]
    return "\n\n".join([wrap(f"torch.compile on {report['gpu']} (compute capability {report['capability']}; native "
                             f"bf16 for Inductor: {value(report['bf16_native'])}). {COMPILE_NOTE}"),
                        markdown_table(["check", *map(dtype_name, report["dtypes"])], rows, "l" * (len(results) + 1))])


def describe_layer(layer) -> str:
    """What a Linear4bit holds after quantizing: the packed weight and its quant state, a line each."""
    W, qs = layer.weight, layer.weight.quant_state
    out_features, in_features = qs.shape
    return "\n".join([
        f"weight      {tuple(W.shape)} {W.dtype}   ({out_features} x {in_features} weights / 2 per byte)",
        f"absmax      {tuple(qs.absmax.shape)} {qs.absmax.dtype}   blocksize {qs.blocksize}",
        f"state2      absmax {tuple(qs.state2.absmax.shape)} {qs.state2.absmax.dtype}, "
        f"code {tuple(qs.state2.code.shape)}, blocksize {qs.state2.blocksize}",
        f"offset      {qs.offset.item():.6f}    code[:4] {qs.code[:4].tolist()}",
        f"shape {tuple(qs.shape)}, dtype {qs.dtype}, quant_type {qs.quant_type}"])


# 3. Plots (each names the GPU and the versions once, in its subtitle) ----------------------------
def _legend_name(name: str) -> str:
    return METHODS[name].name.replace("`", "") if name in METHODS else name


def _distinct_kernels(names: Sequence[str]) -> list[tuple[str, str]]:
    """(method, legend label) per distinct kernel: where a method and the one whose kernels it launches
    (SAME_KERNELS) were both timed, one series stands for both, with the latter's times."""
    return [(name, _legend_name(name) + "".join(f" / {column(twin)} (same 3 kernels)" for twin, same
                                                in SAME_KERNELS.items() if same == name and twin in names))
            for name in names if SAME_KERNELS.get(name) not in names]


# Every figure is at most FIGURE_WIDTH inches wide, saved at FIGURE_DPI (900 px: GitHub and Colab show it at
# about its own size, not shrunk), its text at least FONT_MIN pt, dark on light.
FIGURE_WIDTH, FIGURE_DPI, FONT_MIN = 9.0, 100, 9


def _bars(ax, groups: int, series: Sequence[tuple[str, list[float]]], fmt: str) -> float:
    """One bar per (label, values) series in each of `groups` groups, its value written dark on a light
    box at its foot, inside the bar, clear of every reference line (they all lie higher). A series of
    ours through Triton's own launch is hatched. Returns the tallest value."""
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(groups)]
        ax.bar(xs, values, width, label=label, alpha=0.85,
               hatch="//" if "Triton's own launch" in label or label.endswith("no fast launch") else None)
        for x, value in zip(xs, values):  # upright where three or more bars share a group: no label touches another
            ax.annotate(fmt % value, (x, 0), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                        fontsize=FONT_MIN, color="black", rotation=90 if len(series) > 2 else 0,
                        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    return max((v for _, values in series for v in values), default=1.0)


def _display_image(png: bytes, alt: str, width_px: int) -> None:
    """A PNG shown with alt text: an <img> for HTML readers (nbconvert, GitHub, Colab), the PNG itself, and the
    alt text as the plain-text fallback; outside a notebook, the alt text printed."""
    display = _notebook_display()
    if display is None:
        print(f"[figure: {alt}]")
        return
    data = base64.b64encode(png).decode()
    tag = f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" width="{width_px}">'
    display({"text/html": tag, "image/png": data, "text/plain": alt}, raw=True)


def figure_alt(fig) -> str:
    """A figure's alt text from its own words: its title (first line) and each axes' title."""
    parts = [fig.get_suptitle().split("\n")[0]] + [ax.get_title() for ax in fig.axes if ax.get_title()]
    return ". ".join(part for part in parts if part)


def show_figure(fig, alt: str | None = None) -> None:
    """A figure shown at the size it was drawn, with alt text (figure_alt unless given), then closed so that
    the notebook shows it once."""
    import matplotlib.pyplot as plt
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI)
    width_px = round(fig.get_figwidth() * FIGURE_DPI)
    _display_image(buffer.getvalue(), alt or figure_alt(fig), width_px)
    plt.close(fig)


def _save(fig, path: Path | None):
    if path is not None:
        fig.savefig(path, dpi=FIGURE_DPI)
    return fig


def _legend_below(fig, axes) -> None:
    """One legend for the figure, under its axes (constrained layout makes room): it covers nothing."""
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=2, frameon=False,
               fontsize=FONT_MIN)


def _finish(fig, ax, what: str, how: str, env: dict, path: Path | None):
    """The title (what) over the environment's one-line subtitle, the method (how) over the axes, the legend
    below them."""
    fig.suptitle(f"{what}\n{versions_line(env, date=False)}", fontsize=11)
    ax.set_title(how, fontsize=FONT_MIN)
    _legend_below(fig, [ax])
    return _save(fig, path)


def _speedup_axes(ax, top: float, labels: Sequence[str], ylabel: str, target: bool = False):
    """A line at 1.0 (as fast as the baseline) and, with `target` (the procedure only: the puzzle sets it
    for the procedure, not for a kernel alone), the puzzle's 1.15x."""
    ax.axhline(1.0, color="black", linewidth=1, label="1.0x: as fast as the baseline")
    if target:
        ax.axhline(1.15, color="tab:red", linestyle="--", linewidth=1.5, label="1.15x: the puzzle's target")
    ax.set_ylim(0, max(top, 1.15 if target else 1.0) * 1.15)
    ax.set_xticks(range(len(labels)), labels, fontsize=FONT_MIN)
    ax.set_ylabel(ylabel)


def plot_procedure(procedure: dict, env: dict, path: Path | None = None):
    """The published procedure's speedup per baseline: the median over the rounds of a round's baseline
    time / ours, its min - max as an error bar and, under each bar, as text; lines at 1.0 and the
    puzzle's 1.15x."""
    import matplotlib.pyplot as plt
    baselines = [name for name in procedure if name in BASELINES]
    ratios = [round_ratios(procedure, b) for b in baselines]
    series = [("baseline time / ours, median of the rounds", [r["median"] for r in ratios])]
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 5), layout="constrained")
    _bars(ax, len(baselines), series, "%.2fx")
    ax.errorbar(range(len(baselines)), [r["median"] for r in ratios], fmt="none", ecolor="black", capsize=6,
                yerr=[[r["median"] - r["min"] for r in ratios], [r["max"] - r["median"] for r in ratios]],
                label="min - max over the rounds")
    _speedup_axes(ax, max(r["max"] for r in ratios),
                  [_legend_name(b).replace(" (", "\n(") + "\n" + format_ratio(r) for b, r in zip(baselines, ratios)],
                  "baseline time / ours", target=True)
    rounds = ratios[0]["rounds"]
    return _finish(fig, ax, "Published test_dequantize procedure",
                   f"{PROCEDURE_METHOD}, {rounds} rounds, methods interleaved", env, path)


def plot_kernel_speedups(rows: Sequence[dict], baselines: Sequence[str], env: dict, path: Path | None = None):
    """Kernel-only speedup of ours over each distinct baseline kernel per shape (baseline GPU time /
    ours), with a line at 1.0; no 1.15x line: the puzzle sets that target for the procedure, not a kernel."""
    import matplotlib.pyplot as plt
    series = [(f"vs {label}", [r[f"{base}_us"] / r["ours_us"] for r in rows])
              for base, label in _distinct_kernels(baselines)]
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 3.4), layout="constrained")
    _speedup_axes(ax, _bars(ax, len(rows), series, "%.2fx"), [_weight(r["shape"], r["dtype"], "\n") for r in rows],
                  "baseline GPU time / ours")
    return _finish(fig, ax, "NF4 dequantize, kernel only", "GPU time (CUPTI kernel durations, L2 flushed), median "
                   f"of {rows[0].get('ours_samples', 'the')} calls", env, path)


def plot_bandwidth(rows: Sequence[dict], methods: Sequence[str], env: dict, copy_gbs: float | None,
                   path: Path | None = None):
    """Achieved GB/s per shape of each distinct kernel; the no-math copy ceiling as a reference mark over
    each shape (not a method); env's datasheet peak and a measured device copy as lines."""
    import matplotlib.pyplot as plt
    series = [(label, [r[f"{name}_gbs"] for r in rows]) for name, label in _distinct_kernels(methods)]
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 5), layout="constrained")
    top = _bars(ax, len(rows), series, "%.0f")
    ceilings = [(j, r["ceiling_gbs"]) for j, r in enumerate(rows) if "ceiling_gbs" in r]
    if ceilings:
        ax.hlines([gbs for _, gbs in ceilings], [j - 0.45 for j, _ in ceilings], [j + 0.45 for j, _ in ceilings],
                  colors="black", linewidth=2, label="no-math copy ceiling (reference)")
    peak = env.get("peak_bandwidth_gbs")
    for value, style, label in ((peak, ":", "datasheet peak"), (copy_gbs, "--", "device copy")):
        if value:
            ax.axhline(value, color="black" if style == ":" else "gray", linestyle=style,
                       label=f"{label} {value:.0f} GB/s")
    ax.set_ylim(0, max(peak or 0, copy_gbs or 0, top) * 1.15)
    ax.set_xticks(range(len(rows)), [_weight(r["shape"], r["dtype"], "\n") for r in rows])
    ax.set_ylabel("GB/s (bytes read + written)")
    return _finish(fig, ax, "NF4 dequantize, achieved bandwidth",
                   "bytes moved / GPU time (CUPTI kernel durations, L2 flushed), median", env, path)


def plot_time_split(procedure: dict, env: dict, path: Path | None = None):
    """One call of each method in the procedure's loop, a panel per case: a bar of issue then wait, stacked, ending
    at wall = issue + wait (its value written past the end), and the GPU time of the same loop as a marker on it:
    beside the sum, not part of it (it runs during the issue and the wait)."""
    import matplotlib.pyplot as plt
    rows = split_rows(procedure)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(len(cases), 1, figsize=(FIGURE_WIDTH, 1.6 + len(cases) * (0.45 + 0.27 * len(methods))),
                             squeeze=False, layout="constrained")
    for ax, case in zip(axes[:, 0], cases):
        here = [next(r for r in rows if r["case"] == case and r["method"] == m) for m in methods]
        ys = list(range(len(methods)))
        issue = [r["issue_us"] for r in here]
        wait = [r["wait_us"] for r in here]
        gpu = [r["gpu_us"] for r in here]
        walls = [r["wall_us"] for r in here]
        ax.barh(ys, issue, color="#f5b971", label="issue: the call to its return, .t() included (perf_counter)")
        ax.barh(ys, wait, left=issue, color="#9ecae1", label="wait: inside torch.cuda.synchronize() (perf_counter)")
        ax.scatter(gpu, ys, marker="D", s=40, color="black", zorder=3,
                   label="GPU time: kernel durations (CUPTI), apart from the sum")
        for y, wall in zip(ys, walls):
            ax.annotate(f"{wall:.1f} µs", (wall, y), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=FONT_MIN)
        ax.set_xlim(0, max(walls + gpu) * 1.25)
        ax.set_title(f"{_weight(here[0]['weight'], here[0]['dtype'])}, {case}", fontsize=10, loc="left")
        ax.set_yticks(ys, [column(m) for m in methods], fontsize=FONT_MIN)
        ax.invert_yaxis()  # first method on top
    axes[-1, 0].set_xlabel("µs per call: wall = issue + wait")
    what = "Where one call's time goes in the published procedure's loop"
    fig.suptitle(f"{what}\n{versions_line(env, date=False)}", fontsize=11)
    _legend_below(fig, axes[:, 0])
    return _save(fig, path)


def t4_code_file(this_gpu: Path | None, root: Path) -> Path | None:
    """The sm_75 timings to show: this GPU's results/<gpu>/t4_code.json where it has one, else the newest
    under root/results (by the date it records), else None."""
    import json
    if this_gpu is not None and (Path(this_gpu) / "t4_code.json").exists():
        return Path(this_gpu) / "t4_code.json"
    found = [(json.loads(path.read_text())["environment"]["date"], path)
             for path in sorted(Path(root, "results").glob("*/t4_code.json"))]
    return max(found)[1] if found else None


def cells_note(env: dict, cells_sha256: str) -> str:
    """'' where a result file was measured by these cells (its environment's paste_unit_sha256), else a
    sentence that says it was not."""
    stamp = env.get("paste_unit_sha256")
    if stamp == cells_sha256:
        return ""
    return (f" Measured by other kernel cells than this notebook's (sha256 {str(stamp)[:12]}, this notebook's "
            f"{cells_sha256[:12]}).")


def format_t4_code(path: Path, t4_config, cells_sha256: str) -> str:
    """benchmarks/t4_code.py's result file as markdown: per shape, unsloth's sm_75 build, ours with the T4's
    LAUNCH_CONFIGS entry (t4_config) and unsloth's time over ours, and the copy kernel; labelled what it is, and
    whether the cells that ran here (cells_sha256) made it."""
    import json
    t4 = json.loads(Path(path).read_text())
    shapes, env = t4["shapes"], t4["environment"]
    ours = [next(c for c in s["ours"].values() if list(c["config"]) == list(t4_config)) for s in shapes]
    unsloth_us = [s["unsloth"]["median_us"] for s in shapes]
    rows = [["unsloth fused, its choice for 7.5", *(f"{us:.2f}" for us in unsloth_us)],
            ["ours, LAUNCH_CONFIGS[(7, 5)]", *(f"{o['median_us']:.2f} ({us / o['median_us']:.2f}x)"
                                               for us, o in zip(unsloth_us, ours))],
            ["copy kernel, same bytes", *(f"{s['copy']['median_us']:.2f}" for s in shapes)]]
    exact = "yes" if all(o["sm75_bit_exact"] for o in ours) else "NO"
    header = ["sm_75 build", *(_weight(s["shape"], s["dtype"]) for s in shapes)]
    source = f"{Path(path).parent.parent.name}/{Path(path).parent.name}/{Path(path).name}"
    return "\n\n".join([wrap(f"From `{source}`: {t4['what']} ({versions_line(env)}). GPU µs per call, median; (x) = "
                             f"unsloth's time / ours. Every output bit-identical to bitsandbytes: {exact}."
                             + cells_note(env, cells_sha256)),
                        markdown_table(header, rows)])


def run_summary(notebook, directory: Path, packed: str | None) -> list[str]:
    """What scripts/run.sh says once the notebook has run, read from its outputs and the files it wrote (at most 8
    lines): whether the kernel was bit-exact, the score card's line (and what needs a GPU), on a GPU the
    procedure's speedup, and where the executed notebook and the result files are."""
    import json
    texts, card = [], ""
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            markdown = "".join(output.get("data", {}).get("text/markdown", ""))
            card = markdown if markdown.startswith("**Score card") else card
    exact = any("ALL EXACT" in text for text in texts) and any("MODEL EXACT" in text for text in texts)
    lines = [f"Bit-exact against bitsandbytes (torch.equal): {'yes' if exact else 'NO'}, at every shape and dtype "
             "and in a small Llama's QLoRA step.", card.split("\n")[0].strip("*") or "No score card was shown."]
    lines += [line for line in card.split("\n\n") if line.startswith("Needs a GPU")]
    results = Path(directory) / "notebook.json"
    if results.exists():
        procedure, baseline = (json.loads(results.read_text())[key] for key in ("procedure", "score"))
        ratio = format_ratio(round_ratios(procedure, baseline["baseline"]))
        lines.append(f"The published procedure: ours {procedure['ours']['median_s']:.3f} s, {ratio} against "
                     f"{METHODS[baseline['baseline']].column}.")
    lines.append(f"The executed notebook: {shown_path(Path(directory) / 'Unsloth_Puzzles_NF4.ipynb')}.")
    return lines + ([packed] if packed else [])

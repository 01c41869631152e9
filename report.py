"""How the NF4 notebook shows what helpers.py measures, in the order it shows it: the score card,
markdown tables and plots. Fetched beside helpers.py; nothing here measures.

  1. Score card and run clock  ScoreCard, RunClock, show
  2. Tables, as markdown       markdown_table, format_procedure, format_kernel_table, format_cpu_cost,
                               format_time_split, format_compile_report
  3. Plots                     plot_procedure, plot_kernel_speedups, plot_bandwidth, plot_time_split

No printed line or table row is longer than MAX_LINE (Colab wraps longer ones); every plot title names
the GPU, the versions and the date.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Sequence

from helpers import (FLOOR_METHOD, GPU_TIME_METHOD, HOST_TIME_METHOD, MAX_LINE, METHODS, OURS, PROCEDURE_METHOD,
                     SAME_KERNELS, column, dtype_name, saved_per_call, short_dtype, time_split, versions_line, wrap)


# 1. Score card and run clock ------------------------------------------------------------------
# The puzzle's marking, in its order: key -> (the criterion and its points, the points it can give).
CRITERIA = {"single_kernel": ("single Triton kernel (+3)", (0, 3)),
            "speedup": ("speedup (-3 to +5)", (-3, 0, 1, 3, 5)),
            "torch_compile": ("works in torch.compile (+1, else -1)", (-1, 1)),
            "asm": ("custom asm that works (+3)", (0, 3)),
            "cache_eviction": ("uses cache eviction (+1)", (0, 1)),
            "fp16_bf16": ("tested in fp16 and bf16 (+1, else -1)", (-1, 1))}
MAX_SCORE = sum(max(points) for _, points in CRITERIA.values())
SPEEDUP_RULE = ("speedup = baseline time / ours over the published procedure; <= 1.00 gives -3, >= 1.05 +1, "
                ">= 1.10 +3, >= 1.15 +5")


def speedup_points(ratio: float) -> int:
    """The puzzle's points for a speedup (SPEEDUP_RULE)."""
    return -3 if ratio <= 1.0 else sum(p for limit, p in ((1.05, 1), (1.10, 2), (1.15, 2)) if ratio >= limit)


def show(markdown: str, display_id: bool = False):
    """Markdown rendered in a notebook, printed elsewhere; a paragraph line longer than MAX_LINE is
    wrapped (table rows are not). With display_id=True, returns the display's handle for `.update`
    (None outside a notebook)."""
    markdown = "\n".join(line if line.startswith("|") or len(line) <= MAX_LINE else wrap(line)
                         for line in markdown.split("\n"))
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = lambda: None
    if get_ipython() is None:
        print(markdown)
        return None
    return display(Markdown(markdown), display_id=display_id or None)


class RunClock:
    """Seconds since the clock was made (the start of Run all), and since its last lap."""

    def __init__(self):
        self.started = self.lap_started = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def lap(self, section: str) -> None:
        """Prints '<section> took N s; Run all so far M s'; the next section starts now."""
        now = time.monotonic()
        print(f"{section} took {now - self.lap_started:.1f} s; Run all so far {now - self.started:.0f} s")
        self.lap_started = now


class ScoreCard:
    """The puzzle's marking (CRITERIA), filled in by the cells that make the evidence: per criterion
    its points and one line of this run's evidence, the total, the GPU, versions, baseline and Run-all
    time so far. `show()` displays it; in a notebook each later change updates that display."""

    def __init__(self, env: dict, baseline: str, clock: RunClock | None = None):
        self.env, self.baseline, self.clock = env, baseline, clock or RunClock()
        self.rows: dict[str, tuple[int, str]] = {}
        self.handles = []

    def set(self, key: str, points: int, evidence: str) -> None:
        """Criterion `key` gets `points` (one it can give) and one line of evidence."""
        if points not in CRITERIA[key][1]:
            raise ValueError(f"{key} gives one of {CRITERIA[key][1]} points, not {points}")
        self.rows[key] = (points, " ".join(str(evidence).replace("|", "/").split()))
        self._refresh()

    def speedup(self, ratio: float, evidence: str) -> None:
        """The speedup row, its points from `ratio` (baseline time / ours) by SPEEDUP_RULE."""
        self.set("speedup", speedup_points(ratio), f"{ratio:.2f}x; {evidence}")

    def lap(self, section: str) -> None:
        """The clock's lap, and the card's Run-all time brought up to date."""
        self.clock.lap(section)
        self._refresh()

    def total(self) -> int:
        return sum(points for points, _ in self.rows.values())

    def markdown(self) -> str:
        rows = []
        for key, (marking, _) in CRITERIA.items():
            points, evidence = self.rows.get(key, (None, "not measured yet: a later cell fills this in"))
            room = MAX_LINE - len(f"| {marking} | +0 |  |")  # longer evidence is cut: as_dict() keeps it whole
            rows.append([marking, "" if points is None else f"{points:+d}",
                         evidence if len(evidence) <= room else evidence[:room - 1] + "…"])
        rows.append(["**total**", f"**{self.total()} / {MAX_SCORE}**",
                     f"{len(self.rows)} of {len(CRITERIA)} filled in"])
        baseline = METHODS[self.baseline].name if self.baseline in METHODS else self.baseline
        return "\n\n".join([f"**Score card, this run: {self.total()} / {MAX_SCORE}**",
                            wrap(f"{versions_line(self.env)}. Baseline: {baseline}. "
                                  f"Run all so far: {self.clock.elapsed_s():.0f} s."),
                            markdown_table(["criterion", "points", "evidence from this run"], rows, "lrl"),
                            wrap(f"Speedup points: {SPEEDUP_RULE}.")])

    def show(self) -> None:
        handle = show(self.markdown(), display_id=True)
        if handle is not None:
            self.handles.append(handle)

    def _refresh(self):
        if self.handles:
            from IPython.display import Markdown
            for handle in self.handles:
                handle.update(Markdown(self.markdown()))

    def as_dict(self) -> dict:
        """For the results file: the points and whole evidence of each criterion filled in."""
        return {"total": self.total(), "max": MAX_SCORE, "baseline": self.baseline,
                "run_all_s": round(self.clock.elapsed_s(), 1),
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


def format_procedure(procedure: dict) -> str:
    """procedure_table as markdown: per method the total seconds (median, min - max over the runs) and
    its time over ours (and over ours with the fast launch off, where that ran)."""
    ours = [name for name in OURS if name in procedure]
    rows = [[column(name), f"{r['median_s']:.4f}", f"{r['min_s']:.4f} - {r['max_s']:.4f}",
             *("" if name in OURS else f"{r['median_s'] / procedure[o]['median_s']:.2f}x" for o in ours)]
            for name, r in procedure.items()]
    runs = len(procedure["ours"].get("runs_s", [])) or 1
    return "\n\n".join([wrap(f"The published procedure: {PROCEDURE_METHOD}, summed over its three cases; median "
                              f"of {runs} run(s) each. A baseline's time / ours is the puzzle's speedup."),
                        markdown_table(["method", "seconds", "min - max", *(f"time / {column(o)}" for o in ours)],
                                       rows)])


def format_kernel_table(rows: Sequence[dict], methods: Sequence[str]) -> str:
    """kernel_table's rows as markdown: GPU time per call with baseline / ours; its spread; GB/s with
    the copy ceiling's share of ours."""
    names = [*methods, "ceiling"]

    def table(cell, extra=None):  # extra: (header, cell) of a last column
        return markdown_table(["weight", *map(column, methods), "copy ceiling", *([extra[0]] if extra else [])],
                              [[_weight(r["shape"], r["dtype"]), *(cell(r, n) for n in names),
                                *([extra[1](r)] if extra else [])] for r in rows])

    ratio = lambda r, n: "" if n in OURS or n == "ceiling" else f" ({r[f'{n}_us'] / r['ours_us']:.2f}x)"
    kernels = ", ".join(f"{column(n)} {rows[0][f'{n}_kernels']}" for n in methods)
    return "\n\n".join([
        wrap(f"Kernel only. {GPU_TIME_METHOD}; µs per call, median of {rows[0]['ours_samples']} calls, "
              f"baseline / ours in brackets. GPU operations per call: {kernels}."),
        table(lambda r, n: f"{r[f'{n}_us']:.2f}{ratio(r, n)}"),
        "The same calls' spread, 20th - 80th percentile, µs:",
        table(lambda r, n: f"{r[f'{n}_p20_us']:.2f} - {r[f'{n}_p80_us']:.2f}"),
        "GB/s (bytes moved / GPU time), and the copy ceiling's time as a share of ours:",
        table(lambda r, n: f"{r[f'{n}_gbs']:.0f}",
              ("ceiling / ours", lambda r: f"{r['ceiling_us'] / r['ours_us']:.1%}"))])


def format_cpu_cost(cost: dict, methods: Sequence[str]) -> str:
    """cpu_cost_table as markdown: every method beside the floor (FLOOR_METHOD)."""
    names = [(m, column(m)) for m in methods] + [("floor", "floor: torch.empty + compiled launch"),
                                                 ("empty", "torch.empty alone"), ("triton_launch", "a Triton launch")]
    rows = [[label, f"{cost[f'{key}_us']:.2f}", f"{cost[f'{key}_p20_us']:.2f} - {cost[f'{key}_p80_us']:.2f}",
             f"{cost[f'{key}_us'] / cost['floor_us']:.2f}x"] for key, label in names]
    return "\n\n".join([wrap(f"Host time per call, {cost['layer']}: {HOST_TIME_METHOD}. Floor: {FLOOR_METHOD}."),
                        markdown_table(["call", "µs, median", "p20 - p80", "/ floor"], rows)])


def format_time_split(procedure: dict) -> str:
    """time_split and saved_per_call as markdown (empty where the procedure ran without the split)."""
    rows = time_split(procedure)
    if not rows:
        return ""
    split = [[_weight(r["weight"], r["dtype"]), column(r["method"]),
              *(f"{r[k]:.1f}" for k in ("wall_us", "gpu_us", "host_us", "rest_us"))] for r in rows]
    saved = [[column(b), *(f"{s[k]:.1f}" for k in ("saved_us", "kernel_us", "launch_path_us"))]
             for b in procedure if b not in OURS for s in [saved_per_call(procedure, b)] if s]
    return "\n\n".join([
        wrap("Where one call's time goes inside the procedure, µs per call: wall clock / calls; GPU time (CUPTI) "
              "in the same loop; host time to issue the call; the rest (launch latency, synchronize, the loop), "
              "negative where GPU and host overlap."),
        markdown_table(["weight", "method", "wall", "GPU", "host", "rest"], split, "llrrrr"),
        "Saved per call against each baseline, µs: kernel time plus the launch path.",
        markdown_table(["against", "saved", "kernel", "launch path"], saved)])


def format_compile_report(report: dict) -> str:
    """compile_report as markdown: a column per dtype, a row per check."""
    results = report["dtypes"].values()
    value = lambda v: f"{v:.3g}" if isinstance(v, float) else {True: "yes", False: "no"}.get(v, v)
    checks = next((list(r)[1:] for r in results if r["compiled"]), [])
    rows = [["compiled (fullgraph)", *("yes" if r["compiled"] else f"no: {r['refused_by']} refused, {r['reason']}"
                                       for r in results)]]
    rows += [[check, *(value(r[check]) if r["compiled"] else "" for r in results)] for check in checks]
    return "\n\n".join([f"torch.compile on {report['gpu']} (compute capability {report['capability']}; native bf16 "
                        f"for Inductor: {value(report['bf16_native'])}):",
                        markdown_table(["check", *map(dtype_name, report["dtypes"])], rows, "l" * (len(results) + 1))])


# 3. Plots (every title names the GPU and the versions) ----------------------------------------
def _legend_name(name: str) -> str:
    return METHODS[name].name.replace("`", "") if name in METHODS else name


def _distinct_kernels(names: Sequence[str]) -> list[tuple[str, str]]:
    """(method, legend label) per distinct kernel: where a method and the one whose kernels it launches
    (SAME_KERNELS) were both timed, one series stands for both, with the latter's times."""
    return [(name, _legend_name(name) + "".join(f" / {column(twin)} (same 3 kernels)" for twin, same
                                                in SAME_KERNELS.items() if same == name and twin in names))
            for name in names if SAME_KERNELS.get(name) not in names]


def _bars(ax, groups: int, series: Sequence[tuple[str, list[float]]], fmt: str) -> float:
    """One bar per (label, values) series in each of `groups` groups, its value written at its foot,
    inside the bar, clear of every reference line (they all lie higher). Returns the tallest value."""
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(groups)]
        ax.bar(xs, values, width, label=label, hatch="//" if label.endswith("no fast launch") else None)
        for x, value in zip(xs, values):  # upright where three or more bars share a group: no label touches another
            ax.annotate(fmt % value, (x, 0), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7, color="white", fontweight="bold", rotation=90 if len(series) > 2 else 0)
    return max((v for _, values in series for v in values), default=1.0)


def _save(fig, path: Path | None):
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def _finish(fig, ax, what: str, how: str, env: dict, path: Path | None):
    ax.set_title(f"{what}\n{how}\n{versions_line(env)}", fontsize=9)
    # the legend right of the axes: it never covers a bar or a value label
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def _speedup_axes(ax, top: float, labels: Sequence[str], ylabel: str):
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(1.15, color="red", linestyle="--", linewidth=1, label="1.15x (the puzzle's target, procedure)")
    ax.set_ylim(0, max(top, 1.15) * 1.15)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel(ylabel)


def plot_procedure(procedure: dict, env: dict, path: Path | None = None):
    """The published procedure: baseline time / ours per baseline, with lines at 1.0 and the puzzle's
    1.15x; beside each, where it ran, baseline time / ours with the fast launch off."""
    import matplotlib.pyplot as plt
    baselines = [name for name in procedure if name not in OURS]
    series = [(f"baseline / {column(o)}", [procedure[b]["median_s"] / procedure[o]["median_s"] for b in baselines])
              for o in OURS if o in procedure]
    fig, ax = plt.subplots(figsize=(8, 4))
    _speedup_axes(ax, _bars(ax, len(baselines), series, "%.2fx"),
                  [_legend_name(b).replace(" (", "\n(") for b in baselines], "baseline time / ours")
    runs = len(procedure["ours"].get("runs_s", [])) or 1
    return _finish(fig, ax, "Published test_dequantize procedure", f"{PROCEDURE_METHOD}, median of {runs}", env, path)


def plot_kernel_speedups(rows: Sequence[dict], baselines: Sequence[str], env: dict, path: Path | None = None):
    """Kernel-only speedup of ours over each distinct baseline kernel per shape (baseline GPU time /
    ours), with lines at 1.0 and at the puzzle's 1.15x (which it sets for the whole procedure)."""
    import matplotlib.pyplot as plt
    series = [(f"vs {label}", [r[f"{base}_us"] / r["ours_us"] for r in rows])
              for base, label in _distinct_kernels(baselines)]
    fig, ax = plt.subplots(figsize=(9, 4))
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
    fig, ax = plt.subplots(figsize=(9, 4))
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
    """One call of each method in the procedure, per case, as a bar ending at the wall clock per call:
    host time to issue the call from 0, then the rest (launch latency, synchronize, loop), then GPU
    time ending at the wall clock. Where GPU and host overlap (the rest is negative) the GPU bar starts
    inside the host bar, the overlap hatched; no bar passes the wall clock."""
    import matplotlib.pyplot as plt
    rows = time_split(procedure)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases) + 2.5, 3.8), sharey=True, squeeze=False)
    for ax, case in zip(axes[0], cases):
        here = [next(r for r in rows if r["case"] == case and r["method"] == m) for m in methods]
        ys, walls = list(range(len(methods))), [r["wall_us"] for r in here]
        host = [min(r["host_us"], r["wall_us"]) for r in here]  # a host time past the wall clock is cut there
        gpu = [max(0.0, r["wall_us"] - r["gpu_us"]) for r in here]  # where the GPU bar starts
        ax.barh(ys, host, color="tab:orange", label="host: issue the call")
        ax.barh(ys, [max(0.0, g - h) for g, h in zip(gpu, host)], left=host, color="tab:gray",
                label="rest: launch latency, synchronize, loop")
        ax.barh(ys, [w - g for w, g in zip(walls, gpu)], left=gpu, color="tab:green", label="GPU time (kernels)")
        ax.barh(ys, [max(0.0, h - g) for g, h in zip(gpu, host)], left=gpu, color="none", hatch="xx",
                edgecolor="black", linewidth=0, label="GPU and host overlap")
        ax.scatter(walls, ys, marker="|", s=300, color="black", zorder=3, label="wall clock per call")
        for y, wall in zip(ys, walls):
            ax.annotate(f"{wall:.1f} µs", (wall, y), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=8)
        ax.set_xlim(0, max(walls) * 1.35)
        ax.set_title(f"{_weight(here[0]['weight'], here[0]['dtype'])} ({case})", fontsize=9)
        ax.set_xlabel("µs per call")
        ax.set_yticks(ys, [_legend_name(m).replace(" (", "\n(") for m in methods], fontsize=8)
    axes[0][0].invert_yaxis()  # the y axis is shared: first method on top
    fig.suptitle(f"Where one call's time goes inside the published procedure\nwall: {PROCEDURE_METHOD} / calls; "
                 f"GPU: CUPTI kernel durations in the same loop; host: perf_counter per call\n{versions_line(env)}",
                 fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, path)

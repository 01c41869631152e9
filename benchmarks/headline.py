"""The headline block of the README and of the notebook's first cell, made from a results folder's
notebook.json: first the procedure's speedup over unsloth's fused path on the GPU that measured it and
that the kernel is bit-exact, then the T4 (the emulation, or a T4's own run), the floor, the kernel
alone, and where, when and by which cells it was measured; the README adds the procedure per method.
Every ratio reads "ours is N x faster" (its time / ours); no command. The rest of the README is written by
hand, and tests/test_tooling_results.py holds its numbers to the result files.

    python -m benchmarks.headline results/<gpu>    # rewrite both blocks from that folder
    python -m benchmarks.headline                  # again, from the folder their markers name

Runs anywhere (no GPU). A folder of a T4's run reads "Measured on a **Tesla T4**", with no estimate.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import helpers
import timing
import report
from benchmarks.cells import NOTEBOOK, notebook_paste_unit_sha256

README = helpers.ROOT / "README.md"
HEADLINE = re.compile(r"<!-- headline:start (?P<source>\S+) -->\n(?P<body>.*?)<!-- headline:end -->", re.S)


def load(source: str, name: str) -> dict | None:
    """results file `name` of the folder `source` (relative to the repository), or None."""
    path = helpers.ROOT / source / name
    return json.loads(path.read_text()) if path.exists() else None


def measured_by(env: dict) -> str:
    """Which kernel cells made a result file: this repository's, or another version (named by its hash)."""
    stamp = env.get("paste_unit_sha256")
    if stamp is None:
        return "by kernel cells the file does not name"
    if stamp == notebook_paste_unit_sha256():
        return "by the kernel cells as they are here"
    return f"by another version of the kernel cells (sha256 {stamp[:12]})"


def speedup_line(results: dict) -> str:
    """The first line: the GPU, the procedure's speedup over unsloth's fused path (else the baseline the run
    measured), and that the kernel is bit-exact."""
    env, procedure = results["environment"], results["procedure"]
    gpu = "a **Tesla T4**" if helpers.is_t4(env) else f"an **{env['gpu']}**"
    baseline = next(name for name in helpers.BASELINES if name in procedure)  # the fused path first
    ratios = helpers.round_ratios(procedure, baseline)
    rounds, calls = len(procedure["ours"]["runs_s"]), 3 * len(helpers.PROCEDURE_CASES) * 1000
    return (f"Measured on {gpu}: **{ratios['median']:.2f}x faster** than {helpers.METHODS[baseline].name} in the "
            f"procedure the puzzle publishes, `test_dequantize` ({calls:,} dequantizations, a GPU synchronize after "
            f"each; median of {rounds} rounds, {ratios['min']:.2f}–{ratios['max']:.2f}x), and **bit-identical** "
            "(`torch.equal`) to bitsandbytes in fp16, bf16 and fp32.")


def where_and_when(results: dict, source: str) -> str:
    """The run: when, the versions, the cells, the file, the score."""
    env, score = results["environment"], results.get("score")
    line = (f"- The run: {env['date']} (driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
            f"bitsandbytes {env['bitsandbytes']}, unsloth {env['unsloth']}), {measured_by(env)}: "
            f"`{source}/notebook.json`")
    if score:
        line += (f"; the notebook's score card gives {score['total']} / {score['max']} of the puzzle's marks, its "
                 "speed marks for this GPU's speedup")
    return line + "."


def procedure_table(procedure: dict) -> list[str]:
    """Ours and each baseline: seconds (median of the rounds), ours' speedup; then ours through Triton (no baseline)."""
    rounds, baselines = len(procedure["ours"]["runs_s"]), [name for name in helpers.BASELINES if name in procedure]
    lines = [f"| the procedure, {rounds} rounds | seconds, median | ours is N x faster than it (its time / ours), "
             "median (min–max over the rounds) |", "|---|--:|--:|"]
    for name in ("ours", *baselines):
        ratio = ""
        if name != "ours":
            ratios = helpers.round_ratios(procedure, name)
            median = f"**{ratios['median']:.2f}x**" if name == "unsloth_fused" else f"{ratios['median']:.2f}x"
            ratio = f"{median} ({ratios['min']:.2f}–{ratios['max']:.2f}x)"
        lines.append(f"| {helpers.METHODS[name].name} | {procedure[name]['median_s']:.3f} | {ratio} |")
    if "ours_via_triton" in procedure:  # the same kernel through Triton's own launch: beside the first baseline
        first = procedure[baselines[0]]["median_s"] if baselines else None
        against = f", against {helpers.METHODS[baselines[0]].prose}'s {first:.3f} s" if baselines else ""
        lines += ["", f"Ours through Triton's own launch (`kernel[grid](...)`, every call bound by Triton), the same "
                  f"kernel launched the standard way, takes {procedure['ours_via_triton']['median_s']:.3f} s{against}."]
    return lines


def t4_line(results: dict) -> list[str]:
    """The one T4 estimate, where this run is not a T4's: the emulation, what it assumes, and what replaces it."""
    emulated = results.get("t4_emulation")
    if helpers.is_t4(results["environment"]) or not emulated or "unsloth_fused" not in emulated["ratios"]:
        return []
    low, high = emulated["ratio_range"]["unsloth_fused"]
    t4_bytes = report.floor_arithmetic(helpers.procedure_bytes(), timing.T4_COPY_GBS, 2)
    ratio = emulated["ratios"]["unsloth_fused"]
    return [f"- **On a T4: not measured here.** Emulated on this GPU, ours is {ratio:.2f}x faster than unsloth's "
            f"fused path ({low:.2f}–{high:.2f}x over {emulated['rounds']} rounds), assuming {timing.EMULATION_ASSUMES}."
            f" At a T4's copy bandwidth the procedure's bytes alone take {t4_bytes}. As the puzzle's speedup (it "
            f"times a T4), {ratio:.3f}x would earn {report.speedup_points(ratio):+d} of the speed marks' -3 to +5. "
            "A T4 owner's Run all replaces this line with a measurement."]


def bullets(results: dict) -> list[str]:
    """The T4, the floor and the kernel alone, one bullet each."""
    procedure, rows = results["procedure"], results["kernel"]
    n_bytes, copy_gbs = helpers.procedure_bytes(), results.get("device_copy_gbs")
    lines = t4_line(results)
    if copy_gbs:
        lines.append(f"- The floor, the least time the procedure's bytes take at this GPU's copy bandwidth (no kernel "
                     f"beats it): {report.floor_arithmetic(n_bytes, copy_gbs)}; ours takes "
                     f"{procedure['ours']['median_s']:.3f} s.")
    if "unsloth_fused" in procedure and rows:
        ratios = [row["unsloth_fused_us"] / row["ours_us"] for row in rows]
        ceiling = [row["ceiling_us"] / row["ours_us"] for row in rows]
        lines.append(f"- The kernel alone (GPU time, {len(rows)} weight shapes): ours is {min(ratios):.2f}x to "
                     f"{max(ratios):.2f}x faster than unsloth's fused kernel, and runs at {min(ceiling):.0%} to "
                     f"{max(ceiling):.0%} of the speed of a copy kernel moving the same bytes.")
    return lines


def block(source: str, where: str) -> str:
    """The block between the markers: the speedup line, the bullets and the run; the README adds the table.
    The notebook's bullets are the T4's and the run's (its own cells show the floor and the kernel alone)."""
    results = load(source, "notebook.json")
    if results is None:
        raise FileNotFoundError(f"{source}/notebook.json")
    if where == "readme":
        lines = [*bullets(results), where_and_when(results, source), "", *procedure_table(results["procedure"])]
    else:
        lines = [*t4_line(results), where_and_when(results, source)]
    return "\n".join([speedup_line(results), "", *lines]) + "\n"


def _text(where: str) -> str:
    if where == "readme":
        return README.read_text()
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def current_headline(where: str) -> tuple[str, str]:
    """(source, body) between the markers in the README or the notebook's first markdown cell."""
    match = HEADLINE.search(_text(where))
    if match is None:
        raise LookupError(f"no <!-- headline:start SOURCE --> ... <!-- headline:end --> in the {where}")
    return match["source"], match["body"]


def _replaced(text: str, source: str, where: str) -> str:
    if HEADLINE.search(text) is None:
        raise LookupError(f"no <!-- headline:start SOURCE --> ... <!-- headline:end --> in the {where}")
    new = f"<!-- headline:start {source} -->\n{block(source, where)}<!-- headline:end -->"
    return HEADLINE.sub(lambda _: new, text, count=1)


def write_headline(source: str | None = None) -> list[str]:
    """Both blocks rewritten from `source`, a results folder of this repository (default: the one the
    markers name); nothing is written unless both have their markers. Returns what was written."""
    if source:
        path = (Path.cwd() / source).resolve()
        if helpers.ROOT not in path.parents:
            raise LookupError(f"{source} is not a results folder of this repository")
        source = path.relative_to(helpers.ROOT).as_posix()
    readme = _replaced(README.read_text(), source or current_headline("readme")[0], "readme")
    notebook = json.loads(NOTEBOOK.read_text())
    cell = next(c for c in notebook["cells"] if c["cell_type"] == "markdown")
    text = _replaced("".join(cell["source"]), source or current_headline("notebook")[0], "notebook")
    cell["source"] = text.splitlines(True)
    README.write_text(readme)
    NOTEBOOK.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    return [helpers.shown_path(README), helpers.shown_path(NOTEBOOK)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help="a results folder, e.g. results/tesla-t4")
    args = parser.parse_args(argv)
    try:
        for path in write_headline(args.source):
            print("wrote", path)
    except (LookupError, FileNotFoundError) as error:
        sys.exit(f"benchmarks.headline: {error}")


if __name__ == "__main__":
    main()

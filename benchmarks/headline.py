"""The headline block of the README and of the notebook's first cell, made from a results folder's
notebook.json: first the procedure's speedup over unsloth's fused path on the GPU that measured it and
that the kernel is bit-exact, then the T4 (the emulation, or a T4's own run), the floor, the kernel
alone, and where, when and by which cells it was measured; the README adds the procedure per method.
Everything else in the README is written by hand, and tests/test_tooling_results.py holds its numbers
to the result files.

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
    """Which cells made a result file: the committed ones, or others (named by their hash)."""
    stamp = env.get("paste_unit_sha256")
    if stamp is None:
        return "by kernel cells the file does not name"
    if stamp == notebook_paste_unit_sha256():
        return "by the committed cells"
    return f"by other cells than the committed ones (paste unit sha256 {stamp[:12]})"


def speedup_line(results: dict) -> str:
    """The first line: the GPU, the procedure's speedup over unsloth's fused path (else the baseline the run
    measured), and that the kernel is bit-exact."""
    env, procedure = results["environment"], results["procedure"]
    gpu = "a **Tesla T4**" if helpers.is_t4(env) else f"an **{env['gpu']}**"
    baseline = next(name for name in helpers.BASELINES if name in procedure)  # the fused path first
    ratios = helpers.round_ratios(procedure, baseline)
    rounds = len(procedure["ours"]["runs_s"])
    return (f"Measured on {gpu}: **{ratios['median']:.2f}x faster** than {helpers.METHODS[baseline].name} in the "
            f"puzzle's own `test_dequantize` procedure (median of {rounds} rounds, {ratios['min']:.2f}–"
            f"{ratios['max']:.2f}x), and **bit-identical** (`torch.equal`) to bitsandbytes in fp16, bf16 and fp32.")


def where_and_when(results: dict, source: str) -> str:
    """The run: when, the versions, the cells, the file, the score."""
    env, score = results["environment"], results.get("score")
    line = (f"- The run: {env['date']} (driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
            f"bitsandbytes {env['bitsandbytes']}, unsloth {env['unsloth']}), {measured_by(env)}: "
            f"`{source}/notebook.json`")
    if score:
        line += f"; score card {score['total']} / {score['max']}"
    return line + "."


def procedure_table(procedure: dict) -> list[str]:
    """A row per method: its seconds (median of the rounds) and, for a baseline, its time / ours."""
    rounds = len(procedure["ours"]["runs_s"])
    lines = [f"| the published `test_dequantize` procedure, {rounds} rounds | seconds, median | its time / ours, "
             "median (min–max over the rounds) |", "|---|--:|--:|"]
    for name, result in procedure.items():
        ratio = ""
        if name != "ours":
            ratios = helpers.round_ratios(procedure, name)
            median = f"**{ratios['median']:.2f}x**" if name == "unsloth_fused" else f"{ratios['median']:.2f}x"
            ratio = f"{median} ({ratios['min']:.2f}–{ratios['max']:.2f}x)"
        lines.append(f"| {helpers.METHODS[name].name} | {result['median_s']:.3f} | {ratio} |")
    return lines


def t4_line(results: dict) -> list[str]:
    """The one T4 estimate, where this run is not a T4's: the emulation, what it assumes, and what replaces it."""
    emulated = results.get("t4_emulation")
    if helpers.is_t4(results["environment"]) or not emulated or "unsloth_fused" not in emulated["ratios"]:
        return []
    low, high = emulated["ratio_range"]["unsloth_fused"]
    floor = report.floor_arithmetic(helpers.procedure_bytes(), timing.T4_COPY_GBS, 2)
    return [f"- **On a T4: not measured here.** Emulated on this GPU, {emulated['ratios']['unsloth_fused']:.2f}x the "
            f"fused path ({low:.2f}–{high:.2f}x over {emulated['rounds']} rounds; a T4's floor, {floor}): each call "
            f"padded to a T4's GPU time for its bytes, which assumes {timing.EMULATION_ASSUMES}. A T4's own Run all "
            "replaces this line: `python -m benchmarks.adopt results/tesla-t4.zip`."]


def bullets(results: dict) -> list[str]:
    """The T4, the floor and the kernel alone, one bullet each."""
    procedure, rows = results["procedure"], results["kernel"]
    n_bytes, copy_gbs = helpers.procedure_bytes(), results.get("device_copy_gbs")
    lines = t4_line(results)
    if copy_gbs:
        floor_s = n_bytes / 1e9 / copy_gbs
        lines.append(f"- The floor: the procedure moves {report.floor_arithmetic(n_bytes, copy_gbs)} at this GPU's "
                     f"copy bandwidth; ours takes {procedure['ours']['median_s'] / floor_s:.2f}x that.")
    if "unsloth_fused" in procedure and rows:
        ratios = [row["unsloth_fused_us"] / row["ours_us"] for row in rows]
        ceiling = [row["ceiling_us"] / row["ours_us"] for row in rows]
        lines.append(f"- The kernel alone (GPU time): unsloth's fused kernel takes {min(ratios):.2f}x to "
                     f"{max(ratios):.2f}x ours; a copy kernel moving the same bytes, {min(ceiling):.0%} to "
                     f"{max(ceiling):.0%}.")
    return lines


def block(source: str, where: str) -> str:
    """The block between the markers: the speedup line, the bullets and the run; the README adds the table."""
    results = load(source, "notebook.json")
    if results is None:
        raise FileNotFoundError(f"{source}/notebook.json")
    table = procedure_table(results["procedure"]) if where == "readme" else []
    lines = [speedup_line(results), "", *bullets(results), where_and_when(results, source),
             *([""] if table else []), *table]
    return "\n".join(lines) + "\n"


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

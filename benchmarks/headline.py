"""The headline block of the README and of the notebook's first cell, made from a results folder's
notebook.json: where and by which cells it was measured, the published procedure per method, and a
few bullets (the floor, the kernel alone, the T4). Everything else in the README is written by hand,
and tests/test_tooling_results.py holds its numbers to the result files.

    python -m benchmarks.headline results/<gpu>    # rewrite both blocks from that folder
    python -m benchmarks.headline                  # again, from the folder their markers name

Runs anywhere (no GPU). A folder of a T4's run reads "measured on a Tesla T4", with no forecast.
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


def where_and_when(results: dict, source: str) -> str:
    """The block's first line: the GPU (a T4 named as measured), the versions, the cells, the score."""
    env, score = results["environment"], results.get("score")
    gpu = "a **Tesla T4**" if helpers.is_t4(env) else f"an **{env['gpu']}**"
    line = (f"Measured on {gpu}, {env['date']} (driver {env['driver']}, torch {env['torch']}, triton "
            f"{env['triton']}, bitsandbytes {env['bitsandbytes']}, unsloth {env['unsloth']}), {measured_by(env)}: "
            f"`{source}/notebook.json`.")
    if score:
        line += f" Score card {score['total']} / {score['max']}."
    return line


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


def bullets(results: dict) -> list[str]:
    """The floor, the kernel alone and the T4, one bullet each."""
    env, procedure, rows = results["environment"], results["procedure"], results["kernel"]
    n_bytes, copy_gbs = helpers.procedure_bytes(), results.get("device_copy_gbs")
    lines = []
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
    forecast = results.get("t4_forecast")
    if forecast and not helpers.is_t4(env) and "unsloth_fused" in forecast["ratios"]:
        low, high = forecast["ratio_range"]["unsloth_fused"]
        line = f"- On a T4, not measured here: forecast {low:.2f}x–{high:.2f}x the fused path"
        emulated = forecast.get("emulated") or {}
        if "unsloth_fused" in emulated.get("ratio_range", {}):
            low, high = emulated["ratio_range"]["unsloth_fused"]
            line += (f"; emulated on this GPU {emulated['ratios']['unsloth_fused']:.2f}x ({low:.2f}–{high:.2f}x "
                     f"over {emulated['rounds']} rounds)")
        lines.append(line + f"; its floor {report.floor_arithmetic(n_bytes, timing.T4_COPY_GBS, 2)}.")
    return lines


def block(source: str, where: str) -> str:
    """The block between the markers: for the README the first line, the table and the bullets; for the
    notebook the first line and the bullets."""
    results = load(source, "notebook.json")
    if results is None:
        raise FileNotFoundError(f"{source}/notebook.json")
    table = procedure_table(results["procedure"]) if where == "readme" else []
    lines = [where_and_when(results, source), "", *table, *([""] if table else []), *bullets(results)]
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

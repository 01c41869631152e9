"""Result files and what is made from them without a GPU: results name their clocks and print relative
paths; the README's and the notebook's headline tables are what the results files give; committed
outputs name no machine paths; the README's commands are what CI runs."""
import json
import re

import pytest
import torch

import benchmark
import helpers
import report
from conftest import ROOT
from tooling_data import METHODS, kernel_rows
from tooling_data import procedure as make_procedure


def test_write_results_names_its_clocks_and_prints_a_relative_path(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers, "ROOT", tmp_path)
    (tmp_path / "results" / "x").mkdir(parents=True)
    shown = helpers.write_results(tmp_path / "results" / "x" / "r.json", {"gpu": "Synthetic GPU"}, kernel=kernel_rows())
    assert shown == "results/x/r.json"
    written = json.loads((tmp_path / shown).read_text())
    assert written["kernel"][1]["bnb_us"] == kernel_rows()[1]["bnb_us"]
    assert written["measurement"]["kernel"] == helpers.GPU_TIME_METHOD
    assert written["measurement"]["floor"] == helpers.LAUNCH_REFERENCE_METHOD
    helpers.write_results(tmp_path / "g.json", {}, measurement={**helpers.MEASUREMENT, "graph": "replay"})
    assert json.loads((tmp_path / "g.json").read_text())["measurement"]["graph"] == "replay"  # benchmark.py's
    assert helpers.shown_path(tmp_path.parent / "elsewhere.json") == "elsewhere.json"


# ---------------------------------------------------------------------------------------------
# The headline tables come from the results files
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["readme", "notebook"])
def test_headline_is_what_the_results_files_give(where):
    source, body = benchmark.current_headline(where)
    assert body == benchmark.headline(source, where), (
        f"the {where}'s headline differs from {source}: run `python benchmark.py --headline`")


EMULATED = {"what": helpers.EMULATION_METHOD, "cycles_per_us": 1755.0, "pad_us": [160.0, 40.0, 560.0], "rounds": 1,
            "seconds": {"ours": 2.78, "unsloth_fused": 3.47, "unsloth_classic": 3.21},
            "ratios": {"unsloth_fused": 3.47 / 2.78, "unsloth_classic": 3.21 / 2.78}}


def _results_dir(tmp_path, with_split):
    env = {"gpu": "Synthetic GPU", "driver": "1", "torch": "2", "triton": "3", "bitsandbytes": "4",
           "unsloth": "5", "date": "today"}
    procedure = make_procedure()
    if not with_split:
        for result in procedure.values():
            del result["cases"]
    results = {"environment": env, "procedure": procedure, "kernel": kernel_rows()}
    if with_split:
        results["measurement"] = {"kernel": helpers.GPU_TIME_METHOD}
        results["cpu_cost"] = {f"{m}_us": 10.0 + 5 * i for i, m in enumerate([*METHODS, "floor"])}
        results["t4_forecast"] = dict(helpers.t4_forecast(procedure, 3000.0), emulated=EMULATED)
    (tmp_path / "notebook.json").write_text(json.dumps(results))
    return str(tmp_path)


def test_headline_from_gpu_time_results(tmp_path):
    source = _results_dir(tmp_path, with_split=True)
    summary, text = benchmark.headline(source, "notebook"), benchmark.headline(source, "readme")
    assert text.startswith(summary), "the README's headline starts with the notebook's summary"
    procedure, rows = make_procedure(), kernel_rows()
    fused = helpers.round_ratios(procedure, "unsloth_fused")
    assert f"**{report.format_ratio(fused)}** unsloth `fast_dequantize` (fused Triton, default)" in summary
    assert "**On a T4, a forecast, not a measurement**" in summary and "emulated on this GPU" in summary
    assert "|" not in summary, "the notebook's summary holds no table"
    for base in METHODS[1:]:
        r = helpers.round_ratios(procedure, base)
        assert (f"{procedure[base]['median_s']:.3f}, **{r['median']:.2f}x** ({r['min']:.2f}–{r['max']:.2f}x "
                "over 5 rounds)") in text
    means = [report.mean_split(procedure[m]["cases"]) for m in METHODS]
    assert ("| one call in the procedure's loop, µs: wall = issue + wait (GPU time beside, not in the sum) | "
            + " | ".join(f"{s['wall_us']:.1f} = {s['issue_us']:.1f} + {s['wait_us']:.1f} (GPU {s['gpu_us']:.1f})"
                         for s in means) + " |") in text
    saved = report.saved_split(procedure, "unsloth_fused")
    assert (f"of the {saved['wall_us']:.1f} µs saved per call in the procedure's loop, {saved['issue_us']:.1f} µs is "
            f"issue (the call until it returns) and {saved['wait_us']:.1f} µs wait") in text
    forecast = helpers.t4_forecast(procedure, 3000.0)
    (row,) = [line for line in text.splitlines() if line.startswith("| **T4 forecast, not a measurement**")]
    ours, fused = forecast["seconds"]["ours"], forecast["seconds"]["unsloth_fused"]
    ratio = forecast["ratios"]["unsloth_fused"]
    assert row.split(" | ")[1:3] == [f"{min(ours):.2f}–{max(ours):.2f}",
                                     f"{min(fused):.2f}–{max(fused):.2f}, {min(ratio):.2f}–{max(ratio):.2f}x"]
    (row,) = [line for line in text.splitlines() if line.startswith("| emulated on this GPU, s")]
    assert row.endswith("| 2.78 | 3.47 (1.25x) | 3.21 (1.15x) |  |")  # bnb: not emulated (the classic path's kernels)
    worst = max(abs(e["error"]) for e in forecast["model_error"].values())
    assert f"within {worst:.1%} of this run's procedure times" in text and "forecast, never a measurement" in text
    assert "3.91 s on a Colab T4" in " ".join(text.split())
    assert "CUPTI" in text and "do_bench" not in text
    assert "| kernel only, 4096x1024 bf16, µs |" in text
    kernel_ratios = [r["unsloth_fused_us"] / r["ours_us"] for r in rows]
    assert f"kernel ratios {min(kernel_ratios):.2f}x to {max(kernel_ratios):.2f}x" in text
    assert "What a T4 should give" in text and "the outputs committed here" in text
    assert "Score card" not in text and "Peak GPU memory" not in text  # no score card, no memory
    assert "multiple of this GPU's floor" not in text  # no copy bandwidth in these results
    t4_s = helpers.procedure_bytes() / 1e9 / helpers.T4_COPY_GBS
    assert f"601 GB / {helpers.T4_COPY_GBS} GB/s = {t4_s:.2f} s" in text  # what a T4 should give: arithmetic
    results = json.loads((tmp_path / "notebook.json").read_text())
    results.update(score={"total": 13, "max": 14, "run_all_s": 300.0}, peak_memory_gib=3.665,
                   device_copy_gbs=4000.0)
    (tmp_path / "notebook.json").write_text(json.dumps(results))
    text = benchmark.headline(source, "readme")
    assert "Score card 13 / 14; Run all took 5.0 minutes." in text
    assert "Peak GPU memory allocated: 3.67 GiB" in text
    floor_s = helpers.procedure_bytes() / 1e9 / 4000.0
    assert (f"| the procedure as a multiple of this GPU's floor (its device copy: 601 GB / 4000 GB/s = {floor_s:.3f} s) | "
            + " | ".join(f"{procedure[m]['median_s'] / floor_s:.2f}x" for m in METHODS) + " |") in text


def test_headline_from_older_results_names_their_clock(tmp_path):
    text = benchmark.headline(_results_dir(tmp_path, with_split=False), "readme")
    assert "do_bench" in text and "host time can leak in" in text
    assert "saved per call" not in text and "What a T4 should give" in text
    assert "T4 forecast" not in text and "emulated" not in text and "wall = issue + wait" not in text


def test_headline_from_results_with_the_older_split_skips_the_new_rows(tmp_path):
    # files written before issue 32: wall_us from the procedure, GPU and host time apart, no issue or wait
    source = _results_dir(tmp_path, with_split=True)
    results = json.loads((tmp_path / "notebook.json").read_text())
    del results["t4_forecast"]
    for result in results["procedure"].values():
        for case in result["cases"]:
            for key in ("issue_us", "wait_us", "split_calls", "split_rounds", "procedure_us"):
                del case[key]
            case["host_us"] = 9.0
    (tmp_path / "notebook.json").write_text(json.dumps(results))
    text = benchmark.headline(source, "readme")
    assert "wall = issue + wait" not in text and "T4 forecast" not in text and "saved per call" not in text
    assert "On this GPU the procedure ratio against the fused path is" in text and "What a T4 should give" in text


def test_write_headline_needs_its_markers(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    monkeypatch.setattr(benchmark, "README", readme)
    with pytest.raises(LookupError, match="headline:start"):
        benchmark.write_headline()
    assert readme.read_text() == "# no markers here\n"
    with pytest.raises(LookupError, match="not a results directory of this repository"):
        benchmark.write_headline(_results_dir(tmp_path, with_split=True))


# ---------------------------------------------------------------------------------------------
# Committed outputs and commands
# ---------------------------------------------------------------------------------------------
MACHINE_PATH = re.compile(r"(?<![\w.~-])(/tmp/|/root/|/home/|/work/|/opt/|/usr/|/var/|/Users/|/content/|[A-Z]:\\)")


def _output_texts(notebook):
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            yield "".join(output.get("text", "")) + "".join(output.get("traceback", []))
            for kind, data in output.get("data", {}).items():
                if not kind.startswith("image/"):  # base64 could spell anything
                    yield "".join(data) if isinstance(data, list) else json.dumps(data)


def test_committed_outputs_name_no_machine_paths():
    notebook = json.loads((ROOT / "Unsloth_Puzzles_NF4.ipynb").read_text())
    found = [m.group(0) for text in _output_texts(notebook) for m in [MACHINE_PATH.search(text)] if m]
    assert not found, f"the notebook's outputs name machine paths: {found}"
    for path in sorted((ROOT / "results").glob("*/*.json")):
        match = MACHINE_PATH.search(path.read_text())
        assert match is None, f"{path.relative_to(ROOT)} names a machine path: {match.group(0)}"


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"^(bash scripts/test\.sh)\b", readme, re.M).group(1)
    assert test_command in ci
    # a quick start in the README's first 40 lines: both commands
    first_lines = "\n".join(readme.splitlines()[:40])
    assert "bash scripts/run.sh" in first_lines and "bash scripts/test.sh" in first_lines
    assert (ROOT / "scripts" / "test.sh").exists() and (ROOT / "scripts" / "run.sh").exists()
    assert "bash scripts/run.sh" in readme


def test_headline_columns_are_the_baselines_only(tmp_path):
    results = {"environment": {"gpu": "Synthetic GPU", "driver": "1", "torch": "2", "triton": "3",
                               "bitsandbytes": "4", "unsloth": "5", "date": "today"},
               "procedure": dict(make_procedure(), ours_via_triton=make_procedure()["ours"]), "kernel": kernel_rows(),
               "measurement": {"kernel": helpers.GPU_TIME_METHOD}}
    (tmp_path / "notebook.json").write_text(json.dumps(results))
    text = benchmark.headline(str(tmp_path), "readme")
    assert "| | " + " | ".join(helpers.METHODS[m].name for m in METHODS) + " |" in text
    assert "Triton's own launch" not in text and "fast launch" not in text

"""helpers.py: timers, result files and plots work on synthetic data; README and CI agree."""
import json
import re
import time

import matplotlib
import pytest

matplotlib.use("Agg")

import helpers  # noqa: E402
from conftest import ROOT  # noqa: E402


def test_cpu_cost_measures_a_known_delay():
    cost = helpers.cpu_cost_us(lambda: time.sleep(0.001), calls=20, repeats=3)
    assert 900 < cost < 5000


def test_packed_bytes():
    assert helpers.packed_bytes(4096, helpers.torch.bfloat16) == 2048 + 64 + 8192


def test_gpu_slug():
    assert helpers.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert helpers.gpu_slug("Tesla T4") == "tesla-t4"


def test_environment_names_versions():
    env = helpers.environment()
    for key in ("date", "torch", "triton", "bitsandbytes", "gpu"):
        assert env[key]


def test_write_results_and_plots(tmp_path):
    rows = [{"shape": "8x8", "ours_us": 1.0, "a_us": 2.0, "b_us": 1.5, "ours_gbs": 100.0, "a_gbs": 50.0},
            {"shape": "16x16", "ours_us": 2.0, "a_us": 2.2, "b_us": 4.0, "ours_gbs": 120.0, "a_gbs": 110.0}]
    env = {"gpu": "Synthetic GPU", "capability": "0.0"}
    path = helpers.write_results(tmp_path / "r.json", env, kernel=rows)
    assert json.loads(path.read_text())["kernel"][1]["b_us"] == 4.0
    fig = helpers.plot_speedups(rows, ["a", "b"], "Synthetic GPU", tmp_path / "s.png")
    assert "Synthetic GPU" in fig.axes[0].get_title()
    heights = sorted(round(p.get_height(), 3) for p in fig.axes[0].patches)
    assert heights == [1.1, 1.5, 2.0, 2.0]
    fig = helpers.plot_bandwidth(rows, "Synthetic GPU", 300.0, 250.0, tmp_path / "b.png")
    assert "Synthetic GPU" in fig.axes[0].get_title()
    assert (tmp_path / "s.png").stat().st_size > 1000 and (tmp_path / "b.png").stat().st_size > 1000


def test_procedure_cases_are_the_published_ones():
    assert [c[:5] for c in helpers.PROCEDURE_CASES] == [
        (2, 3333, 2048, 8192, 3407), (5, 777, 1024, 4096, 3409), (3, 2048, 4096, 14336, 3408)]


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.search(r"```bash\n(bash scripts/test\.sh[^\n]*)\n```", readme).group(1)
    assert test_command in ci
    assert (ROOT / "scripts" / "test.sh").exists() and (ROOT / "scripts" / "run.sh").exists()
    assert "bash scripts/run.sh" in readme

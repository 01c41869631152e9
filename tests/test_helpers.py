"""helpers.py and benchmark.py without a GPU: no hidden state, result files, plots on synthetic
data, the headline tables made from the results files, committed outputs without machine paths,
and README commands that CI runs."""
import json
import logging
import re
import subprocess
import sys
import tempfile
import textwrap

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

import benchmark  # noqa: E402
import helpers  # noqa: E402
from conftest import ROOT  # noqa: E402

METHODS = ["ours", "unsloth_fused", "unsloth_classic", "bnb"]


# ---------------------------------------------------------------------------------------------
# Small facts
# ---------------------------------------------------------------------------------------------
def test_bytes_moved():
    assert helpers.bytes_moved(4096, torch.bfloat16) == 4096 // 2 + 4096 // 64 + 4096 * 2
    assert helpers.bytes_moved(4096, torch.float32) == 4096 // 2 + 4096 // 64 + 4096 * 4


def test_gpu_slug_and_short_dtype():
    assert helpers.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert helpers.gpu_slug("Tesla T4") == "tesla-t4"
    assert [helpers.short_dtype(d) for d in (torch.float16, "bfloat16", "torch.float32")] == ["fp16", "bf16", "fp32"]


def test_environment_names_versions():
    env = helpers.environment()
    for key in ("date", "torch", "triton", "bitsandbytes", "gpu"):
        assert env[key]


def test_procedure_cases_are_the_published_ones():
    assert [c[:5] for c in helpers.PROCEDURE_CASES] == [
        (2, 3333, 2048, 8192, 3407), (5, 777, 1024, 4096, 3409), (3, 2048, 4096, 14336, 3408)]


# ---------------------------------------------------------------------------------------------
# No hidden state
# ---------------------------------------------------------------------------------------------
def test_make_case_builds_under_float32_and_restores_the_default_dtype():
    case = helpers.PROCEDURE_CASES[1]
    mlp, X = helpers.make_case(case, "cpu", scale=16)
    with helpers.default_dtype(torch.float64):
        again, X_again = helpers.make_case(case, "cpu", scale=16)
        assert torch.get_default_dtype() == torch.float64
    assert torch.get_default_dtype() == torch.float32
    # the caller's float64 default changed nothing: built as the procedure builds it
    assert torch.equal(X, X_again)
    for layer, other in zip(mlp.layers(), again.layers()):
        assert torch.equal(layer.weight, other.weight)
        assert torch.equal(layer.weight.quant_state.absmax, other.weight.quant_state.absmax)


def test_make_layer_leaves_the_random_state_alone():
    state = torch.random.get_rng_state()
    first = helpers.make_layer(64, 128, torch.float16, device="cpu", seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(first.weight, helpers.make_layer(64, 128, torch.float16, device="cpu", seed=5).weight)


def _write_notebook(path, source, tagged=True):
    cell = {"cell_type": "code", "execution_count": None, "metadata": {"tags": ["kernel"] if tagged else []},
            "outputs": [], "source": source.splitlines(True)}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_load_kernel_cells_removes_its_source_file_at_exit(tmp_path):
    notebook = _write_notebook(tmp_path / "cells.ipynb", "def answer():\n    return 42\n")
    script = textwrap.dedent(f"""
        import inspect, sys
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        import helpers
        module = helpers.load_kernel_cells(Path({str(notebook)!r}), "cells_for_a_test")
        assert sys.modules["cells_for_a_test"] is module  # torch.compile imports kernels by module name
        assert module.answer() == 42 and "return 42" in inspect.getsource(module.answer)
        assert helpers.load_kernel_cells(Path({str(notebook)!r}), "cells_for_a_test") is module
        assert Path(module.__file__).exists()
        print(module.__file__)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    source_file = result.stdout.strip().splitlines()[-1]
    assert source_file.endswith("cells_for_a_test.py")
    assert not helpers.Path(source_file).parent.exists()


def test_load_kernel_cells_cleans_up_after_a_failing_cell(tmp_path, monkeypatch):
    notebook = _write_notebook(tmp_path / "broken.ipynb", "raise ValueError('a broken cell')\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(ValueError, match="a broken cell"):
        helpers.load_kernel_cells(notebook, "broken_cells_for_a_test")
    assert "broken_cells_for_a_test" not in sys.modules
    assert list(scratch.iterdir()) == []


def test_load_kernel_cells_needs_a_tagged_cell(tmp_path):
    with pytest.raises(LookupError, match="no code cell tagged 'kernel'"):
        helpers.load_kernel_cells(_write_notebook(tmp_path / "plain.ipynb", "x = 1\n", tagged=False), "plain")


FAKE_UNSLOTH = {
    "unsloth/__init__.py": "raise RuntimeError('the package __init__ must not run')\n",
    "unsloth/device_type.py": "DEVICE_TYPE = 'fake'\n",
    "unsloth/kernels/__init__.py": "raise RuntimeError('the package __init__ must not run')\n",
    "unsloth/kernels/utils.py": textwrap.dedent("""
        import logging
        from ..device_type import DEVICE_TYPE
        from unsloth_zoo.temporary_patches.common import PATCHED
        logging.getLogger("unsloth").warning("training features are not used here")
        DISABLED_DURING_IMPORT = logging.root.manager.disable
        def fast_dequantize(W, quant_state):
            return DEVICE_TYPE, PATCHED
    """),
    "unsloth_zoo/__init__.py": "raise RuntimeError('the package __init__ must not run')\n",
    "unsloth_zoo/temporary_patches/__init__.py": "raise RuntimeError('the package __init__ must not run')\n",
    "unsloth_zoo/temporary_patches/common.py": "PATCHED = True\n",
}


def test_import_unsloth_kernels_restores_sys_modules_and_logging(tmp_path, monkeypatch):
    for name, text in FAKE_UNSLOTH.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for name in list(sys.modules):  # a real unsloth imported by another test comes back afterwards
        if name.split(".")[0] in ("unsloth", "unsloth_zoo"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    disabled = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        utils = helpers.import_unsloth_kernels()
        assert utils.fast_dequantize(None, None) == ("fake", True)
        assert utils.DISABLED_DURING_IMPORT == logging.WARNING
        assert logging.root.manager.disable == logging.INFO
        for stand_in in ("unsloth", "unsloth.kernels", "unsloth_zoo", "unsloth_zoo.temporary_patches"):
            assert stand_in not in sys.modules
        assert helpers.import_unsloth_kernels() is utils
    finally:
        logging.disable(disabled)
        for name in list(sys.modules):
            if name.split(".")[0] in ("unsloth", "unsloth_zoo"):
                del sys.modules[name]


# ---------------------------------------------------------------------------------------------
# Result files and plots, on synthetic data
# ---------------------------------------------------------------------------------------------
def _rows():
    rows = []
    for i, (shape, dtype) in enumerate((("8192x2048", "float16"), ("4096x1024", "bfloat16"))):
        row = {"shape": shape, "dtype": dtype, "bytes": 1e6 * (i + 1)}
        for j, name in enumerate([*METHODS, "ceiling"]):
            us = (10.0 + 3 * i) * (1 + 0.25 * j) if name != "ceiling" else 9.0 + 3 * i
            row.update({f"{name}_us": us, f"{name}_p20_us": us * 0.98, f"{name}_p80_us": us * 1.02,
                        f"{name}_gbs": row["bytes"] / us / 1e3, f"{name}_kernels": 1 if j < 2 else 3,
                        f"{name}_samples": 150, f"{name}_graph_us": us + 1.0})
        rows.append(row)
    return rows


def _procedure():
    procedure = {}
    for j, name in enumerate(METHODS):
        cases = []
        for k, (weight, dtype) in enumerate((("8192x2048", "float16"), ("4096x1024", "bfloat16"))):
            wall = 30.0 + 10 * j + 5 * k
            cases.append({"case": f"case {k}", "weight": weight, "dtype": dtype, "calls": 3000,
                          "median_s": wall * 3000 / 1e6, "wall_us": wall, "gpu_us": 12.0 + j - 4 * k,
                          "host_us": 9.0 + 9 * j, "gpu_kernels": 1.0})
        total = sum(c["median_s"] for c in cases)
        procedure[name] = {"median_s": total, "min_s": total, "max_s": total, "runs_s": [total] * 3, "cases": cases}
    return procedure


def _draw(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _legend_covers_no_text(fig):
    renderer = _draw(fig)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    texts = [t for ax in fig.axes for t in ax.texts if t.get_text()]
    assert legends and texts
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for text in texts:
            assert not box.overlaps(text.get_window_extent(renderer)), text.get_text()


def test_write_results_names_its_clocks_and_prints_a_relative_path(tmp_path, monkeypatch):
    monkeypatch.setattr(helpers, "ROOT", tmp_path)
    (tmp_path / "results" / "x").mkdir(parents=True)
    shown = helpers.write_results(tmp_path / "results" / "x" / "r.json", {"gpu": "Synthetic GPU"}, kernel=_rows())
    assert shown == "results/x/r.json"
    written = json.loads((tmp_path / shown).read_text())
    assert written["kernel"][1]["bnb_us"] == _rows()[1]["bnb_us"]
    assert written["measurement"]["kernel"] == helpers.GPU_TIME_METHOD
    assert helpers.shown_path(tmp_path.parent / "elsewhere.json") == "elsewhere.json"


def test_kernel_speedup_plot(tmp_path):
    rows = _rows()
    baselines = METHODS[1:]
    fig = helpers.plot_kernel_speedups(rows, baselines, "Synthetic GPU", tmp_path / "s.png")
    ax = fig.axes[0]
    assert "Synthetic GPU" in ax.get_title() and "GPU time" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8192x2048\nfp16", "4096x1024\nbf16"]
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted(round(r[f"{b}_us"] / r["ours_us"], 6) for r in rows for b in baselines)
    assert all(1.15 not in line.get_ydata() for line in ax.get_lines()), "1.15x belongs to the procedure"
    _legend_covers_no_text(fig)
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_bandwidth_plot_draws_the_ceiling_as_a_reference(tmp_path):
    rows = _rows()
    fig = helpers.plot_bandwidth(rows, METHODS, "Synthetic GPU", 300.0, 250.0, tmp_path / "b.png")
    ax = fig.axes[0]
    assert "Synthetic GPU" in ax.get_title() and "GPU time" in ax.get_title()
    assert len(ax.patches) == len(METHODS) * len(rows)  # bars are methods only
    ceilings = [c for c in ax.collections if "ceiling" in (c.get_label() or "")]
    assert len(ceilings) == 1 and len(ceilings[0].get_segments()) == len(rows)
    assert [s[0][1] for s in ceilings[0].get_segments()] == [r["ceiling_gbs"] for r in rows]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8192x2048\nfp16", "4096x1024\nbf16"]
    _legend_covers_no_text(fig)


def test_procedure_plot_has_the_target_line(tmp_path):
    procedure = _procedure()
    fig = helpers.plot_procedure(procedure, "Synthetic GPU", tmp_path / "p.png")
    ax = fig.axes[0]
    assert "Synthetic GPU" in ax.get_title() and "wall clock" in ax.get_title()
    assert any(list(line.get_ydata()) == [1.15, 1.15] for line in ax.get_lines())
    ours = procedure["ours"]["median_s"]
    assert [round(p.get_height(), 9) for p in ax.patches] == [
        round(procedure[b]["median_s"] / ours, 9) for b in METHODS[1:]]
    _legend_covers_no_text(fig)


def test_time_split_plot(tmp_path):
    procedure = _procedure()
    fig = helpers.plot_time_split(procedure, "Synthetic GPU", tmp_path / "t.png")
    assert "Synthetic GPU" in fig.get_suptitle() and "CUPTI" in fig.get_suptitle()
    rows = helpers.time_split(procedure)
    for ax, case in zip(fig.axes, ("case 0", "case 1")):
        here = [r for r in rows if r["case"] == case]
        widths = [round(p.get_width(), 9) for p in ax.patches]
        expected = ([r["gpu_us"] for r in here] + [r["host_us"] for r in here]
                    + [max(0.0, r["rest_us"]) for r in here])
        assert widths == [round(w, 9) for w in expected]
        assert "fp16" in ax.get_title() or "bf16" in ax.get_title()
    _legend_covers_no_text(fig)
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_formatted_tables_show_every_method():
    rows, procedure = _rows(), _procedure()
    text = helpers.format_kernel_table(rows, METHODS)
    assert all(name in text for name in [*METHODS, "ceiling"]) and helpers.GPU_TIME_METHOD in text
    split = helpers.format_time_split(procedure)
    assert split.count("saved per call against") == 3
    assert "ours is" in helpers.format_procedure(procedure)


# ---------------------------------------------------------------------------------------------
# The headline tables come from the results files
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["readme", "notebook"])
def test_headline_is_what_the_results_files_give(where):
    source, body = benchmark.current_headline(where)
    assert body == benchmark.headline(source, where), (
        f"the {where}'s headline differs from {source}: run `python benchmark.py --headline`")


def _results_dir(tmp_path, with_split):
    env = {"gpu": "Synthetic GPU", "driver": "1", "torch": "2", "triton": "3", "bitsandbytes": "4",
           "unsloth": "5", "date": "today"}
    procedure = _procedure()
    if not with_split:
        for result in procedure.values():
            del result["cases"]
    results = {"environment": env, "procedure": procedure, "kernel": _rows()}
    if with_split:
        results["measurement"] = {"kernel": helpers.GPU_TIME_METHOD}
        results["cpu_cost"] = {f"{m}_us": 10.0 + 5 * i for i, m in enumerate([*METHODS, "floor"])}
    (tmp_path / "notebook.json").write_text(json.dumps(results))
    return str(tmp_path)


def test_headline_from_gpu_time_results(tmp_path):
    source = _results_dir(tmp_path, with_split=True)
    text = benchmark.headline(source, "notebook")
    procedure, rows = _procedure(), _rows()
    ours = procedure["ours"]["median_s"]
    for base in METHODS[1:]:
        assert f"{procedure[base]['median_s']:.3f} (**{procedure[base]['median_s'] / ours:.2f}x**)" in text
        split = helpers.saved_per_call(procedure, base)
        assert f"{split['saved_us']:.1f} = {split['kernel_us']:.1f} + {split['launch_path_us']:.1f}" in text
    assert "CUPTI" in text and "do_bench" not in text
    assert "| kernel only, 4096x1024 bf16, µs |" in text
    kernel_ratios = [r["unsloth_fused_us"] / r["ours_us"] for r in rows]
    assert f"kernel ratios {min(kernel_ratios):.2f}x to {max(kernel_ratios):.2f}x" in text
    assert "On a T4" in text and "the run shown below" in text


def test_headline_from_older_results_names_their_clock(tmp_path):
    text = benchmark.headline(_results_dir(tmp_path, with_split=False), "readme")
    assert "do_bench" in text and "host time can leak in" in text
    assert "saved per call" not in text and "On a T4" in text


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
# A LAUNCH_CONFIGS entry from a tuning run
# ---------------------------------------------------------------------------------------------
def test_table_entry_gives_back_what_was_tuned(tmp_path, kernel, monkeypatch):
    LaunchConfig = kernel.LaunchConfig
    tuned = {("Tesla T4", (7, 5), torch.float16, 64, 11): LaunchConfig(2048, 4, 1, True),
             ("Tesla T4", (7, 5), torch.bfloat16, 64, 11): LaunchConfig(2048, 4, 1, True),
             ("Tesla T4", (7, 5), torch.float16, 64, 12): LaunchConfig(2048, 4, 1, True),
             ("Tesla T4", (7, 5), torch.bfloat16, 64, 13): LaunchConfig(4096, 8, 0, True),
             ("Tesla T4", (7, 5), torch.float32, 64, 13): LaunchConfig(2048, 4, 0, True),
             ("Tesla T4", (7, 5), torch.bfloat16, 64, 14): LaunchConfig(4096, 8, 0, True)}
    path = tmp_path / "notebook.json"
    helpers.write_results(path, {"gpu": "Tesla T4", "date": "today"},
                          tuned_configs={str(key): config for key, config in tuned.items()})
    entry = benchmark.table_entry(path)
    assert "# Tesla T4" in entry and "size class 13" in entry  # float32 disagreed there
    table = eval("{" + entry + "}", {"LaunchConfig": LaunchConfig})
    monkeypatch.setattr(kernel, "LAUNCH_CONFIGS", table)
    Layout = type("Layout", (), {})
    for (gpu, capability, dtype, blocksize, size_class), config in tuned.items():
        if dtype == torch.float32:
            continue
        for n in (2 ** (2 * size_class - 1), 2 ** (2 * size_class + 1) - 1):  # the class's two ends
            layout = Layout()
            layout.shape = (n,)
            assert (n.bit_length() // 2, kernel.measured_config(layout, capability)) == (size_class, config)


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
    test_command = re.search(r"```bash\n(bash scripts/test\.sh[^\n]*)\n```", readme).group(1)
    assert test_command in ci
    assert (ROOT / "scripts" / "test.sh").exists() and (ROOT / "scripts" / "run.sh").exists()
    assert "bash scripts/run.sh" in readme


def test_inductor_refusal_is_found_inside_the_error_chain():
    from torch._dynamo.exc import SkipFrame
    from torch._inductor.exc import InductorError
    # what torch.compile(fullgraph=True) raised on an H200 told it has no native bf16
    wrapped = InductorError(SkipFrame("BF16 is not supported"), None)
    assert helpers.inductor_refusal(wrapped) == "SkipFrame: BF16 is not supported"
    try:  # chained the ordinary way, one level further out
        try:
            raise wrapped
        except InductorError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        assert helpers.inductor_refusal(outer) == "SkipFrame: BF16 is not supported"
    # anything else is not a refusal: compile_report raises it
    assert helpers.inductor_refusal(RuntimeError("CUDA error: out of memory")) is None
    assert helpers.inductor_refusal(InductorError(ValueError("a bug"), None)) is None


def _compiled(**overrides):
    result = {"compiled": True, "weights_bit_identical": True,
              "mlp_bit_identical_to_compiled_mlp_on_eager_weights": True, "mlp_bit_identical_to_eager": False,
              "mlp_max_abs_diff_to_eager": 0.004, "mlp_close_to_eager": True,
              "mlp_bit_identical_to_eager_with_emulate_precision_casts": True, "repeats_identical": True,
              "recompiled": False}
    result.update(overrides)
    return result


def test_compile_claim_says_only_what_the_report_shows():
    refused = {"compiled": False, "refused_by": "Inductor", "reason": "SkipFrame: BF16 is not supported",
               "warnings": ["Tesla T4 does not support bfloat16 compilation natively, skipping"]}
    t4 = {"gpu": "Tesla T4", "capability": "7.5", "bf16_native": False,
          "dtypes": {"torch.float16": _compiled(), "torch.bfloat16": refused}}
    claim = helpers.compile_claim(t4)
    assert claim.startswith("float16: fullgraph")
    assert "bfloat16: not compiled on this GPU (Tesla T4, compute capability 7.5)" in claim
    assert "BF16 is not supported" in claim and "bfloat16, " not in claim
    h200 = {"gpu": "NVIDIA H200", "capability": "9.0", "bf16_native": True,
            "dtypes": {"torch.float16": _compiled(), "torch.bfloat16": _compiled()}}
    assert helpers.compile_claim(h200).startswith("float16, bfloat16: fullgraph")
    broken = {"gpu": "NVIDIA H200", "capability": "9.0", "bf16_native": True,
              "dtypes": {"torch.float16": _compiled(recompiled=True)}}
    assert "NOT as claimed" in helpers.compile_claim(broken)

"""The notebook on its own: opened alone (what the Colab badge opens) it fetches helpers.py, report.py and
model_patch.py and runs top to bottom without a GPU (the interpreter), its exactness checks passing; its
kernel cells stand alone; its model section is one short cell over model_patch.py; its metadata asks Colab
for a T4. The install cell alone: tests/test_tooling_install_cell.py."""
import html
import json
import re
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import GPU, ROOT

NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"
FETCHED = ("helpers.py", "timing.py", "report.py", "model_patch.py")  # what the install cell fetches


def _text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.skipif(GPU, reason="the CPU run of the notebook; on a GPU it runs in full elsewhere")
@pytest.mark.parametrize("route", ["published", "the repository's zip uploaded"])
def test_notebook_runs_alone_on_cpu(tmp_path, monkeypatch, route):
    # a directory holding only the notebook, and the files it imports served from elsewhere (as once published),
    # or the notebook and the repository's zip as GitHub serves it (before publishing: one file to upload)
    from test_tooling_install_cell import PLACEHOLDER_URL, repository_zip
    alone, served = tmp_path / "alone", tmp_path / "served"
    alone.mkdir(), served.mkdir()
    shutil.copy(NOTEBOOK, alone)
    for name in FETCHED:
        shutil.copy(ROOT / name, served)
    if route == "published":
        monkeypatch.setenv("NF4_HELPERS_URL", (served / "helpers.py").as_uri())
    else:
        repository_zip(alone / "nf4-main.zip")
        monkeypatch.setenv("NF4_HELPERS_URL", PLACEHOLDER_URL)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the notebook turns it on itself, as on Colab
    notebook = nbformat.read(alone / NOTEBOOK.name, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(alone)}}).execute()

    install = next(c for c in notebook.cells if c.source.startswith("# @title Install"))
    said = _text(install).split("\nNo GPU: ")[0]  # what it installed, kept or found; then what no GPU means
    assert said.startswith("local Jupyter (no GPU): nothing to install") and "(torch " in said
    assert " ".join(said.split()).endswith("; fetched helpers.py, timing.py, report.py, model_patch.py")
    assert max(len(line) for line in _text(install).splitlines()) <= 120
    for name in FETCHED:
        assert (alone / name).read_bytes() == (ROOT / name).read_bytes()
    card = next(c for c in notebook.cells if "report.ScoreCard(" in c.source)  # its display, as last updated
    shown = "".join(output.get("data", {}).get("text/markdown", "") for output in card.outputs)
    assert shown.startswith("**Score card, this run: no GPU, so the criteria that need one are not scored**")
    assert "| tested in fp16 and bf16 (+1, else -1) | +1 |" in shown and "/ 14" not in shown
    assert "Needs a GPU, not scored in this run: single Triton kernel (+3)" in shown
    text = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "ALL EXACT" in text and "DIFFERENT" not in text
    assert "MODEL EXACT" in text, "the small Llama's QLoRA step (model_patch.check_in_a_small_llama)"
    assert "No GPU: kernels run in Triton's interpreter" in text
    assert "procedure's checks passed" in text
    assert not (alone / "results").exists(), "a CPU run must not write results"
    import report  # what scripts/run.sh says at the end, read from this run
    summary = report.run_summary(notebook, alone / "results" / "cpu", None)
    assert len(summary) <= 8 and summary[0].startswith("Bit-exact against bitsandbytes (torch.equal): yes")
    assert summary[1] == "Score card, this run: no GPU, so the criteria that need one are not scored"
    assert summary[2].startswith("Needs a GPU, not scored in this run: single Triton kernel (+3)")
    assert summary[-1] == "The executed notebook: Unsloth_Puzzles_NF4.ipynb."  # (outside the repository: its name)
    assert not any("procedure:" in line for line in summary)  # no times without a GPU


# An IPython startup file: the kernel answers as a Tesla T4 (capability 7.5, its name, bf16 by emulation only)
# while Triton and Inductor build for the GPU under it (torch's get_device_capability reads the properties
# patched here, so Triton's driver and Inductor are told the real capability directly).
AS_A_T4 = """
import torch, triton
from torch._dynamo.device_interface import get_interface_for_device
interface, real_properties = get_interface_for_device("cuda"), torch.cuda.get_device_properties
real_capability, real_major_minor = interface.get_compute_capability(), torch.cuda.get_device_capability()
triton.runtime.driver.active.get_device_capability = lambda device=None: real_major_minor


class AsT4:
    name, major, minor = "Tesla T4", 7, 5

    def __init__(self, real):
        self.real = real

    def __getattr__(self, attribute):
        return getattr(self.real, attribute)


torch.cuda.get_device_properties = lambda device=None: AsT4(real_properties(device))
torch.cuda.get_device_capability = lambda device=None: (7, 5)
torch.cuda.get_device_name = lambda device=None: "Tesla T4"
interface.is_bf16_supported = staticmethod(lambda including_emulation=True: bool(including_emulation))
interface.get_compute_capability = staticmethod(lambda device=None: real_capability)
"""


@pytest.mark.gpu
def test_run_all_as_a_t4_packs_an_archive_whose_headline_reads_measured_on_a_t4(tmp_path, monkeypatch):
    # the one step from a T4 owner's Run all to the headline, with this GPU answering as a T4: the numbers are
    # this GPU's, so the folder is never committed; what is proven is the way from the archive to the headline
    import zipfile
    from benchmarks import headline
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(NOTEBOOK, run)
    for name in FETCHED:
        shutil.copy(ROOT / name, run)
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-as-a-t4.py").write_text(AS_A_T4)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a fresh T4 has no cached graph
    notebook = nbformat.read(run / NOTEBOOK.name, as_version=4)
    NotebookClient(notebook, timeout=1500, kernel_name="python3", resources={"metadata": {"path": str(run)}}).execute()
    folder = run / "results" / "tesla-t4"
    results = json.loads((folder / "notebook.json").read_text())
    assert (results["environment"]["gpu"], results["environment"]["capability"]) == ("Tesla T4", "7.5")
    assert results["t4_emulation"] is None  # a T4: the procedure is the measurement, nothing emulated
    text = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "Packed " in text and "results/tesla-t4.zip" in text, "the last cell names its archive"
    with zipfile.ZipFile(run / "results" / "tesla-t4.zip") as archive:
        names = archive.namelist()
    assert "results/tesla-t4/notebook.json" in names and "results/tesla-t4/procedure.png" in names
    block = headline.block(str(folder), "readme")
    print(block)
    assert block.startswith("Measured on a **Tesla T4**: **") and "forecast" not in block and "mulated" not in block
    card = next(c for c in notebook.cells if "report.ScoreCard(" in c.source)
    shown = "".join(output.get("data", {}).get("text/markdown", "") for output in card.outputs)
    assert "on Tesla T4, the procedure vs" in " ".join(shown.split()) and "on a T4, not measured" not in shown


def test_kernel_cells_are_tagged_and_stand_alone():
    notebook = json.loads(NOTEBOOK.read_text())
    cells = [c for c in notebook["cells"] if "kernel" in c.get("metadata", {}).get("tags", [])]
    assert len(cells) >= 2
    source = "\n".join("".join(c["source"]) for c in cells)
    assert "helpers" not in source, "the kernel cells must not depend on helpers.py"
    # run alone in a fresh interpreter, from a file, in the interpreter mode
    script = ROOT / "tests" / ".kernel_cells_standalone.py"
    try:
        script.write_text(source + "\nprint('defined', callable(triton_dequantize_nf4), callable(dequantize_nf4))\n")
        env = dict(os.environ, TRITON_INTERPRET="1")
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                                timeout=300)
    finally:
        script.unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "defined True True" in result.stdout


def test_notebook_metadata_asks_colab_for_a_t4():
    notebook = json.loads(NOTEBOOK.read_text())
    assert notebook["metadata"]["accelerator"] == "GPU"
    assert notebook["metadata"]["colab"]["gpuType"] == "T4"
    assert "widgets" not in notebook["metadata"]


def _lines_shown(cell):
    """Every line a committed output shows: printed text, and what a display renders (its text/plain only
    where it has nothing richer: an image's text/plain is its alt text, not shown)."""
    for output in cell.get("outputs", []):
        texts = [output.get("text", "")]
        data = output.get("data", {})
        richer = any(kind in data for kind in ("text/markdown", "text/html", "image/png"))
        texts += [data.get("text/markdown", ""), "" if richer else data.get("text/plain", "")]
        for text in texts:
            yield from "".join(text).splitlines()


def test_a_reviewer_reads_the_score_first_and_the_evidence_in_an_appendix():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    card = next(i for i, s in enumerate(sources) if "report.ScoreCard(" in s)
    first_kernel = next(i for i, c in enumerate(cells) if "kernel" in c.get("metadata", {}).get("tags", []))
    assert card < first_kernel, "the score card comes before the kernel cells"
    appendix = next(i for i, s in enumerate(sources) if s.startswith("## Appendix"))
    assert appendix <= 25, f"{appendix} cells before the appendix"
    for i, cell in enumerate(cells):
        for line in _lines_shown(cell):
            assert len(line) <= 120, f"cell {i} shows a line of {len(line)} characters: {line[:80]}..."


def test_only_our_kernel_is_asserted_in_the_main_flow():
    # a baseline that fails to import, raises or differs is reported and skipped, never asserted
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "assert" in source and "helpers.dequantizers" in source:
            assert "check_baselines" in source and "usable(" in source
            asserted = [line for line in source.splitlines() if line.strip().startswith("assert")]
            assert asserted == ['assert exact, "our kernel differs from bitsandbytes"'], asserted


# ---------------------------------------------------------------------------------------------
# What a judge reads: the procedure in view, the first live result early, lines that fit, one story
# ---------------------------------------------------------------------------------------------
def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def _tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def _code_lines(source):
    return [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_procedure_is_a_visible_cell_and_makes_the_speedup():
    cells = _cells()
    (procedure,) = [c for c in cells if "procedure" in _tags(c)]
    source = "".join(procedure["source"])
    assert procedure["cell_type"] == "code" and "cellView" not in procedure["metadata"]
    assert not source.startswith("# @title"), "the procedure is shown, not collapsed"
    for step in ("set_seed(seed)", "torch.set_default_dtype(torch.float32)", "helpers.MLP(", "torch.randn(",
                 "check_stride=True", "time.time()", "range(iterations)", ".t()", "torch.cuda.synchronize",
                 "for _ in range(2):", "helpers.PROCEDURE_CASES", "helpers.round_ratios(procedure, baseline)"):
        assert step in source, step
    assert len(_code_lines(source)) <= 60, "the procedure cell stays short"
    # the card's speedup comes from this cell and from nowhere else
    speedup_cells = [i for i, c in enumerate(cells) if 'card.set("speedup"' in "".join(c["source"])
                     or "card.speedup(" in "".join(c["source"])]
    assert speedup_cells == [cells.index(procedure)]
    # on a GPU other than a T4, the emulation's cell adds what a T4 would give beside it, its points unchanged
    t4_cells = [i for i, c in enumerate(cells) if 'card.add_evidence("speedup", report.t4_evidence(' in "".join(c["source"])]
    assert len(t4_cells) == 1 and t4_cells[0] > cells.index(procedure)
    helpers_source = (ROOT / "helpers.py").read_text()
    for gone in ("def procedure_table", "def timed_loop", "def warmup_checks", "def make_case"):
        assert gone not in helpers_source, f"helpers.py still has {gone}: the cell is the procedure"


def test_the_first_live_result_follows_the_paste_unit():
    cells = _cells()
    sources = ["".join(c["source"]) for c in cells]
    correctness = next(i for i, s in enumerate(sources) if "helpers.exactness(" in s)
    lines = sources[correctness].splitlines()
    shown = next(i for i, line in enumerate(lines) if line.startswith("report.show("))
    before = [s for c, s in zip(cells[:correctness], sources) if c["cell_type"] == "code"
              and "kernel" not in _tags(c) and not s.startswith("# @title Install")]
    extra = sum(len(_code_lines(s)) for s in before) + len(_code_lines("\n".join(lines[:shown + 1])))
    assert extra <= 25, f"{extra} lines of code besides the install cell and the paste unit before correctness"
    kernel = [i for i, c in enumerate(cells) if "kernel" in _tags(c)]
    procedure = next(i for i, c in enumerate(cells) if "procedure" in _tags(c))
    floor = next(i for i, s in enumerate(sources) if "report.format_floor(" in s)
    card = next(i for i, s in enumerate(sources) if "report.ScoreCard(" in s)
    appendix = next(i for i, s in enumerate(sources) if s.startswith("## Appendix"))
    model_check = next(i for i, c in enumerate(cells) if "model-check" in _tags(c))
    assert card < kernel[0] and kernel[-1] < correctness < procedure < floor < appendix < model_check
    assert all(cells[i]["cell_type"] == "markdown" for i in range(correctness - 1, kernel[-1], -1)
               if "fast-launch" not in _tags(cells[i])), "nothing but prose between the paste unit and correctness"


def test_the_model_section_is_one_short_cell_over_model_patch_py():
    # issue 32: the patch is a module (one source of truth); the notebook only runs its check
    cells = _cells()
    sources = ["".join(c["source"]) for c in cells]
    assert not any("class use_triton_dequantize" in s or "PATCH_CALLS = " in s for s in sources)
    assert not any("model-patch" in _tags(c) for c in cells), "the patch lives in model_patch.py"
    (check,) = [c for c in cells if "model-check" in _tags(c)]
    source = "".join(check["source"])
    assert "import model_patch" in source and "model_patch.check_in_a_small_llama(dequantize_nf4, DEVICE)" in source
    assert "assert exact" in source and len(_code_lines(source)) <= 10


def test_code_lines_fit_and_outputs_fit():
    for i, cell in enumerate(_cells()):
        if cell["cell_type"] == "code":
            for line in "".join(cell["source"]).splitlines():
                assert len(line) <= 100, f"cell {i} ({_tags(cell)}) has a code line of {len(line)}: {line[:60]}..."
        for line in _lines_shown(cell):
            assert len(line) <= 120, f"cell {i} shows a line of {len(line)} characters: {line[:80]}..."


def test_readme_and_notebook_state_the_same_numbers():
    from benchmarks import headline
    import helpers
    import report
    import timing
    source, readme = headline.current_headline("readme")
    assert headline.current_headline("notebook")[0] == source
    notebook = headline.current_headline("notebook")[1]
    assert all(line in readme for line in notebook.splitlines()), "the notebook's headline is the README's, shorter"
    results = json.loads((ROOT / source / "notebook.json").read_text())
    procedure, baseline = results["procedure"], results["score"]["baseline"]
    ratios = helpers.round_ratios(procedure, baseline)
    assert f"**{ratios['median']:.2f}x** ({ratios['min']:.2f}–{ratios['max']:.2f}x)" in readme
    n_bytes = helpers.procedure_bytes() / 1e9
    t4 = f"{n_bytes:.0f} GB / {timing.T4_COPY_GBS} GB/s = {n_bytes / timing.T4_COPY_GBS:.2f} s"
    if not helpers.is_t4(results["environment"]):
        assert t4 in notebook and t4 in readme, "the T4's floor in both headlines is the code's"
    # the committed outputs are the same run's
    speedup = report.format_ratio(ratios)
    peak = f"{results['peak_memory_gib']:.2f} GiB"
    cells = _cells()
    shown = {name: "\n".join(line for c in cells if name in c.get("id", "") for line in _lines_shown(c))
             for name in ("score-card", "procedure", "results")}
    assert speedup in " ".join(shown["score-card"].split()), "the card's speedup row is the file's"
    assert f"{ratios['median']:.2f}x" in shown["procedure"]
    assert peak in shown["results"]
    card_s = re.findall(r"Run all (?:so far|took):? (\d+) s", shown["score-card"])
    assert card_s and abs(int(card_s[-1]) - results["score"]["run_all_s"]) <= 1, (card_s, results["score"])


def test_one_heading_level_per_depth():
    # the title alone is level 1; the sections, the Appendix among them, level 2; the Appendix's parts level 3
    headings = [line for c in _cells() if c["cell_type"] == "markdown"
                for line in "".join(c["source"]).splitlines() if line.startswith("#")]
    levels = [len(line) - len(line.lstrip("#")) for line in headings]
    assert levels[0] == 1 and levels.count(1) == 1, headings[:3]
    appendix = headings.index("## Appendix")
    assert set(levels[1:appendix + 1]) == {2}, "every section before the Appendix is level 2"
    assert set(levels[appendix + 1:]) == {3}, "the Appendix's parts are level 3"


def headline_folder() -> str:
    """The results folder the committed headline comes from."""
    from benchmarks import headline
    return headline.current_headline("notebook")[0]


def test_every_committed_image_has_alt_text():
    images = [output for c in _cells() for output in c.get("outputs", []) if "image/png" in output.get("data", {})]
    assert images, "the committed run shows the per-shape speedups (the other plots are saved with the results)"
    folder = ROOT / headline_folder()
    assert all((folder / name).exists() for name in ("procedure.png", "speedup.png", "time_split.png", "bandwidth.png"))
    for output in images:
        tag = "".join(output["data"].get("text/html", ""))
        alt = re.search(r'alt="([^"]+)"', tag)
        assert alt and len(alt.group(1)) > 20, "an image without alt text (report.show_figure gives one)"
        assert "".join(output["data"].get("text/plain", "")) == html.unescape(alt.group(1))


def test_every_cell_has_an_id():
    # nbformat 4.5 cells carry an id; one without prints MissingIDFieldWarning above run.sh's verdict
    missing = [i for i, cell in enumerate(_cells()) if not cell.get("id")]
    assert not missing, f"cells without an id: {missing}"

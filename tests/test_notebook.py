"""The notebook on its own: opened alone (what the Colab badge opens) it fetches helpers.py and runs
top to bottom without a GPU (the interpreter), its exactness checks passing; its kernel cells stand
alone; its metadata asks Colab for a T4. The install cell alone: tests/test_tooling_install_cell.py."""
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import GPU, ROOT

NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"


def _text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.skipif(GPU, reason="the CPU run of the notebook; on a GPU it runs in full elsewhere")
def test_notebook_runs_alone_on_cpu(tmp_path, monkeypatch):
    # a directory holding only the notebook; helpers.py served from elsewhere, as once published
    alone, served = tmp_path / "alone", tmp_path / "served"
    alone.mkdir(), served.mkdir()
    shutil.copy(NOTEBOOK, alone)
    shutil.copy(ROOT / "helpers.py", served)
    monkeypatch.setenv("NF4_HELPERS_URL", (served / "helpers.py").as_uri())
    notebook = nbformat.read(alone / NOTEBOOK.name, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(alone)}}).execute()

    install = next(c for c in notebook.cells if c.source.startswith("# @title Install"))
    assert _text(install).splitlines()[0].startswith("local Jupyter (no GPU): nothing to install (torch ")
    assert _text(install).splitlines()[0].endswith("; fetched helpers.py")
    assert (alone / "helpers.py").read_bytes() == (ROOT / "helpers.py").read_bytes()
    text = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "ALL EXACT" in text and "DIFFERENT" not in text
    assert "No GPU: kernels run in Triton's interpreter" in text
    assert "procedure's checks passed" in text
    assert not (alone / "results").exists(), "a CPU run must not write results"


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

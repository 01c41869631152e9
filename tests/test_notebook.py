"""The notebook runs top to bottom without a GPU (the interpreter), and its exactness checks pass."""
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import GPU, ROOT


def _run(tmp_path):
    notebook = nbformat.read(ROOT / "Unsloth_Puzzles_NF4.ipynb", as_version=4)
    shutil.copy(ROOT / "helpers.py", tmp_path / "helpers.py")
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return notebook


def _text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []))


@pytest.mark.skipif(GPU, reason="the CPU run of the notebook; on a GPU it runs in full elsewhere")
def test_notebook_runs_on_cpu(tmp_path):
    notebook = _run(tmp_path)
    text = "\n".join(_text(c) for c in notebook.cells if c.cell_type == "code")
    assert "ALL EXACT" in text and "DIFFERENT" not in text
    assert "No GPU: kernels run in Triton's interpreter" in text
    assert "procedure's checks passed" in text
    assert not (tmp_path / "results").exists(), "a CPU run must not write results"


def test_kernel_cells_are_tagged_and_stand_alone():
    notebook = json.loads((ROOT / "Unsloth_Puzzles_NF4.ipynb").read_text())
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
    notebook = json.loads((ROOT / "Unsloth_Puzzles_NF4.ipynb").read_text())
    assert notebook["metadata"]["accelerator"] == "GPU"
    assert notebook["metadata"]["colab"]["gpuType"] == "T4"
    assert "widgets" not in notebook["metadata"]

"""benchmarks/cells.py, the loader of the notebook's kernel cells for commands and tests: the module
is importable by name, its source file lives as long as it does, and a failing cell leaves nothing."""
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from benchmarks.cells import load_kernel_cells


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
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from benchmarks.cells import load_kernel_cells
        module = load_kernel_cells(Path({str(notebook)!r}), "cells_for_a_test")
        assert sys.modules["cells_for_a_test"] is module  # torch.compile imports kernels by module name
        assert module.answer() == 42 and "return 42" in inspect.getsource(module.answer)
        assert load_kernel_cells(Path({str(notebook)!r}), "cells_for_a_test") is module
        assert Path(module.__file__).exists()
        print(module.__file__)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    source_file = result.stdout.strip().splitlines()[-1]
    assert source_file.endswith("cells_for_a_test.py")
    assert not Path(source_file).parent.exists()


def test_load_kernel_cells_cleans_up_after_a_failing_cell(tmp_path, monkeypatch):
    notebook = _write_notebook(tmp_path / "broken.ipynb", "raise ValueError('a broken cell')\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(ValueError, match="a broken cell"):
        load_kernel_cells(notebook, "broken_cells_for_a_test")
    assert "broken_cells_for_a_test" not in sys.modules
    assert list(scratch.iterdir()) == []


def test_load_kernel_cells_needs_a_tagged_cell(tmp_path):
    with pytest.raises(LookupError, match="no code cell tagged"):
        load_kernel_cells(_write_notebook(tmp_path / "plain.ipynb", "x = 1\n", tagged=False), "plain")

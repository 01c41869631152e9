"""Without a GPU the kernel runs in Triton's interpreter: it must be switched on before the
kernel cells are loaded, so it happens here, before any test module imports them."""
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if GPU else "cpu"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernel():
    """The notebook's kernel cells (the paste unit) as a module; NF4_NOTEBOOK=path tests another
    notebook's."""
    from benchmarks.cells import load_kernel_cells
    notebook = os.environ.get("NF4_NOTEBOOK")
    return load_kernel_cells(Path(notebook)) if notebook else load_kernel_cells()

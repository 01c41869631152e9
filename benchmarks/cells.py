"""The notebook's kernel cells as a module, for the commands beside this file and for the tests.

Cells are picked by tag. By default PASTE_UNIT, the cells tagged `kernel` (the kernel, its wrapper
and launch path): what a user pastes. Older notebooks split it (`fast-launch`) and carried the model
patch as a cell (`model-patch`); name their tags to load them. The patch is model_patch.py now: import
it and hand it the cells' function, model_patch.use_triton_dequantize(cells.dequantize_nf4). The cell
tagged `procedure` (the published test_dequantize) is loaded apart: load_procedure_cell."""
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = Path(os.environ.get("NF4_NOTEBOOK", ROOT / "Unsloth_Puzzles_NF4.ipynb"))  # another: tests of its cells
PASTE_UNIT = ("kernel",)


def kernel_cell_sources(notebook: Path = NOTEBOOK, tags=PASTE_UNIT) -> list[str]:
    """The source of every code cell carrying one of `tags`, in notebook order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells
               if c["cell_type"] == "code" and set(tags) & set(c.get("metadata", {}).get("tags", []))]
    if not sources:
        raise LookupError(f"{Path(notebook).name} has no code cell tagged {' or '.join(tags)}")
    return sources


def load_kernel_cells(notebook: Path = NOTEBOOK, name: str = "nf4_kernel_cells",
                      tags=PASTE_UNIT) -> types.ModuleType:
    """Import the notebook's cells tagged `tags`, run in order, as the module `name`.

    Two effects outlive the call, both on purpose: the module is registered in sys.modules (as
    any import is: torch.compile imports a Triton kernel's module by name), and its source stays
    in a temporary file while the module lives (Triton reads kernel source with `inspect`). The
    file is removed when the module is collected or the interpreter exits. A second call with
    the same name returns the module already loaded."""
    if name in sys.modules:
        return sys.modules[name]
    source = "\n\n".join(kernel_cell_sources(notebook, tags))
    directory = tempfile.mkdtemp(prefix="nf4_cells_")
    path = Path(directory) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        shutil.rmtree(directory, ignore_errors=True)
        raise
    weakref.finalize(module, shutil.rmtree, directory, ignore_errors=True)
    return module


def load_procedure_cell(notebook: Path = NOTEBOOK) -> types.SimpleNamespace:
    """What the notebook's cell tagged `procedure` defines (test_dequantize, build_case, warm_up,
    timed_loop), without running the cell: its imports and function definitions only, over helpers,
    torch, GPU and DEVICE as the notebook sets them on this machine."""
    import ast

    import helpers
    import torch
    tree = ast.parse(kernel_cell_sources(notebook, ("procedure",))[0])
    tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    gpu = torch.cuda.is_available()
    names = {"helpers": helpers, "torch": torch, "GPU": gpu, "DEVICE": "cuda" if gpu else "cpu"}
    exec(compile(tree, f"{Path(notebook).name} (the cell tagged procedure)", "exec"), names)
    return types.SimpleNamespace(**names)


def notebook_paste_unit_sha256(notebook: Path = NOTEBOOK) -> str:
    """The sha256 of the notebook's cells tagged `kernel`, joined by a blank line (UTF-8): the cells
    a result file names as environment.paste_unit_sha256 (helpers.paste_unit_sha256, from cells run)."""
    return hashlib.sha256("\n\n".join(kernel_cell_sources(notebook)).encode()).hexdigest()

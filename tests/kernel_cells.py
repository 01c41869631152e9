"""The notebook's kernel cells as a module, for tests and benchmark scripts.

Cells are picked by tag: `kernel` (the paste unit: the kernel and its wrapper), `fast-launch`
(the optional fast launch) and `model-patch` (use_triton_dequantize). By default all three, in
notebook order, as "Run all" defines them; PASTE_UNIT alone is what a user pastes."""
import importlib.util
import json
import shutil
import sys
import tempfile
import types
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"
PASTE_UNIT = ("kernel",)
ALL_CELLS = ("kernel", "fast-launch", "model-patch")


def kernel_cell_sources(notebook: Path = NOTEBOOK, tags=ALL_CELLS) -> list[str]:
    """The source of every code cell carrying one of `tags`, in notebook order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells
               if c["cell_type"] == "code" and set(tags) & set(c.get("metadata", {}).get("tags", []))]
    if not sources:
        raise LookupError(f"{Path(notebook).name} has no code cell tagged {' or '.join(tags)}")
    return sources


def load_kernel_cells(notebook: Path = NOTEBOOK, name: str = "nf4_kernel_cells",
                      tags=ALL_CELLS) -> types.ModuleType:
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

"""Makes a run's archive (results/<gpu>.zip, packed by the notebook's last cell or by scripts/run.sh) this
repository's, in one step: its files into results/<gpu>/, the run's outputs into the root notebook, the README's
and the notebook's headline from that folder (benchmarks.headline), and where the run picked its launch
configuration on its GPU, the optional lines that make it LAUNCH_CONFIGS' entry.

    python -m benchmarks.adopt results/tesla-t4.zip                       # it holds the executed notebook
    python -m benchmarks.adopt results/tesla-t4.zip --notebook RUN.ipynb  # it does not (Kaggle, a local Jupyter)

Runs anywhere (no GPU, no unzip). Nothing is written unless the archive is a results folder and the executed
notebook's code cells are this checkout's. --help needs no torch (adopt() imports helpers.py, which does).
"""
from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path, PurePosixPath

from benchmarks.cells import NOTEBOOK  # torch-free: reads the notebook's JSON


def archive_folder(names: list[str]) -> str:
    """The one folder results/<gpu> every file of the archive lies in directly, holding notebook.json; else
    LookupError."""
    folders = {PurePosixPath(name).parent.as_posix() for name in names}
    if len(folders) != 1:
        raise LookupError(f"it holds {len(folders)} folders, not one results/<gpu>/")
    folder = folders.pop()
    parts = PurePosixPath(folder).parts
    if len(parts) != 2 or parts[0] != "results" or parts[1] in ("..", "."):
        raise LookupError(f"its folder {folder}/ is not results/<gpu>/")
    if f"{folder}/notebook.json" not in names:
        raise LookupError(f"it holds no {folder}/notebook.json")
    return folder


def with_run_outputs(ours: dict, executed: dict) -> dict:
    """Our notebook (its cells, ids, tags and metadata) with each code cell's outputs and execution count taken
    from `executed`, a run of the same code cells; else LookupError naming the first cell that differs."""
    our_code = [cell for cell in ours["cells"] if cell["cell_type"] == "code"]
    run_code = [cell for cell in executed["cells"] if cell["cell_type"] == "code"]
    if len(our_code) != len(run_code):
        raise LookupError(f"it has {len(run_code)} code cells, this checkout's notebook {len(our_code)}")
    for number, (our_cell, run_cell) in enumerate(zip(our_code, run_code), 1):
        our_source, run_source = "".join(our_cell["source"]), "".join(run_cell["source"])
        if our_source.split() != run_source.split():  # whitespace aside
            first_line = (our_source.splitlines() or [""])[0]
            raise LookupError(f"its code cell {number} ({first_line[:60]}) is not this checkout's")
        our_cell["outputs"] = run_cell.get("outputs", [])
        our_cell["execution_count"] = run_cell.get("execution_count")
    return ours


def launch_config_lines(results: dict, source: str) -> list[str]:
    """Where the run picked its launch configuration on its GPU (notebook.json's launch_config_pick,
    timing.pick_launch_config's: picked, gpu, capability, winner), why pasting is optional (the pick step picks again
    on every run on that GPU model) and the lines that make it the table's entry: the kernel cell's LAUNCH_CONFIGS
    line naming `source`, and timing.CONFIG_MEASURED_ON's (tests/test_tooling_config_pick.py holds the two together)."""
    record = results.get("launch_config_pick")
    if record is None or not record.get("picked"):
        return []
    fields = list(record["winner"])
    if len(fields) == 5 and fields[-1] is True:  # ptx, the fifth field, True by default: the table leaves it out
        fields.pop()
    capability = f"({record['capability'][0]}, {record['capability'][1]})"
    values = ", ".join(repr(value) for value in fields)
    return [f"Optional (adopting is done): the notebook picks again on each run on a {record['gpu']}, as this run did.",
            "Pasting these lines makes its pick the table's entry: the pick step then times nothing on that GPU",
            "model, and the kernel cell pasted elsewhere launches with it. The kernel cell's LAUNCH_CONFIGS:",
            f"    {capability}: LaunchConfig({values}),  # picked on {record['gpu']}: {source}/",
            f"timing.py's CONFIG_MEASURED_ON (in place of its {capability} line):",
            f"    {capability}: ({record['gpu']!r},),"]


def adopt(archive_path: Path, notebook_path: Path | None = None) -> list[str]:
    """Extracts the archive into the repository, puts the run's outputs into the root notebook and rewrites both
    headlines; returns what it did, a line each. LookupError (nothing written) where the archive is no results
    folder, holds no executed notebook and none is given, or the notebook's code cells are not this checkout's."""
    import helpers  # imports torch: here, not at the top, so that --help needs no torch
    from benchmarks import headline
    with zipfile.ZipFile(archive_path) as archive:
        files = {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    shown = helpers.shown_path(archive_path)
    try:
        folder = archive_folder(list(files))
    except LookupError as error:
        raise LookupError(f"{shown} is not a run's archive: {error}") from None
    packed_notebook = f"{folder}/{helpers.NOTEBOOK_NAME}"
    if notebook_path is not None:
        executed = json.loads(Path(notebook_path).read_text())
    elif packed_notebook in files:
        executed = json.loads(files[packed_notebook])
    else:
        raise LookupError("\n".join([
            f"{shown} holds no executed notebook (packed outside Colab: on Kaggle, in a local Jupyter, or by",
            "run.sh for another GPU). Download the notebook that ran, with its outputs (File → Download), and run",
            f"    python -m benchmarks.adopt {shown} --notebook PATH_OF_THAT_NOTEBOOK.ipynb"]))
    try:
        notebook = with_run_outputs(json.loads(NOTEBOOK.read_text()), executed)
    except LookupError as error:
        raise LookupError(f"the executed notebook is not of this checkout's cells: {error}. Check out the "
                          "commit the run was made from, then adopt it again.") from None
    for name, data in files.items():
        (helpers.ROOT / name).parent.mkdir(parents=True, exist_ok=True)
        (helpers.ROOT / name).write_bytes(data)
    NOTEBOOK.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    outputs_from = helpers.shown_path(notebook_path or archive_path)
    done = [f"extracted {len(files)} files into {folder}/", f"{NOTEBOOK.name}: the run's outputs, from {outputs_from}"]
    for path in headline.write_headline(str(helpers.ROOT / folder)):
        done.append(f"rewrote the headline of {path}")
    done.append(f'Adopted. Then: NF4_TRITONS="" bash scripts/test.sh, and commit {folder}/, README.md and '
                f'{NOTEBOOK.name}')
    results = json.loads((helpers.ROOT / folder / "notebook.json").read_text())
    return done + launch_config_lines(results, folder)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive", type=Path, help="a run's archive, e.g. results/tesla-t4.zip")
    parser.add_argument("--notebook", type=Path, help="the executed notebook, where the archive holds none")
    args = parser.parse_args(argv)
    try:
        print("\n".join(adopt(args.archive, args.notebook)))
    except (LookupError, OSError, ValueError, zipfile.BadZipFile) as error:  # ValueError: not JSON
        sys.exit(f"benchmarks.adopt: {error}")


if __name__ == "__main__":
    main()

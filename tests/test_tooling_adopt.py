"""python -m benchmarks.adopt, end to end without a GPU: a copy of the repository's tracked files adopts a T4 run's
archive (results/nvidia-h200's files answering as a Tesla T4, packed by helpers.pack_run): the files land in
results/tesla-t4/, the run's outputs in the root notebook, both headlines read "Measured on a Tesla T4", and the
configuration the run picked is printed as a LAUNCH_CONFIGS line, after the adopting is done and said to be optional;
an archive without the executed notebook says what to do, and a notebook of other cells is refused, both writing
nothing. --help needs no torch."""
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import helpers
from benchmarks import adopt, headline
from conftest import ROOT

# what timing.pick_launch_config records in notebook.json (launch_config_pick), shortened
PICKED = {"gpu": "Tesla T4", "capability": [7, 5], "picked": True, "table_entry": "LAUNCH_CONFIGS[(7, 5)]",
          "replaced": [4096, 4, 1, True, True], "winner": [2048, 4, 1, True, True], "entry_slower": 0.045}
TABLE_LINE = "    (7, 5): LaunchConfig(2048, 4, 1, True),  # picked on Tesla T4: results/tesla-t4/"
MEASURED_ON_LINE = "    (7, 5): ('Tesla T4',),"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The repository's files as they are in this checkout (tracked, and new ones git does not ignore), copied once."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked files to copy")
    copy = tmp_path_factory.mktemp("pristine") / "repo"
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    shutil.rmtree(copy / "results" / "tesla-t4", ignore_errors=True)  # a T4 run adopted already: made again here
    return copy


@pytest.fixture
def repo(pristine, tmp_path):
    """A fresh copy of the tracked files for one test."""
    return shutil.copytree(pristine, tmp_path / "repo")


def t4_archive(repo, monkeypatch, executed=None, picked=None):
    """results/tesla-t4.zip in `repo`, packed by helpers.pack_run: results/nvidia-h200's files, its notebook.json
    answering as a Tesla T4 (with `picked` under launch_config_pick), and `executed` as the run's notebook."""
    folder = repo / "results" / "tesla-t4"
    shutil.copytree(repo / "results" / "nvidia-h200", folder)
    results = json.loads((folder / "notebook.json").read_text())
    results["environment"].update(gpu="Tesla T4", capability="7.5")
    if picked is not None:
        results["launch_config_pick"] = picked
    (folder / "notebook.json").write_text(json.dumps(results, indent=2))
    monkeypatch.setattr(helpers, "ROOT", repo)
    helpers.pack_run(folder, notebook=executed)
    shutil.rmtree(folder)  # a clean clone has only the archive
    return repo / "results" / "tesla-t4.zip"


def executed_notebook(repo):
    """The repository's notebook as a run left it: every code cell with an output of its own, and widget state."""
    notebook = json.loads((repo / helpers.NOTEBOOK_NAME).read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    for number, cell in enumerate(code, 1):
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [f"the T4 run's cell {number}\n"]}]
        cell["execution_count"] = number
    notebook["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    return notebook


def run_adopt(repo, *args):
    """python -m benchmarks.adopt ARGS in `repo`, as its owner runs it."""
    env = {name: value for name, value in os.environ.items() if name != "NF4_NOTEBOOK"}
    return subprocess.run([sys.executable, "-m", "benchmarks.adopt", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)


def code_outputs(notebook):
    """Each code cell's outputs, in order."""
    return [cell["outputs"] for cell in notebook["cells"] if cell["cell_type"] == "code"]


def test_adopting_an_archive_with_its_notebook(repo, monkeypatch):
    executed = executed_notebook(repo)
    archive = t4_archive(repo, monkeypatch, executed=executed, picked=PICKED)
    with zipfile.ZipFile(archive) as packed:
        files = {name: packed.read(name) for name in packed.namelist()}
    before = json.loads((repo / helpers.NOTEBOOK_NAME).read_text())
    done = run_adopt(repo, "results/tesla-t4.zip")
    assert done.returncode == 0, done.stderr
    for name, data in files.items():  # every file where the archive lays it out
        assert (repo / name).read_bytes() == data, name
    notebook = json.loads((repo / helpers.NOTEBOOK_NAME).read_text())
    assert code_outputs(notebook) == code_outputs(executed) != code_outputs(before)
    assert [cell.get("id") for cell in notebook["cells"]] == [cell.get("id") for cell in before["cells"]]
    assert "widgets" not in notebook["metadata"]
    first_markdown = next("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    for text in ((repo / "README.md").read_text(), first_markdown):
        match = headline.HEADLINE.search(text)
        assert match["source"] == "results/tesla-t4"
        assert match["body"].startswith("Measured on a **Tesla T4**") and "forecast" not in match["body"]
    said = done.stdout.splitlines()
    adopted = next(number for number, line in enumerate(said) if line.startswith("Adopted. Then:"))
    optional = next(number for number, line in enumerate(said) if line.startswith("Optional (adopting is done)"))
    assert adopted < optional < said.index(TABLE_LINE), "the lines to paste come after the adopting is done"
    assert said[said.index(TABLE_LINE) + 2] == MEASURED_ON_LINE
    why = " ".join(said[optional:said.index(TABLE_LINE)])
    assert "the notebook picks again on each run on a Tesla T4" in why
    assert "the pick step then times nothing on that GPU model" in why


def test_an_archive_without_its_notebook_says_what_to_do_then_takes_the_one_given(repo, monkeypatch):
    archive = t4_archive(repo, monkeypatch)  # outside Colab: no notebook packed, no configuration picked
    before = (repo / helpers.NOTEBOOK_NAME).read_bytes(), (repo / "README.md").read_bytes()
    refused = run_adopt(repo, "results/tesla-t4.zip")
    assert refused.returncode != 0
    assert "results/tesla-t4.zip holds no executed notebook" in refused.stderr
    command = "    python -m benchmarks.adopt results/tesla-t4.zip --notebook PATH_OF_THAT_NOTEBOOK.ipynb"
    assert command in refused.stderr.splitlines()
    assert not (repo / "results" / "tesla-t4").exists(), "nothing is extracted"
    assert ((repo / helpers.NOTEBOOK_NAME).read_bytes(), (repo / "README.md").read_bytes()) == before
    executed = executed_notebook(repo)
    (repo.parent / "downloaded.ipynb").write_text(json.dumps(executed))
    done = run_adopt(repo, str(archive), "--notebook", str(repo.parent / "downloaded.ipynb"))
    assert done.returncode == 0, done.stderr
    assert code_outputs(json.loads((repo / helpers.NOTEBOOK_NAME).read_text())) == code_outputs(executed)
    assert (repo / "results" / "tesla-t4" / "notebook.json").exists()
    assert "Measured on a **Tesla T4**" in (repo / "README.md").read_text()
    assert "LAUNCH_CONFIGS" not in done.stdout, "no configuration was picked"


def test_a_notebook_of_other_cells_is_refused(repo, monkeypatch):
    executed = executed_notebook(repo)
    cell = next(cell for cell in executed["cells"] if cell["cell_type"] == "code")
    cell["source"] = ["print('another notebook')\n"]
    t4_archive(repo, monkeypatch, executed=executed, picked=PICKED)
    before = (repo / helpers.NOTEBOOK_NAME).read_bytes(), (repo / "README.md").read_bytes()
    refused = run_adopt(repo, "results/tesla-t4.zip")
    assert refused.returncode != 0
    assert "its code cell 1 (" in refused.stderr and "Check out the commit the run was made from" in refused.stderr
    assert not (repo / "results" / "tesla-t4").exists()
    assert ((repo / helpers.NOTEBOOK_NAME).read_bytes(), (repo / "README.md").read_bytes()) == before


def test_only_one_results_folder_is_extracted():
    assert adopt.archive_folder(["results/tesla-t4/notebook.json", "results/tesla-t4/a.png"]) == "results/tesla-t4"
    refused = {"two folders": ["results/a/notebook.json", "results/b/notebook.json"],
               "outside results": ["elsewhere/x/notebook.json"],
               "a climb out": ["results/x/../../notebook.json"],
               "no notebook.json": ["results/tesla-t4/a.png"]}
    for names in refused.values():
        with pytest.raises(LookupError):
            adopt.archive_folder(names)


def test_the_launch_config_lines_need_a_configuration_picked_on_the_run_s_gpu():
    results = {"environment": {"gpu": "Tesla T4", "capability": "7.5"}, "launch_configs": [4096, 4, 1, True, True]}
    assert adopt.launch_config_lines(results, "results/tesla-t4") == []  # the entry that ran, not a pick
    results["launch_config_pick"] = dict(PICKED, picked=False)  # measured on this GPU model: not re-picked
    assert adopt.launch_config_lines(results, "results/tesla-t4") == []
    results["launch_config_pick"] = PICKED
    lines = adopt.launch_config_lines(results, "results/tesla-t4")
    assert lines[0].startswith("Optional (adopting is done)")
    assert lines[-3] == TABLE_LINE and lines[-1] == MEASURED_ON_LINE
    a100 = dict(PICKED, gpu="NVIDIA A100-SXM4-40GB", capability=[8, 0], table_entry="DEFAULT_CONFIG",
                winner=[1024, 2, 1, False, False])  # a new entry, its ptx field not the default: written
    lines = adopt.launch_config_lines(dict(results, launch_config_pick=a100), "results/nvidia-a100-sxm4-40gb")
    assert lines[-3] == "    (8, 0): LaunchConfig(1024, 2, 1, False, False),  # picked on NVIDIA A100-SXM4-40GB: " \
                        "results/nvidia-a100-sxm4-40gb/"
    assert lines[-1] == "    (8, 0): ('NVIDIA A100-SXM4-40GB',),"


def test_help_needs_no_torch():
    """--help parses arguments only: a Python without torch (`import torch` raising ModuleNotFoundError, as where
    it is not installed) prints the usage and exits 0."""
    without_torch = "\n".join([
        "import runpy, sys",
        "sys.modules['torch'] = None  # `import torch` now raises ModuleNotFoundError",
        "sys.argv = ['benchmarks.adopt', '--help']",
        "runpy.run_module('benchmarks.adopt', run_name='__main__', alter_sys=True)"])
    shown = subprocess.run([sys.executable, "-c", without_torch], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: ") and "archive" in shown.stdout and "--notebook" in shown.stdout

"""The notebook's install cell and helpers.install_missing, which it hands the install to, run in a fresh
interpreter: the cell fetches helpers.py, timing.py, report.py and model_patch.py (naming the fix when it cannot),
stays short, and
helpers.py installs only what is missing, never torch or triton, pins what the requirements pin and says
what it did in one line, naming the version of a package copied in without metadata. helpers.py imports
where triton does not (a CPU torch, before triton is installed), and says what to do where torch is missing."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import helpers
from conftest import GPU, ROOT

NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"
PLACEHOLDER_URL = "https://raw.githubusercontent.com/REPO_OWNER/REPO_NAME/main/helpers.py"
WHERE = torch.cuda.get_device_name() if GPU else "no GPU"
MAX_CELL_LINES = 32  # issue 32: the cell fetches FETCHED, helpers.py does the rest; issue 48: or unpacks them
FETCHED = ("helpers.py", "timing.py", "report.py", "model_patch.py")  # the repository's files the notebook imports
NO_GPU_NOTE = "No GPU: kernels run in Triton's interpreter; timings and unsloth's baseline need a GPU."


def _install_cell_source():
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"]
             if c["cell_type"] == "code" and "".join(c["source"]).startswith("# @title Install")]
    assert len(cells) == 1, "the notebook must have one install cell"
    return "".join(cells[0]["source"])


# ---------------------------------------------------------------------------------------------
# The install cell alone, in a fresh interpreter (a Python, not a Jupyter kernel, the working
# directory first on sys.path as in Jupyter). For what it would install, importlib.metadata is told
# which packages to report missing, old or without metadata; a package told missing cannot be found
# or imported either, until `python -m pip` (a stand-in that records its arguments) "installs" it.
# NF4_TEST_GPU pretends a GPU of that compute capability (a Tesla T4 by name); NF4_TEST_PIP_FAILS
# makes pip fail. After the cell, NF4_TEST_REPORT prints whether triton was imported and what helpers says of it.
# ---------------------------------------------------------------------------------------------
RUN_CELL = textwrap.dedent("""
    import importlib.abc, importlib.metadata as metadata, importlib.util, json, os, sys, types

    def pretend():
        with open(os.environ["NF4_TEST_VERSIONS"]) as file:
            return json.load(file)

    real_version = metadata.version
    def version(package):
        told = pretend()
        if package not in told:
            return real_version(package)
        if told[package] in (None, "no-metadata"):  # "no-metadata": importable, copied in by hand
            raise metadata.PackageNotFoundError(package)
        return told[package]
    metadata.version = version

    real_find_spec = importlib.util.find_spec
    def find_spec(name, *args):  # a package told missing cannot be found
        return None if pretend().get(name.split(".")[0], "") is None else real_find_spec(name, *args)
    importlib.util.find_spec = find_spec

    class NotInstalled(importlib.abc.MetaPathFinder):
        # importing a package told missing fails as where it is not installed
        def find_spec(self, name, path=None, target=None):
            if pretend().get(name.split(".")[0], "") is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, NotInstalled())

    if os.environ.get("NF4_TEST_COLAB"):
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    if os.environ.get("NF4_TEST_GPU"):
        import torch
        def is_available():
            return True
        def get_device_capability(device=None):
            return tuple(int(part) for part in os.environ["NF4_TEST_GPU"].split("."))
        def get_device_name(device=None):
            return "Tesla T4"
        torch.cuda.is_available = is_available
        torch.cuda.get_device_capability = get_device_capability
        torch.cuda.get_device_name = get_device_name
    sys.path.insert(0, os.getcwd())
    cell = {"__name__": "__main__"}
    exec(compile(open(sys.argv[1]).read(), "install_cell", "exec"), cell)
    if os.environ.get("NF4_TEST_REPORT"):
        print("REPORT", json.dumps({"triton_at_import": "triton" in sys.modules,
                                    "environment_triton": cell["helpers"].environment()["triton"]}))
""")
FAKE_PIP = textwrap.dedent("""
    import json, os, sys
    def _specs(args):  # what follows the constraints file, options left out
        return [a for a in args[args.index("-c") + 2:] if not a.startswith("-")]
    args = sys.argv[1:]
    constraints = open(args[args.index("-c") + 1]).read()
    with open(os.environ["NF4_TEST_PIP_LOG"], "a") as log:
        log.write(json.dumps({"args": args, "constraints": constraints}) + "\\n")
    if os.environ.get("NF4_TEST_PIP_FAILS"):
        sys.exit("ERROR: Could not find a version that satisfies the requirement (no network)")
    path = os.environ["NF4_TEST_VERSIONS"]
    pretend = json.loads(open(path).read())
    for spec in _specs(args):
        name, _, pinned = spec.partition("==")
        pretend[name] = pinned or "1.0.test"
    open(path, "w").write(json.dumps(pretend))
""")


# What the install cell is told is installed besides torch and triton (the real ones), whatever this
# machine has: the GPU machine, for one, has bitsandbytes and unsloth's kernels without package metadata.
PRESENT = {"bitsandbytes": "0.50.2", "unsloth": "2026.10.9", "unsloth_zoo": "2026.10.9", "transformers": "5.0.0",
           "peft": "0.21.2", "accelerate": "1.15.0", "matplotlib": "3.11.2"}


def run_install_cell(tmp_path, pretend=None, helpers=True, env=None):
    """Run the install cell in tmp_path/work, with PRESENT updated by `pretend` (None: missing);
    returns (result, pip calls)."""
    work, fake = tmp_path / "work", tmp_path / "fake_pip"
    (fake / "pip").mkdir(parents=True)
    work.mkdir(exist_ok=True)  # (a test may have put an upload there)
    (fake / "pip" / "__init__.py").write_text("")
    (fake / "pip" / "__main__.py").write_text(FAKE_PIP)
    (tmp_path / "cell.py").write_text(_install_cell_source())
    (tmp_path / "run_cell.py").write_text(RUN_CELL)
    (tmp_path / "versions.json").write_text(json.dumps(dict(PRESENT, **(pretend or {}))))
    if helpers:
        for name in FETCHED:
            shutil.copy(ROOT / name, work)
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("NF4_HELPERS_URL", "KAGGLE_KERNEL_RUN_TYPE", "TRITON_INTERPRET")}
    python_path = os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))
    environment.update(PYTHONPATH=python_path, NF4_TEST_VERSIONS=str(tmp_path / "versions.json"),
                       NF4_TEST_PIP_LOG=str(tmp_path / "pip.log"), **(env or {}))
    result = subprocess.run([sys.executable, str(tmp_path / "run_cell.py"), str(tmp_path / "cell.py")],
                            cwd=work, env=environment, capture_output=True, text=True, timeout=300)
    log = tmp_path / "pip.log"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def _versions():
    from importlib.metadata import version
    return {"torch": version("torch"), "triton": version("triton"), "bitsandbytes": PRESENT["bitsandbytes"]}


def _specs(call):
    """The packages a pip call installs: what follows its constraints file, options left out."""
    args = call["args"]
    return [a for a in args[args.index("-c") + 2:] if not a.startswith("-")]


def test_install_cell_is_short_and_hands_the_install_to_helpers():
    source = _install_cell_source()
    assert len(source.splitlines()) <= MAX_CELL_LINES, f"the install cell is {len(source.splitlines())} lines"
    assert "helpers.install_missing(GPU" in source
    assert "pip" not in source, "pip is run by helpers.install_missing, not by the cell"


def _said(result):
    """install_missing's line, its wrap undone: where the line is longer than MAX_LINE (a GPU with a long name),
    what it found or kept goes on indented lines below."""
    lines = result.stdout.splitlines()
    said = lines[0]
    for line in lines[1:]:
        if not line.startswith("    "):
            break
        said += " " + line.strip()
    return said


@pytest.mark.parametrize("runtime, env", [("Colab", {"NF4_TEST_COLAB": "1"}),
                                          ("Kaggle", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}),
                                          ("local Python", {})])
def test_install_cell_names_the_runtime_and_installs_nothing_present(tmp_path, runtime, env):
    if runtime == "local Python" and os.path.isdir("/kaggle"):
        pytest.skip("this machine looks like Kaggle")
    result, calls = run_install_cell(tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    v = _versions()
    line = _said(result)
    assert line == (f"{runtime} ({WHERE}): nothing to install (torch {v['torch']}, triton {v['triton']}, "
                    f"bitsandbytes {v['bitsandbytes']}" + (", unsloth 2026.10.9)" if GPU else ")")), line
    assert calls == []
    if not GPU:
        assert result.stdout.splitlines()[1] == NO_GPU_NOTE


def test_install_cell_installs_only_what_is_missing_and_holds_torch_and_triton(tmp_path):
    result, calls = run_install_cell(tmp_path, {"matplotlib": None, "bitsandbytes": "0.45.0"})
    assert result.returncode == 0, result.stderr[-3000:]
    v = _versions()
    assert len(calls) == 1, calls
    args = calls[0]["args"]
    assert args[0] == "install" and "--no-deps" not in args
    assert _specs(calls[0]) == ["bitsandbytes==0.50.2", "matplotlib"]  # the old bitsandbytes replaced
    assert calls[0]["constraints"] == f"torch=={v['torch']}\ntriton=={v['triton']}\n"
    assert _said(result) == (
        f"local Python ({WHERE}): installed bitsandbytes 0.50.2, matplotlib 1.0.test; "
        f"kept torch {v['torch']} and triton {v['triton']}")


def test_install_cell_installs_triton_only_where_torch_came_without_it(tmp_path):
    # triton cannot be imported until pip installs it: helpers.py imports without it, and once it is
    # installed environment() names its version
    result, calls = run_install_cell(tmp_path, {"triton": None}, env={"NF4_TEST_REPORT": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(calls) == 1 and _specs(calls[0]) == ["triton==3.6.0"]
    assert calls[0]["constraints"] == f"torch=={_versions()['torch']}\n"
    assert "installed triton 3.6.0; kept torch " in _said(result)
    report = json.loads(result.stdout.split("REPORT ", 1)[1])
    assert report == {"triton_at_import": False, "environment_triton": "3.6.0"}


def test_helpers_timing_and_report_import_where_triton_does_not(tmp_path):
    # a fresh interpreter in which `import triton` fails, as with a CPU torch before triton is installed
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class NoTriton(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "triton":
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, NoTriton())
        sys.path.insert(0, {str(ROOT)!r})
        import helpers, timing, report
        print(timing.triton is None, hasattr(timing, "_l2_flush_before_timed_call"),
              "triton" in sys.modules, callable(helpers.install_missing), len(helpers.CPU_SHAPES))
    """)
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "False", "False", "True", str(len(helpers.CPU_SHAPES))]


def test_helpers_leaves_triton_language_to_the_interpreter_without_a_gpu():
    # The install cell imports helpers, then sets TRITON_INTERPRET where torch sees no GPU: triton.language
    # must not be imported before that, or Triton's own jit functions (tl.interleave) stay compiled-only
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        import helpers, torch
        imported_early = "triton.language" in sys.modules
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
        import triton.language as tl
        print(torch.cuda.is_available(), imported_early, type(tl.interleave).__name__)
    """)
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    gpu, imported_early, interleave = result.stdout.split()
    if gpu == "True":
        assert interleave == "JITFunction"
    else:
        assert (imported_early, interleave) == ("False", "InterpretedFunction")


def test_install_cell_says_what_to_do_where_torch_is_missing(tmp_path):
    result, calls = run_install_cell(tmp_path, {"torch": None})
    assert result.returncode != 0 and calls == []
    assert ("RuntimeError: torch is not installed: install PyTorch for this machine "
            "(https://pytorch.org/get-started/locally/), then run this cell again.") in result.stderr


def test_install_cell_wants_unsloth_only_with_a_gpu(tmp_path):
    result, calls = run_install_cell(tmp_path, {"unsloth": None, "unsloth_zoo": None})
    assert result.returncode == 0, result.stderr[-3000:]
    if GPU:  # its kernels, without its dependencies
        assert [c["args"][-3:] for c in calls] == [["--no-deps", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9"]]
        assert "installed unsloth 2026.10.9 (kernels only)" in result.stdout
    else:
        assert calls == [] and "nothing to install" in result.stdout


def test_install_cell_installs_unsloth_without_its_dependencies_on_a_pretended_gpu(tmp_path):
    result, calls = run_install_cell(tmp_path, {"unsloth": None, "unsloth_zoo": None}, env={"NF4_TEST_GPU": "7.5"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(calls) == 1 and calls[0]["args"][-3:] == ["--no-deps", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9"]
    assert calls[0]["constraints"] == f"torch=={_versions()['torch']}\ntriton=={_versions()['triton']}\n"
    assert result.stdout.splitlines()[0].startswith(
        "local Python (Tesla T4): installed unsloth 2026.10.9 (kernels only); kept torch ")
    assert NO_GPU_NOTE not in result.stdout


def test_install_cell_refuses_a_gpu_older_than_the_kernel_supports(tmp_path):
    result, calls = run_install_cell(tmp_path, {"matplotlib": None}, env={"NF4_TEST_GPU": "6.1"})
    assert result.returncode != 0 and calls == []
    assert ("RuntimeError: Tesla T4 (compute capability (6, 1)) is older than this kernel supports (7.0): "
            "pick a T4 or a newer GPU for this runtime.") in result.stderr


@pytest.mark.parametrize("runtime, env, hint", [
    ("Kaggle", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, " (on Kaggle, turn on Internet in the notebook's settings)"),
    ("local Python", {}, "")])
def test_install_cell_says_why_pip_failed_and_on_kaggle_what_to_turn_on(tmp_path, runtime, env, hint):
    if runtime == "local Python" and os.path.isdir("/kaggle"):
        pytest.skip("this machine looks like Kaggle")
    result, calls = run_install_cell(tmp_path, {"peft": None}, env=dict(env, NF4_TEST_PIP_FAILS="1"))
    assert result.returncode != 0 and len(calls) == 1
    assert f"RuntimeError: pip could not install peft==0.21.2{hint}:\n" in result.stderr
    assert "no network" in result.stderr  # pip's own words follow


UPLOAD = "upload the repository's zip (on GitHub: Code > Download ZIP) next to this notebook"


@pytest.mark.parametrize("url, message", [
    (PLACEHOLDER_URL, f"helpers.py, timing.py, report.py, model_patch.py not here: {UPLOAD}, then run this cell again."),
    ("file:///nonexistent/helpers.py", "Could not fetch helpers.py from file:///nonexistent/helpers.py ("),
])
def test_install_cell_names_the_fix_when_helpers_py_is_missing(tmp_path, url, message):
    result, calls = run_install_cell(tmp_path, helpers=False, env={"NF4_HELPERS_URL": url})
    assert result.returncode != 0
    assert f"RuntimeError: {message}" in result.stderr
    assert calls == [] and not (tmp_path / "work" / "helpers.py").exists()


def test_install_cell_names_the_file_it_could_not_fetch_and_the_fix(tmp_path):
    # helpers.py, timing.py and report.py served, model_patch.py not: the cell stops at model_patch.py, naming every file
    served = tmp_path / "served"
    served.mkdir()
    for name in ("helpers.py", "timing.py", "report.py"):
        shutil.copy(ROOT / name, served)
    result, calls = run_install_cell(tmp_path, helpers=False, env={"NF4_HELPERS_URL": (served / "helpers.py").as_uri()})
    assert result.returncode != 0 and calls == []
    url = (served / "model_patch.py").as_uri()
    assert f"RuntimeError: Could not fetch model_patch.py from {url} (" in result.stderr
    assert f"): {UPLOAD}." in result.stderr
    assert not (tmp_path / "work" / "model_patch.py").exists()


def test_install_cell_fetches_its_files_from_beside_the_url_and_says_so_within_a_line(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    for name in FETCHED:
        shutil.copy(ROOT / name, served)
    result, calls = run_install_cell(tmp_path, helpers=False, env={"NF4_HELPERS_URL": (served / "helpers.py").as_uri()})
    assert result.returncode == 0, result.stderr[-3000:]
    for name in FETCHED:
        assert (tmp_path / "work" / name).read_bytes() == (ROOT / name).read_bytes()
    said = result.stdout if GPU else result.stdout.replace(NO_GPU_NOTE + "\n", "")
    assert said.startswith(f"local Python ({WHERE}): nothing to install")
    assert " ".join(said.split()).endswith("; fetched helpers.py, timing.py, report.py, model_patch.py")
    assert all(len(line) <= helpers.MAX_LINE for line in result.stdout.splitlines())


def test_install_cell_pins_what_the_requirements_pin():
    # requirements.txt is for Colab and GPU machines; triton, which those always have, is pinned
    # for CPU machines in requirements-cpu.txt
    text = (ROOT / "requirements.txt").read_text()
    cpu = dict(re.findall(r"^([A-Za-z_]+)==(\S+)", (ROOT / "requirements-cpu.txt").read_text(), re.M))
    named = set(re.findall(r"^([A-Za-z_]+)", text, re.M)) | {"triton"}
    pins = dict(re.findall(r"^([A-Za-z_]+)==(\S+)", text, re.M), triton=cpu["triton"])
    installed = dict(helpers.PACKAGES, **helpers.UNSLOTH)
    assert {"bitsandbytes", "unsloth", "unsloth_zoo", "transformers", "peft", "triton"} <= set(installed)
    assert "torch" not in installed
    for name, spec in installed.items():
        assert name in named, f"helpers.install_missing installs {name}, which no requirements file names"
        if "==" in spec:
            assert spec == f"{name}=={pins[name]}", (spec, pins.get(name))
        else:
            assert spec == name and name not in pins, (spec, pins.get(name))


def test_install_cell_names_the_version_of_a_package_without_metadata(tmp_path):
    # bitsandbytes importable but with no package metadata (the GPU machine here has it so): its own __version__
    import bitsandbytes
    result, calls = run_install_cell(tmp_path, {"bitsandbytes": "no-metadata"})
    assert result.returncode == 0, result.stderr[-3000:]
    line = _said(result)
    assert calls == [] and f"bitsandbytes {bitsandbytes.__version__}" in line and "present" not in line


def test_unsloth_without_metadata_is_named_by_its_kernels_hash(tmp_path, monkeypatch):
    # on a GPU whose unsloth was copied in without metadata: the version UNSLOTH_NF4_SHA256 gives its nf4.py
    for package in ("unsloth", "unsloth_zoo"):
        (tmp_path / package / "kernels").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("raise ImportError('not to be imported here')\n")
    nf4 = tmp_path / "unsloth" / "kernels" / "nf4.py"
    nf4.write_text("# stands in for unsloth's kernels/nf4.py\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(helpers.UNSLOTH_NF4_SHA256, helpers.hashlib.sha256(nf4.read_bytes()).hexdigest(), "2026.10.9")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    said = helpers.install_missing(True)  # everything present: pip is not run
    assert said.endswith(", unsloth 2026.10.9)") and "\n" not in said, said
    assert said.startswith(f"{helpers.runtime_name()} (Tesla T4): nothing to install (torch ")


def repository_zip(path, folder="nf4-main"):
    """The repository's files in one folder of a zip, as GitHub serves it (Code > Download ZIP)."""
    import zipfile
    with zipfile.ZipFile(path, "w") as archive:
        for name in (*FETCHED, "README.md", "Unsloth_Puzzles_NF4.ipynb", "scripts/run.sh"):
            archive.write(ROOT / name, f"{folder}/{name}")
    return path


def test_install_cell_unpacks_its_files_from_the_repositorys_zip_uploaded_beside_it(tmp_path):
    # before publishing, one upload: the repository's zip next to the notebook; the placeholder URL is never asked
    (tmp_path / "work").mkdir()
    repository_zip(tmp_path / "work" / "nf4-main.zip")
    result, calls = run_install_cell(tmp_path, helpers=False, env={"NF4_HELPERS_URL": PLACEHOLDER_URL})
    assert result.returncode == 0, result.stderr[-3000:]
    for name in FETCHED:
        assert (tmp_path / "work" / name).read_bytes() == (ROOT / name).read_bytes()
    assert not (tmp_path / "work" / "README.md").exists() and not (tmp_path / "work" / "scripts").exists()
    said = result.stdout if GPU else result.stdout.replace(NO_GPU_NOTE + "\n", "")
    assert " ".join(said.split()).endswith("; fetched helpers.py, timing.py, report.py, model_patch.py")

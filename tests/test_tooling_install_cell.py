"""The notebook's install cell alone, in a fresh interpreter: it installs only what is missing, never
torch or triton, says what it did in one line, pins what the requirements pin, and names the fix when
helpers.py cannot be found."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import GPU, ROOT

NOTEBOOK = ROOT / "Unsloth_Puzzles_NF4.ipynb"
PLACEHOLDER_URL = "https://raw.githubusercontent.com/REPO_OWNER/REPO_NAME/main/helpers.py"
WHERE = torch.cuda.get_device_name() if GPU else "no GPU"


def _install_cell_source():
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"]
             if c["cell_type"] == "code" and "".join(c["source"]).startswith("# @title Install")]
    assert len(cells) == 1, "the notebook must have one install cell"
    return "".join(cells[0]["source"])


# ---------------------------------------------------------------------------------------------
# The install cell alone, in a fresh interpreter (a Python, not a Jupyter kernel). For what it
# would install, importlib.metadata is told which packages to report missing or old, and `python
# -m pip` finds a stand-in that records its arguments and "installs" (reports the version given).
# ---------------------------------------------------------------------------------------------
RUN_CELL = textwrap.dedent("""
    import importlib.metadata as metadata, json, os, sys, types
    real_version = metadata.version
    def version(package):
        pretend = json.loads(open(os.environ["NF4_TEST_VERSIONS"]).read())
        if package not in pretend:
            return real_version(package)
        if pretend[package] in (None, "no-metadata"):  # "no-metadata": importable, copied in by hand
            raise metadata.PackageNotFoundError(package)
        return pretend[package]
    metadata.version = version
    import importlib.util
    real_find_spec = importlib.util.find_spec
    def find_spec(name, *args):  # a package told missing is not importable either
        pretend = json.loads(open(os.environ["NF4_TEST_VERSIONS"]).read())
        return None if name in pretend and pretend[name] is None else real_find_spec(name, *args)
    importlib.util.find_spec = find_spec
    if os.environ.get("NF4_TEST_COLAB"):
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    exec(compile(open(sys.argv[1]).read(), "install_cell", "exec"), {"__name__": "__main__"})
""")
FAKE_PIP = textwrap.dedent("""
    import json, os, sys
    def _specs(args):  # what follows the constraints file, options left out
        return [a for a in args[args.index("-c") + 2:] if not a.startswith("-")]
    args = sys.argv[1:]
    constraints = open(args[args.index("-c") + 1]).read()
    with open(os.environ["NF4_TEST_PIP_LOG"], "a") as log:
        log.write(json.dumps({"args": args, "constraints": constraints}) + "\\n")
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
    work.mkdir()
    (fake / "pip" / "__init__.py").write_text("")
    (fake / "pip" / "__main__.py").write_text(FAKE_PIP)
    (tmp_path / "cell.py").write_text(_install_cell_source())
    (tmp_path / "run_cell.py").write_text(RUN_CELL)
    (tmp_path / "versions.json").write_text(json.dumps(dict(PRESENT, **(pretend or {}))))
    if helpers:
        for name in ("helpers.py", "report.py"):
            shutil.copy(ROOT / name, work)
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("NF4_HELPERS_URL", "KAGGLE_KERNEL_RUN_TYPE", "TRITON_INTERPRET")}
    environment.update(PYTHONPATH=os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")])), NF4_TEST_VERSIONS=str(tmp_path / "versions.json"),
                       NF4_TEST_PIP_LOG=str(tmp_path / "pip.log"), **(env or {}))
    result = subprocess.run([sys.executable, str(tmp_path / "run_cell.py"), str(tmp_path / "cell.py")],
                            cwd=work, env=environment, capture_output=True, text=True, timeout=300)
    log = tmp_path / "pip.log"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def _versions():
    from importlib.metadata import version
    return {"torch": version("torch"), "triton": version("triton"), "bitsandbytes": PRESENT["bitsandbytes"]}


@pytest.mark.parametrize("runtime, env", [("Colab", {"NF4_TEST_COLAB": "1"}),
                                          ("Kaggle", {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}),
                                          ("local Python", {})])
def test_install_cell_names_the_runtime_and_installs_nothing_present(tmp_path, runtime, env):
    if runtime == "local Python" and os.path.isdir("/kaggle"):
        pytest.skip("this machine looks like Kaggle")
    result, calls = run_install_cell(tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    v = _versions()
    line = result.stdout.splitlines()[0]
    assert line.startswith(f"{runtime} ({WHERE}): nothing to install (torch {v['torch']}, triton {v['triton']}, "
                           f"bitsandbytes {v['bitsandbytes']}"), line
    assert calls == []


def test_install_cell_installs_only_what_is_missing_and_holds_torch_and_triton(tmp_path):
    result, calls = run_install_cell(tmp_path, {"matplotlib": None, "bitsandbytes": "0.45.0"})
    assert result.returncode == 0, result.stderr[-3000:]
    v = _versions()
    assert len(calls) == 1, calls
    args = calls[0]["args"]
    assert args[0] == "install" and "--no-deps" not in args
    assert args[args.index("-c") + 2:] == ["bitsandbytes==0.50.2", "matplotlib"]
    assert calls[0]["constraints"] == f"torch=={v['torch']}\ntriton=={v['triton']}\n"
    assert result.stdout.splitlines()[0] == (
        f"local Python ({WHERE}): installed bitsandbytes 0.50.2, matplotlib 1.0.test; "
        f"kept torch {v['torch']} and triton {v['triton']}")


def test_install_cell_installs_triton_only_where_torch_came_without_it(tmp_path):
    result, calls = run_install_cell(tmp_path, {"triton": None})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(calls) == 1 and "triton==3.6.0" in calls[0]["args"]
    assert calls[0]["constraints"] == f"torch=={_versions()['torch']}\n"
    assert "installed triton 3.6.0; kept torch " in result.stdout.splitlines()[0]


def test_install_cell_wants_unsloth_only_with_a_gpu(tmp_path):
    result, calls = run_install_cell(tmp_path, {"unsloth": None, "unsloth_zoo": None})
    assert result.returncode == 0, result.stderr[-3000:]
    if GPU:  # its kernels, without its dependencies
        assert [c["args"][-3:] for c in calls] == [["--no-deps", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9"]]
        assert "installed unsloth 2026.10.9 (kernels only)" in result.stdout
    else:
        assert calls == [] and "nothing to install" in result.stdout


@pytest.mark.parametrize("url, message", [
    (PLACEHOLDER_URL, "helpers.py and report.py not next to this notebook and HELPERS_URL still holds the "
                      "placeholder: run scripts/publish.sh OWNER/NAME after pushing, or upload helpers.py and "
                      "report.py next to the notebook."),
    ("file:///nonexistent/helpers.py", "Could not fetch helpers.py from file:///nonexistent/helpers.py ("),
])
def test_install_cell_names_the_fix_when_helpers_py_is_missing(tmp_path, url, message):
    result, calls = run_install_cell(tmp_path, helpers=False, env={"NF4_HELPERS_URL": url})
    assert result.returncode != 0
    assert f"RuntimeError: {message}" in result.stderr
    assert calls == [] and not (tmp_path / "work" / "helpers.py").exists()


def test_install_cell_pins_what_the_requirements_pin():
    # requirements.txt is for Colab and GPU machines; triton, which those always have, is pinned
    # for CPU machines in requirements-cpu.txt
    text = (ROOT / "requirements.txt").read_text()
    cpu = dict(re.findall(r"^([A-Za-z_]+)==(\S+)", (ROOT / "requirements-cpu.txt").read_text(), re.M))
    named = set(re.findall(r"^([A-Za-z_]+)", text, re.M)) | {"triton"}
    pins = dict(re.findall(r"^([A-Za-z_]+)==(\S+)", text, re.M), triton=cpu["triton"])
    cell = dict(re.findall(r'"([A-Za-z_]+)": "([^"]+)"', _install_cell_source()))
    assert {"bitsandbytes", "unsloth", "unsloth_zoo", "transformers", "peft"} <= set(cell)
    for name, spec in cell.items():
        assert name in named, f"the install cell installs {name}, which no requirements file names"
        if "==" in spec:
            assert spec == f"{name}=={pins[name]}", (spec, pins.get(name))
        else:
            assert spec == name and name not in pins, (spec, pins.get(name))


def test_install_cell_counts_a_package_without_metadata_as_present(tmp_path):
    # bitsandbytes importable but with no package metadata (the GPU machine here has it so)
    result, calls = run_install_cell(tmp_path, {"bitsandbytes": "no-metadata"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == [] and "bitsandbytes present" in result.stdout.splitlines()[0]

"""The paste unit as users paste it: the cells tagged `kernel` (kernel, wrapper and launch path),
alone, in a fresh process (no model patch, no helpers.py), exact against bitsandbytes and fast on a
GPU; within its size and free of generated code; imported as a module, with model_patch.py beside
it; and TRITON_INTERPRET read as Triton reads it."""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT
from benchmarks.cells import NOTEBOOK, PASTE_UNIT, kernel_cell_sources

# How the paste unit must read (people paste and maintain it): plain code, in numbers
PASTE_UNIT_LINES = 560  # the kernel, its wrapper and its launch path, comments included
LAUNCH_CELL_LINES = 150  # the launch path alone
HEADER_LINES = 12       # the launch path's opening comment: its rule, then the private APIs it uses
MEAN_CODE_LINE = 60     # characters, over lines that are neither blank nor a comment
MAX_LAMBDAS = 2
MAX_SHORT_NAMES = 4     # names of one or two characters, beyond these:
USUAL_SHORT_NAMES = {"i", "j", "k", "n", "W", "x"}
MAX_FUNCTION_LINES = 40  # a host function (a Triton kernel is one GPU program, longer)
GPU = torch.cuda.is_available()
EXACT_CHECK = textwrap.dedent("""
    import bitsandbytes as bnb, bitsandbytes.functional as bnbf, json, torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results, layers = {}, []
    for out, inp, dtype in ((64, 256, torch.float16), (32, 320, torch.bfloat16), (1, 128, torch.float32)):
        torch.manual_seed(out)
        layer = bnb.nn.Linear4bit(inp, out, bias=None, compute_dtype=dtype, quant_type="nf4").to(device)
        layer.weight.quant_state.dtype = dtype
        W, qs = layer.weight, layer.weight.quant_state
        layers.append(layer)
        ref = bnbf.dequantize_4bit(W, qs)
        got = [triton_dequantize_nf4(layer), dequantize_nf4(W, qs), dequantize_nf4(W.t(), qs),
               triton_dequantize_nf4(layer)]
        results[f"{out}x{inp}"] = all(torch.equal(g, r) for g, r in zip(got, (ref, ref, ref.t(), ref)))
    results["plans"] = len(_plans)
    results["interpreted"] = INTERPRETED
""")


def _paste_unit():
    return "\n".join(kernel_cell_sources(NOTEBOOK, PASTE_UNIT))


def _run(script, cwd, **env):
    environment = dict(os.environ, **env)
    if not GPU:
        environment.setdefault("TRITON_INTERPRET", "1")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=environment, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _bound_names(tree):
    """Every name the source binds: assignment and loop targets, parameters, definitions, imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.arg):
            yield node.arg
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, ast.alias):
            yield node.asname or node.name.split(".")[0]
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name


def _top_level_functions(tree):
    """The cells' top-level functions, those defined under a top-level `if` included."""
    for node in tree.body:
        for inner in [node, *(node.body + node.orelse if isinstance(node, ast.If) else [])]:
            if isinstance(inner, ast.FunctionDef):
                yield inner


def test_the_paste_unit_reads_plainly_and_generates_no_code():
    cells = kernel_cell_sources(NOTEBOOK, PASTE_UNIT)
    source = "\n".join(cells)
    tree = ast.parse(source)
    lines = sum(len(cell.splitlines()) for cell in cells)
    assert lines <= PASTE_UNIT_LINES, f"the paste unit is {lines} lines"
    launch_cell = len(cells[-1].splitlines())
    assert launch_cell <= LAUNCH_CELL_LINES, f"the launch path is {launch_cell} lines"
    code = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    mean = sum(map(len, code)) / len(code)
    assert mean <= MEAN_CODE_LINE, f"the mean code line is {mean:.1f} characters"
    assert ":=" not in source and "noqa" not in source
    assert sum(isinstance(node, ast.Lambda) for node in ast.walk(tree)) <= MAX_LAMBDAS
    short = sorted({name for name in _bound_names(tree) if len(name) <= 2} - USUAL_SHORT_NAMES)
    assert len(short) <= MAX_SHORT_NAMES, f"short names: {short}"
    undocumented = [f.name for f in _top_level_functions(tree) if not ast.get_docstring(f)]
    assert not undocumented, f"top-level functions without a docstring: {undocumented}"
    jitted = {f.name for f in _top_level_functions(tree) if "jit" in ast.unparse(f.decorator_list)}
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name not in jitted
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert not re.search(r"\b(exec|eval)\s*\(|\bcompile\s*\(\s*['\"f]", source), "generated code"
    notebook_cells = json.loads(NOTEBOOK.read_text())["cells"]
    tags = {tag for c in notebook_cells for tag in c.get("metadata", {}).get("tags", [])}
    assert "fast-launch" not in tags, "a launch-path cell outside the paste unit"


def test_the_launch_path_opens_with_its_rule_and_every_private_api_it_uses():
    # the rule first ("a plan launches only on what this call checked"), then every torch._C name any cell uses
    # and the Triton internals the launch path reads, as unsloth's triton_launch.py opens; what the header says
    # each case takes is held by what the code does, in
    # test_launch_offline.py::test_each_case_the_header_names_takes_the_launches_it_says
    cells = kernel_cell_sources(NOTEBOOK, PASTE_UNIT)
    launch_path = cells[-1].splitlines()
    header = []
    for line in launch_path[1:]:  # after the title
        if not line.startswith("#"):
            break
        header.append(line)
    assert len(header) <= HEADER_LINES, f"the header is {len(header)} lines"
    text = " ".join(line.lstrip("# ") for line in header)
    assert text.startswith("The rule: a plan launches only on what this call checked.")
    source = "\n".join(cells)
    used = {"CompiledKernel.run", ".function", ".packed_metadata", "arg_names", "pre_run_hooks", "knobs"}
    assert "compiled.run" in source and "compiled.function" in source and "compiled.packed_metadata" in source
    assert ".arg_names" in source and ".pre_run_hooks" in source and "triton, \"knobs\"" in source
    used |= set(re.findall(r"torch\._C\.(\w+)", source))  # torch._C.name
    used |= set(re.findall(r"getattr\(torch\._C, \"(\w+)\"", source))  # getattr(torch._C, "name", None)
    assert used >= {"_cuda_exchangeDevice", "_cuda_getCurrentRawStream", "DisableTorchFunctionSubclass"}
    missing = sorted(name for name in used if name not in text)
    assert not missing, f"private APIs the cells use that the header does not name: {missing}"


def test_without_a_private_torch_entry_every_call_is_tritons_launch(tmp_path):
    # the header's promise: a torch._C entry the launch path needs is missing (another torch), so FAST_LAUNCH
    # is off and every call is Triton's. _cuda_exchangeDevice stands for the three: Triton's driver calls the
    # other two, so deleting those would break it, not only the launch path (the weights here are on the
    # current GPU: nothing calls _cuda_exchangeDevice but the launch path)
    entry = "_cuda_exchangeDevice"
    pasted = tmp_path / "pasted.py"
    pasted.write_text(f"import torch\nif hasattr(torch._C, {entry!r}):\n    delattr(torch._C, {entry!r})\n" + _paste_unit() + "\n" + EXACT_CHECK
                      + "results['fast_launch'] = FAST_LAUNCH\nprint(json.dumps(results))\n")
    report = _run(pasted, tmp_path)
    assert report["fast_launch"] is False and report["plans"] == 0
    assert all(v for k, v in report.items() if "x" in k), report


@pytest.mark.parametrize("setting, interpreted", [(None, "0"), ("1", "0"), ("0", "0"), ("1", "1")])
def test_nf4_fast_launch_0_leaves_every_call_to_tritons_launch(tmp_path, setting, interpreted):
    # the header's promise, read where the cells are pasted; the torch._C entries the launch path needs are
    # stood in for where this torch lacks them (a CPU build), so only the setting and TRITON_INTERPRET decide
    stand_ins = ("import torch\nfor name in ('_cuda_exchangeDevice', '_cuda_getCurrentRawStream', '_cuda_getDevice'):\n"
                 "    if not hasattr(torch._C, name):\n        setattr(torch._C, name, lambda *a: 0)\n")
    pasted = tmp_path / "pasted.py"
    pasted.write_text(stand_ins + _paste_unit() + "\nimport json\nprint(json.dumps({'fast_launch': FAST_LAUNCH}))\n")
    environment = {} if setting is None else {"NF4_FAST_LAUNCH": setting}
    report = _run(pasted, tmp_path, TRITON_INTERPRET=interpreted, **environment)
    assert report["fast_launch"] is (setting != "0" and interpreted == "0")


@pytest.mark.parametrize("missing", [0, 1], ids=["the kernel cell", "the wrapper cell"])
def test_a_cell_pasted_without_the_one_it_needs_says_which(tmp_path, missing):
    cells = kernel_cell_sources(NOTEBOOK, PASTE_UNIT)
    pasted = tmp_path / "pasted.py"
    pasted.write_text("\n".join(cells[:missing] + cells[missing + 1:]))
    environment = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, str(pasted)], capture_output=True, text=True,
                            env=environment, cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    title = cells[missing].splitlines()[0].split(":")[0]  # "# @title The kernel"
    assert f"Run or paste {title[len('# @title '):].lower()} cell first" in result.stderr, result.stderr[-1500:]


def test_the_paste_unit_alone_is_exact_and_fast(tmp_path):
    pasted = tmp_path / "pasted.py"
    pasted.write_text(_paste_unit() + "\n" + EXACT_CHECK + "print(json.dumps(results))\n")
    report = _run(pasted, tmp_path)
    assert all(v for k, v in report.items() if "x" in k), report
    # on a GPU every weight's later calls go through a plan, one for W and one for W.t() (the key holds W's
    # shape); the interpreter launches each call
    assert report["plans"] == (6 if GPU else 0), report


@pytest.mark.skipif(GPU, reason="on a GPU any TRITON_INTERPRET value would move the kernel to the CPU")
def test_triton_interpret_is_read_as_triton_reads_it(tmp_path):
    # Triton 3.4+ takes "true", "on" and "yes" too (its knobs), older Tritons "1" alone: the paste
    # unit must follow whichever the installed Triton does, never disagree with it
    pasted = tmp_path / "pasted.py"
    pasted.write_text(_paste_unit() + "\n" + EXACT_CHECK + "print(json.dumps(results))\n")
    import triton
    knobs = getattr(triton, "knobs", None)
    os.environ["NF4_PROBE"] = "true"
    try:
        interprets = knobs.env_bool("NF4_PROBE").get() if knobs is not None else False
    finally:
        del os.environ["NF4_PROBE"]
    if not interprets:
        pytest.skip(f"Triton {triton.__version__} does not read TRITON_INTERPRET=true as on")
    report = _run(pasted, tmp_path, TRITON_INTERPRET="true")
    assert report["interpreted"] and all(v for k, v in report.items() if "x" in k), report


@pytest.mark.gpu
def test_interpreted_beside_a_gpu_the_gpus_weights_get_bitsandbytes_bits(tmp_path):
    # TRITON_INTERPRET=1 on a machine with a GPU (debugging a kernel): the interpreter runs the kernel on the CPU,
    # on copies of the GPU's tensors, so the interpreter's arithmetic holds whatever the GPU: no inline PTX (which
    # it cannot run), bf16 rounded by hand (its cast truncates)
    pasted = tmp_path / "pasted.py"
    pasted.write_text(_paste_unit() + "\n" + EXACT_CHECK + "print(json.dumps(results))\n")
    report = _run(pasted, tmp_path, TRITON_INTERPRET="1")
    assert report["interpreted"] and report["plans"] == 0
    assert all(v for k, v in report.items() if "x" in k), report


def test_the_cells_work_imported_as_a_module(tmp_path):
    # the paste unit saved as nf4.py and imported, model_patch.py beside it and handed nf4's public
    # dequantize_nf4: the launch path lives in the module whose dequantize_nf4 uses it
    (tmp_path / "nf4.py").write_text(_paste_unit())
    shutil.copy(ROOT / "model_patch.py", tmp_path)
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent("""
        import bitsandbytes as bnb, bitsandbytes.functional as bnbf, json, torch
        import model_patch, nf4
        device = "cuda" if torch.cuda.is_available() else "cpu"
        layer = bnb.nn.Linear4bit(256, 64, bias=None, compute_dtype=torch.bfloat16).to(device)
        W, qs = layer.weight, layer.weight.quant_state
        reference = bnbf.dequantize_4bit(W, qs)
        with model_patch.use_triton_dequantize(nf4.dequantize_nf4):
            got = [bnbf.dequantize_4bit(W, qs) for _ in range(3)]
        print(json.dumps({"exact": all(torch.equal(g, reference) for g in got),
                          "triton_calls": model_patch.PATCH_CALLS["dequantize_4bit", "triton"],
                          "plans": len(nf4._plans)}))
    """))
    report = _run(script, tmp_path)
    assert report["exact"] and report["triton_calls"] == 3, report
    assert report["plans"] == (1 if GPU else 0), report

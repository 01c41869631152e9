"""The launch path's soundness as a property, checked by a stateful differential fuzzer (launch_fuzz.py): every
call returns bitsandbytes' result or the error a fresh validation raises, whatever people did to the weight, its
quant state, the current GPU or Triton's state before it.

On a CPU it runs over the stand-in GPUs, in a process of its own: once on a fixed seed (the same examples every
run) and once on fresh ones. On a GPU it runs against bitsandbytes itself; NF4_FUZZ_EXAMPLES sets how many
examples (the closing runs: 2,000 on one GPU and on two)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("launch_fuzz.py")
GPU = torch.cuda.is_available()


def _fuzz(*arguments, timeout=600):
    result = subprocess.run([sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(report))
    assert report["failure"] is None, report["failure"] + "\n" + result.stderr[-6000:]
    assert report["first_finding"] is None and report["first_error"] is None, report
    return report


@pytest.mark.skipif(GPU, reason="the stand-in replaces Triton's driver: on a GPU the fuzzer runs on the GPU")
@pytest.mark.parametrize("seed", ["fixed", "fresh"])
def test_the_fuzzer_finds_nothing_on_the_stand_in_gpus(seed):
    # item 5: the two within 90 s in CI, where Triton's cache starts empty and each kind a run reaches compiles (about
    # 0.3 s each, 166 in 800 examples). Wall time so on a 2-core machine: 800 each, 142 s and 106 s; 150 each, 36 s
    # and 38 s
    arguments = ["--backend", "stand-in", "--examples", "150", "--steps", "30"]
    report = _fuzz(*arguments, *(["--fixed-seed"] if seed == "fixed" else []))
    # it reaches every outcome: bits through a plan, bits after validation, refusals
    assert {"bits through a plan", "bits, validated", "refused"} <= set(report["outcomes"]), report
    assert report["calls"] > 1000, report


@pytest.mark.gpu
def test_the_fuzzer_finds_nothing_on_this_machines_gpus():
    examples = os.environ.get("NF4_FUZZ_EXAMPLES", "100")
    report = _fuzz("--backend", "gpu", "--examples", examples, "--steps", "30", timeout=3000)
    assert {"bits through a plan", "bits, validated", "refused"} <= set(report["outcomes"]), report


# the fixes of the launch path's known faults, each undone in a copy of the notebook: the fuzzer must find each.
# (Two are left out, as no longer faults since a plan holds its table: the kept tables made anew by the wrapper cell run
# again (a plan made by another validate is not used either), and a racing thread's table kept over the first one
# (the first call's plan holds the first). No call of the fuzzer's reads a freed table; a CUDA graph captured before
# the wrapper cell ran again still would, which no rule generates. A third is left out since the codebooks are
# bitsandbytes' own decoding, looked up by the quant type's hash: the fuzzer's quant type, a str subclass equal to
# anything and hashed as its value, reads its value's table, as bitsandbytes' op reads its str value. Its refusal, for
# any str subclass, stays: a subclass hashed as another value would read that value's table.)
REVERTED_FIXES = {
    "tensors read by size, not shape (W.unsqueeze_(0), W.data = a (1, n) view, an offset of more dimensions)":
        ("storage.data_ptr(), t.dtype, t.shape,", "storage.data_ptr(), t.dtype, t.numel(),"),
    "tensors read without dtype, shape and contiguity (another dtype or size at the same address)":
        ("storage.data_ptr(), t.dtype, t.shape,\n                        t.is_contiguous(), ", "storage.data_ptr(), "),
    "a tensor's sign bit unkeyed (a lazily negated view at its address)":
        ("t.get_device(), t.is_neg(), t.storage_offset(),", "t.get_device(), t.storage_offset(),"),
    "a tensor's storage unkeyed (its storage shrunk at its address by resize_)":
        ("t.is_neg(), t.storage_offset(),\n                        storage.nbytes())", "t.is_neg())"),
    "W's conjugate bit unkeyed (W.data = its bytes as a complex tensor's conjugate)":
        ("key = [*values, W.is_conj()]", "key = [*values]"),
    "a plan kept though its call made a temporary (a table decoded during graph capture)":
        ("if key is not None and not layout.temporary and", "if key is not None and"),
    "the fields read twice, by the key and again by validation":
        ("layout = checks(W, quant_state, state)", "layout = checks(W, quant_state)"),
    "validation of the quant state's tensors themselves, not aliases (t.data = ... and back during a first call)":
        ("return tuple(v.detach() if isinstance(v, torch.Tensor) else v for v in values)", "return values"),
    "a field of another type keyed by its value (nested as a tensor changed in place)":
        ("if (tuple(map(type, values)) != FIELD_TYPES[:len(values)]", "if (not values"),
    "a tensor of any type keyed (a proxy forwarding to W)":
        ("key += (isinstance(t, torch.Tensor), storage.data_ptr(),", "key += (storage.data_ptr(),"),
    "a launch hook read by its truth (one that reads as False)":
        ("if hook is not None and (not isinstance(hook, HOOK_CHAIN) or hook.calls):",
         "if hook and (not isinstance(hook, HOOK_CHAIN) or hook.calls):"),
    "a plan launched whatever the launch configuration (a LAUNCH_CONFIGS entry changed in place)":
        ("\n            and config is launch_config(capability))", ")"),
    "validation reading BLOCKSIZES at each call (assigned from another cell: a plan made before answers)":
        ("or blocksize not in blocksizes:", "or blocksize not in BLOCKSIZES:"),
    "a plan used whatever checks made it (the wrapper cell run again, its blocksize check edited)":
        ("kernel is _dequantize_4bit_kernel and checks is validate", "kernel is _dequantize_4bit_kernel"),
    "the key's tensors not held until the launch (a field made anew at each read)":
        ("return tuple(key), storages", "return tuple(key), ()"),
    "the key's tensors held, not their storages (a `t.data =` swap between a call's key and its launch)":
        ("return tuple(key), storages", "return tuple(key), tensors"),
    "the quant state's tensors read through a subclass's __torch_function__ (one copying when detached)":
        ("with contextlib.nullcontext() if _is_compiling() else _plain_tensors():\n        fields",
         "with contextlib.nullcontext():\n        fields"),
    "key_of raising what it does not name (a field set to the tensor class)":
        ("except Exception:  # (validation names it)", "except (AttributeError, RuntimeError):  # (validation names it)"),
    "a plan launched under a dispatch mode (a FakeTensorMode's output holds no memory)":
        ("if _traced() or not FAST_LAUNCH", "if _is_compiling() or not FAST_LAUNCH"),
    "Triton's launch under a dispatch mode (make_fx records no kernel)":
        ("if _traced():  # the op below", "if _is_compiling():  # the op below"),
    "a table made in torch's default dtype (bfloat16, float16 or float64: the wrapper cell or a traced call under it)":
        ("    decode = torch.ops.bitsandbytes.dequantize_4bit\n    return decode(packed, absmax, 64, quant_type, [1, 64], torch.float32)[0, :16]",
         "    return bitsandbytes.functional.get_4bit_type(quant_type, device)"),
    "a call under a torch.func transform taken as a plain one (its output a wrapper without storage)":
        ("\n            or _functorch.peek_interpreter_stack() is not None)", ")"),
    "what torch.func's grad wraps not read through its wrapper (a wrapper holds no storage)":
        ("    while _functorch.is_gradtrackingtensor(tensor):", "    while False:"),
    "tensors without memory accepted (a zero tensor)":
        ("if tensor.data_ptr() == start or tensor.untyped_storage()", "if tensor.untyped_storage()"),
    "the torch op launched on the current GPU (a dispatch mode's call of a weight on another GPU)":
        ("    with on_its_gpu:\n        launch_via_triton(layout, out, config, capability, not INTERPRETED)",
         "    launch_via_triton(layout, out, config, capability, not INTERPRETED)"),
    "only the launch hooks checked (a compile hook; on Triton 3.7+ the stages inspection hook)":
        ('and not name.startswith(("_", "add_pre_", "kernel_"))', 'and name.startswith("launch_")'),
    "a shape's sizes of any int type keyed (a size equal to anything)":
        ("\n                or any(type(size) is not int for size in shape)):", "):"),
    "the output made by torch.empty (accelerate's old init_empty_weights: a meta output)":
        ("out = layout.packed.new_empty(layout.shape, dtype=layout.dtype)",
         "out = torch.empty(layout.shape, dtype=layout.dtype, device=device)"),
    "a plan keeping torch.empty_strided as found at its first call, not its table's allocator (a meta output "
    "after; the kept tables cleared: the table freed)":
        ("functools.partial(layout.code.new_empty_strided, out.shape, out.stride(),\n"
         "                                   dtype=out.dtype)",
         "functools.partial(torch.empty_strided, out.shape, out.stride(),\n"
         "                                   dtype=out.dtype, device=out.device)"),
    "a state2.blocksize below 8 accepted (bitsandbytes' CUDA kernel scales 8 codes at once)":
        ("not 8 <= blocksize2 < 2**31", "not 0 < blocksize2 < 2**31"),
    "an offset of more dimensions than absmax accepted (bitsandbytes' absmax += offset cannot broadcast)":
        ("if offset.dim() > absmax.dim():", "if False:"),
}


def _notebook_with(tmp_path, old, new):
    """A copy of the notebook with `old` (once in the cells tagged kernel) replaced by `new`."""
    from benchmarks.cells import NOTEBOOK
    notebook = json.loads(NOTEBOOK.read_text())
    hits = 0
    for cell in notebook["cells"]:
        if "kernel" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"])
            hits += source.count(old)
            cell["source"] = source.replace(old, new)
    assert hits == 1, f"the cells hold {hits} of {old!r}"
    path = tmp_path / "reverted.ipynb"
    path.write_text(json.dumps(notebook))
    return path


@pytest.mark.parametrize("fix", list(REVERTED_FIXES))
def test_the_fuzzer_finds_each_fault_once_its_fix_is_undone(tmp_path, fix):
    old, new = REVERTED_FIXES[fix]
    # graph capture needs a GPU; a storage shrunk by resize_ gets its address back from a GPU's caching allocator
    # (the CPU's seldom hands it back: there, launch_offline's key_changes sees that the key holds the extent);
    # bitsandbytes' CUDA bits for a state2.blocksize below 8 are a GPU's (the stand-in compares launches only)
    needs_gpu = "graph capture" in fix or "resize_" in fix or "bitsandbytes' CUDA" in fix
    if needs_gpu != GPU:
        pytest.skip("needs a GPU" if needs_gpu else "run on the CPU stand-in")
    backend = "gpu" if GPU else "stand-in"
    arguments = [sys.executable, str(SCRIPT), "--backend", backend, "--examples", "2000", "--steps", "30",
                 "--fixed-seed", "--no-shrink"]  # (found is enough: hypothesis' shortening of the steps takes minutes)
    # on a GPU, the fixed seed's examples as a one-GPU host draws them, whatever this host has: drawn for two H200s,
    # 2,000 examples did not reach the resize_ fault (drawn for one: found in 15 s)
    if GPU:
        arguments += ["--gpus", "1"]
    environment = dict(os.environ, NF4_NOTEBOOK=str(_notebook_with(tmp_path, old, new)))
    result = subprocess.run(arguments, capture_output=True, text=True, timeout=900, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(report["failure"], report["first_finding"], report["first_error"], sep="\n")
    # (the first Finding, or other exception, raised: on a GPU, hypothesis' replay of a fault that hangs on memory
    # reuse can end in its FlakyStrategyDefinition, and a launch on freed memory can first show as the GPU's error
    # in the fuzzer's own comparison rather than as a Finding)
    assert report["failure"] is not None, report
    assert report["first_finding"] is not None or report["first_error"] is not None, report

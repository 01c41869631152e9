"""The launch path as people use it: a weight called both ways, its quant state replaced or moved,
the weight pickled, saved and copied after a call, offsets of other dtypes. Every result is
compared with bitsandbytes; on the CPU the kernel runs in the interpreter, on a GPU through the
direct launch. These tests use only dequantize_nf4 and triton_dequantize_nf4, so they run against
any version of the kernel cells (NF4_NOTEBOOK=path picks the notebook)."""
import copy
import functools
import gc
import io
import json
import os
import pickle
import subprocess
import sys
import threading
import types
import warnings
from pathlib import Path

import numpy
import pytest
import torch
import bitsandbytes.functional as bnbf

import helpers
from conftest import DEVICE
from reference import assert_same_bits, changed_value, references


def _layer(shape=(96, 320), dtype=torch.bfloat16, seed=0):
    return helpers.make_layer(*shape, dtype, device=DEVICE, seed=seed)


def _plan(kernel, W, qs):
    """The launch path's plan for W and qs as they read now, or None."""
    return kernel._plans.get(kernel.key_of(W, qs)[0])


def _fast(kernel, W, qs):
    """What the launch path's plan for W and qs gives, or None where there is none."""
    plan = _plan(kernel, W, qs)
    if plan is None:
        return None
    return kernel.launch(plan)


def _assert_bnb(out, W, qs):
    refs = references(W, qs)
    assert refs
    for name, ref in refs.items():
        assert_same_bits(out, ref, name)


def test_a_shape_of_numpy_ints_is_read_as_python_ints(kernel):
    # a torch.Size keeps numpy ints, whose product wraps (in int8, 16 * 64 is 0): read as ints, the shape is 16x64
    layer = _layer(shape=(16, 64), seed=71)
    W, qs = layer.weight, layer.weight.quant_state
    expected = bnbf.dequantize_4bit(W, qs)
    qs.shape = torch.Size([numpy.int8(size) for size in qs.shape])
    try:
        out = kernel.dequantize_nf4(W, qs)
    except ValueError as error:
        pytest.fail(f"a 16x64 shape of numpy ints refused: {error}")
    assert_same_bits(out, expected, "numpy int8 sizes")


def test_transposed_call_after_the_plain_one(kernel):
    # bitsandbytes' own Linear4bit and unsloth's LoRA code pass W.t(); the procedure passes W
    layer = _layer()
    W, qs = layer.weight, layer.weight.quant_state
    for packed in (W, W.t(), W, W.t().t(), W.t()):
        _assert_bnb(kernel.dequantize_nf4(packed, qs), packed, qs)


@pytest.mark.parametrize("field", ["state2.absmax", "state2.code", "absmax", "code", "offset"])
def test_quant_state_tensor_replaced_after_a_call(kernel, field):
    # loading a checkpoint replaces these tensors; the next call must read the new ones
    layer, donor = _layer(seed=1), _layer(seed=2)
    W, qs = layer.weight, layer.weight.quant_state
    kernel.triton_dequantize_nf4(layer)
    owner, name = (qs.state2, field[7:]) if field.startswith("state2.") else (qs, field)
    donor_owner = donor.weight.quant_state.state2 if field.startswith("state2.") else donor.weight.quant_state
    setattr(owner, name, getattr(donor_owner, name).clone())
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)


def test_weight_storage_replaced_after_a_call(kernel):
    layer = _layer(seed=5)
    W = layer.weight
    kernel.triton_dequantize_nf4(layer)
    W.data = W.data.clone()
    W.data.random_(0, 256)
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, W.quant_state)


def test_output_dtype_changed_after_a_call(kernel):
    layer = _layer(dtype=torch.float16, seed=6)
    kernel.triton_dequantize_nf4(layer)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        layer.weight.quant_state.dtype = dtype
        _assert_bnb(kernel.triton_dequantize_nf4(layer), layer.weight, layer.weight.quant_state)


def test_a_broken_quant_state_after_a_good_call_is_refused(kernel):
    layer = _layer(seed=7)
    kernel.triton_dequantize_nf4(layer)
    layer.weight.quant_state.dtype = torch.int8
    with pytest.raises(TypeError, match="output dtype torch.int8"):
        kernel.triton_dequantize_nf4(layer)


def test_weight_pickles_saves_and_copies_after_a_call(kernel):
    mlp = helpers.MLP(128, 256, torch.bfloat16, DEVICE)
    expected = [kernel.triton_dequantize_nf4(layer) for layer in mlp.layers()]
    for layer in mlp.layers():
        restored = pickle.loads(pickle.dumps(layer.weight))
        assert torch.equal(restored.data, layer.weight.data)
    buffer = io.BytesIO()
    torch.save(mlp, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    copied = copy.deepcopy(mlp)
    for model in (loaded, copied):
        for layer, ref in zip(model.layers(), expected):
            assert torch.equal(kernel.triton_dequantize_nf4(layer), ref)


def test_bitsandbytes_makes_an_fp32_offset_and_another_dtype_is_refused(kernel):
    # the offset bitsandbytes makes is absmax.mean() of its fp32 absmax, kept fp32 through .to(), a copy, a
    # state dict; one of another dtype is refused by name (never converted: a plan keeps no temporary)
    layer = _layer(seed=8)
    W, qs = layer.weight, layer.weight.quant_state
    assert qs.offset.dtype == torch.float32 and qs.offset.numel() == 1
    loaded = bnbf.QuantState.from_dict(qs.as_dict(packed=True), device=W.device)
    assert loaded.offset.dtype == torch.float32
    qs.offset = qs.offset.double()
    with pytest.raises(TypeError, match=r"quant_state\.offset must be torch\.float32, got torch\.float64"):
        kernel.triton_dequantize_nf4(layer)


@pytest.mark.gpu  # Triton's interpreter patches triton.language while it runs: one thread only
def test_many_threads_at_once(kernel):
    layers = [_layer(seed=10 + i) for i in range(4)]
    expected = [bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state) for layer in layers]
    failures = []

    def work(layer, ref):
        try:
            for _ in range(50):
                if not torch.equal(kernel.triton_dequantize_nf4(layer), ref):
                    failures.append("different values")
        except Exception as error:  # an exception in a thread would otherwise pass unseen
            failures.append(repr(error))

    threads = [threading.Thread(target=work, args=pair) for pair in zip(layers, expected)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


def test_nothing_is_stored_on_bitsandbytes_objects(kernel):
    layer = _layer(seed=20)
    qs = layer.weight.quant_state
    before, state2 = dict(vars(qs)), dict(vars(qs.state2))
    kernel.triton_dequantize_nf4(layer)
    kernel.triton_dequantize_nf4(layer)
    assert vars(qs) == before and vars(qs.state2) == state2, "dequantize_nf4 changed the QuantState"


def test_bitsandbytes_table_is_kept_once_per_device_and_quant_type(kernel):
    # the kernel decodes with bitsandbytes' own table, one 64-byte tensor per device and quant type,
    # made on first use and kept for the process: the only GPU memory the cells keep
    layers = [_layer(seed=22 + i) for i in range(2)]
    key = (layers[0].weight.device, "nf4")
    tables = []
    for layer in layers:
        kernel.triton_dequantize_nf4(layer)
        tables.append(kernel._TABLES[key])
    assert tables[0] is tables[1], "a second weight made a second table"
    assert torch.equal(tables[0], bnbf.get_4bit_type("nf4", tables[0].device))
    for (device, quant_type), table in kernel._TABLES.items():
        assert (table.dtype, table.numel(), table.device) == (torch.float32, 16, device), quant_type


@pytest.mark.gpu  # (the interpreter makes no plans)
def test_a_plan_holds_no_tensor_but_its_table_and_the_plans_kept_are_bounded(kernel, monkeypatch):
    # a plan holds addresses read off W and its quant state, and of tensors only the table it reads (through
    # new_output, its allocator), the one _TABLES keeps (nothing more stays on the GPU through it); at most
    # PLANS_KEPT are kept (when full, all are dropped before the next), and a dropped weight plans again on its
    # next call
    layers = [_layer(shape=(32, 64), seed=26 + i) for i in range(5)]
    kernel.triton_dequantize_nf4(layers[0])
    plan = _plan(kernel, layers[0].weight, layers[0].weight.quant_state)
    assert plan is not None and not [value for value in plan if isinstance(value, torch.Tensor)]
    assert any(table is plan.new_output.func.__self__ for table in kernel._TABLES.values())
    monkeypatch.setattr(kernel, "PLANS_KEPT", 3)
    kernel._plans.clear()
    for layer in layers:
        kernel.triton_dequantize_nf4(layer)
        assert 1 <= len(kernel._plans) <= 3
    for layer in layers:
        _assert_bnb(kernel.triton_dequantize_nf4(layer), layer.weight, layer.weight.quant_state)


@pytest.mark.gpu
def test_the_fast_launch_answers_later_calls_and_can_be_left_out(kernel, monkeypatch):
    layer = _layer(seed=21)
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):  # a plan is made by the first call, or the second where the kernel is new
        kernel.triton_dequantize_nf4(layer)
    fast = _fast(kernel, W, qs)
    assert fast is not None, "the fast launch declined on this Triton"
    _assert_bnb(fast, W, qs)
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)
    monkeypatch.setattr(kernel, "FAST_LAUNCH", False)  # NF4_FAST_LAUNCH=0: Triton's launch every call
    other = _layer(seed=22)
    for _ in range(2):
        _assert_bnb(kernel.triton_dequantize_nf4(other), other.weight, other.weight.quant_state)


@pytest.mark.gpu
@pytest.mark.parametrize("constant, value", [("MIN_CAPABILITY", (99, 0)), ("MIN_CAPABILITY", [7, 0]),
                                             ("MIN_CAPABILITY", (7, [0])), ("BLOCKSIZES", (32,)),
                                             ("BLOCKSIZES", (32, 64, [8192])), ("BLOCKSIZES", "a tensor")])
def test_a_constant_validation_reads_assigned_from_another_cell_changes_no_call(kernel, monkeypatch, constant,
                                                                                value):
    # validation took it as the wrapper cell ran: a weight's plan and a new weight's first call stay exact
    layer, new_layer = _layer(seed=23), _layer(seed=26)
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    plan = _plan(kernel, W, qs)
    assert plan is not None, "no plan to answer the next call"
    monkeypatch.setattr(kernel, constant, torch.tensor(kernel.BLOCKSIZES) if value == "a tensor" else value)
    for _ in range(2):
        _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)
        _assert_bnb(kernel.triton_dequantize_nf4(new_layer), new_layer.weight, new_layer.weight.quant_state)
    assert _plan(kernel, W, qs) is plan


@pytest.mark.gpu
@pytest.mark.parametrize("literal, edited, error", [("MIN_CAPABILITY = (7, 0)", "MIN_CAPABILITY = (99, 0)",
                                                     "has compute capability"),
                                                    ("BLOCKSIZES = (32, 64, 128,", "BLOCKSIZES = (32, 128,",
                                                     "blocksize 64 is not one of")])
def test_a_constant_edited_in_the_wrapper_cell_run_again_refuses_a_weight_with_a_plan(kernel, literal, edited,
                                                                                      error):
    # the cell's own way to change it: edited and run again, its checks (and a plan made before) read the new value
    from benchmarks.cells import NOTEBOOK, kernel_cell_sources
    wrapper = kernel_cell_sources(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)))[1]
    assert wrapper.count(literal) == 1, literal
    layer = _layer(seed=27)
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    assert _plan(kernel, W, qs) is not None, "no plan to answer the next call"
    try:
        exec(wrapper.replace(literal, edited), vars(kernel))
        with pytest.raises((RuntimeError, ValueError), match=error):
            kernel.triton_dequantize_nf4(layer)
    finally:
        exec(wrapper, vars(kernel))
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)


@pytest.mark.gpu
def test_a_new_weight_of_a_known_kernel_gets_its_plan_on_its_first_call(kernel):
    # a kind's compiled kernel, from Triton's launch of its first weight, launches every later weight of
    # the kind directly from that weight's first call: a model's later layers are fast from their first call
    first, second = _layer(shape=(64, 512), seed=24), _layer(shape=(64, 512), seed=25)
    kernel.triton_dequantize_nf4(first)
    kernel.triton_dequantize_nf4(second)
    fast = _fast(kernel, second.weight, second.weight.quant_state)
    assert fast is not None, "a weight whose kernel Triton launched before had no plan after a call"
    _assert_bnb(fast, second.weight, second.weight.quant_state)


@pytest.mark.gpu
@pytest.mark.parametrize("called_first", ["W", "W.t()"])
def test_both_views_of_a_weight_take_the_fast_launch(kernel, called_first):
    # the procedure and models pass W; bitsandbytes' Linear4bit and unsloth's LoRA pass W.t(), a new
    # object each call: each view (its shape is in the key) plans on its first call, and a new W.t()
    # object is answered by the plan of the W.t() before it
    layer = _layer(shape=(64, 320), seed=23)
    W, qs = layer.weight, layer.weight.quant_state
    views = (W, W.t()) if called_first == "W" else (W.t(), W)
    for view in views:
        _assert_bnb(kernel.dequantize_nf4(view, qs), view, qs)
    through_triton = kernel.dequantize_nf4_via_triton(W, qs)
    for view in (W, W.t(), W, W.t()):
        fast = _fast(kernel, view, qs)
        assert fast is not None, f"{called_first} first: the fast launch declined a later call"
        _assert_bnb(fast, view, qs)
    fast = _fast(kernel, W, qs)
    assert (fast.shape, fast.stride(), fast.dtype, fast.device) == (
        through_triton.shape, through_triton.stride(), through_triton.dtype, through_triton.device)


@pytest.mark.gpu
def test_every_field_is_checked_on_every_call(kernel):
    # a plan checks every field of QUANT_STATE_FIELDS / STATE2_FIELDS on every call (tensors by address, the
    # rest by value): each changed field must send the next call back through validation, which answers
    # it (with bitsandbytes' bits) or refuses it by name, as bitsandbytes' dequantize_4bit would not work
    fields = [(None, name) for name in kernel.QUANT_STATE_FIELDS]
    fields += [("state2", name) for name in kernel.STATE2_FIELDS]
    checked = 0
    for owner_name, name in fields:
        layer = _layer(seed=30)
        W, qs = layer.weight, layer.weight.quant_state
        kernel.triton_dequantize_nf4(layer)
        assert _fast(kernel, W, qs) is not None
        owner = qs if owner_name is None else getattr(qs, owner_name)
        replacement = changed_value(getattr(owner, name))
        if replacement is None:
            continue
        setattr(owner, name, replacement)
        assert _fast(kernel, W, qs) is None, f"changing {owner_name or 'quant_state'}.{name} went unseen"
        try:
            out = kernel.triton_dequantize_nf4(layer)
        except (TypeError, ValueError) as error:
            assert str(error).startswith("dequantize_nf4: "), error
        else:  # (bit for bit: FP4's code 0b1000 is -0.0 in bitsandbytes' kernels and in the table read)
            assert_same_bits(out, bnbf.dequantize_4bit(W, qs), f"{owner_name or 'quant_state'}.{name}")
        checked += 1
    assert checked >= 11


@pytest.mark.gpu
@pytest.mark.parametrize("field", ["absmax", "state2.absmax", "offset", "code", "state2.code", "W"])
def test_a_tensor_swapped_in_place_after_a_call(kernel, field):
    # `t.data = other` keeps the object and moves its bytes (the old ones may be freed and reused): the next
    # call must give the new state's bits, as bitsandbytes' dequantize_4bit and unsloth's fast_dequantize do
    layer, donor = _layer(seed=33), _layer(seed=34)
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    owner, name = (qs.state2, field[7:]) if field.startswith("state2.") else (qs, field)
    donor_state = donor.weight.quant_state
    donor_owner = donor_state.state2 if field.startswith("state2.") else donor_state
    tensor = W if field == "W" else getattr(owner, name)
    tensor.data = (donor.weight if field == "W" else getattr(donor_owner, name)).data.clone()
    before = [kernel.triton_dequantize_nf4(layer)]
    garbage = [torch.full((4096,), float("nan"), device=DEVICE) for _ in range(64)]  # the old bytes reused
    before.append(kernel.triton_dequantize_nf4(layer))
    del garbage
    for out in before:
        _assert_bnb(out, W, qs)


def _in_a_fresh_process(tmp_path, template):
    """template (a script, {root} and {tests} to fill) run in a process of its own; what it printed is shown."""
    script = tmp_path / "script.py"
    script.write_text(template.format(root=str(helpers.ROOT), tests=str(helpers.ROOT / "tests")))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    print(result.stdout[-2000:], result.stderr[-2000:])
    return result


CAPTURED = """
import sys, torch, json
sys.path[:0] = [{root!r}, {tests!r}]
import helpers, bitsandbytes.functional as bnbf
from benchmarks.cells import load_kernel_cells
kernel = load_kernel_cells()
results = {{}}
for name, shape in (("new kind, first call", (384, 512)), ("warm weight", (384, 512))):
    layer = helpers.make_layer(*shape, torch.bfloat16, seed=len(results))
    W, qs = layer.weight, layer.weight.quant_state
    if name == "warm weight":
        kernel.triton_dequantize_nf4(layer)
    reference = bnbf.dequantize_4bit(W, qs)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        out = kernel.triton_dequantize_nf4(layer)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    planned_in_capture = kernel._plans.get(kernel.key_of(W, qs)[0]) is not None
    # the freed blocks reused by small tensors, then the graph deleted and the cache emptied: every eager
    # call after must still read what it should (a plan kept from the capture would read the graph's table)
    garbage = [torch.full((16,), float("nan"), device="cuda") for _ in range(256)]
    eager = [torch.equal(kernel.triton_dequantize_nf4(layer), reference) for _ in range(2)]
    del graph
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    garbage += [torch.full((16,), float("nan"), device="cuda") for _ in range(256)]
    eager += [torch.equal(kernel.triton_dequantize_nf4(layer), reference) for _ in range(2)]
    torch.cuda.synchronize()
    results[name] = {{"replayed_exact": torch.equal(out, reference), "eager_after_exact": all(eager),
                     "planned_in_capture": planned_in_capture}}
results["tables_kept"] = len(kernel._TABLES)
print(json.dumps(results))
"""


@pytest.mark.gpu
def test_calls_captured_in_a_cuda_graph_replay_bitsandbytes_bits(tmp_path):
    # in a fresh process (no table, no kind known): a new kind's first call inside capture, then a weight
    # called once before capture; each graph replayed into an output filled with NaN first
    result = _in_a_fresh_process(tmp_path, CAPTURED)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # a process's first call, captured, copies the table into its graph alone: it keeps no plan, and the
    # eager calls after read the table they keep, also once the graph's memory is freed and reused
    assert report["new kind, first call"] == {"replayed_exact": True, "eager_after_exact": True,
                                              "planned_in_capture": False}, report
    assert report["warm weight"] == {"replayed_exact": True, "eager_after_exact": True,
                                     "planned_in_capture": True}, report
    assert report["tables_kept"] == 1  # the table decoded in the first graph is not kept; eager made one


def _gpu_layers(count, dtype=torch.bfloat16):
    return [helpers.make_layer(2048, 4096, dtype, seed=40 + i) for i in range(count)]


def _allocated_after(scenario, dequantize=None):
    """GPU memory still allocated after `scenario(layers)`, over what was allocated before the
    layers were made; the kernel called once on each layer first when `dequantize` is given."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # also frees what waits on a stream's event: nothing earlier is freed in the window
    start = torch.cuda.memory_allocated()
    layers = _gpu_layers(4)
    if dequantize is not None:
        for i in range(len(layers)):
            dequantize(layers[i])  # the output is dropped at once; no name is left holding a layer
    scenario(layers)  # the layers (what is left of them) live on while the memory is measured
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() - start


def _to_cpu(layers):
    for layer in layers:
        layer.cpu()


def _deleted(layers):
    layers.clear()


def _weight_replaced(layers):
    for layer in layers:
        layer.weight = type(layer.weight)(torch.zeros(8, 1, dtype=torch.uint8, device="cpu"),
                                          requires_grad=False)


@pytest.mark.gpu
@pytest.mark.parametrize("scenario", [_to_cpu, _deleted, _weight_replaced], ids=lambda f: f.__name__[1:])
def test_the_gpu_holds_what_bitsandbytes_alone_holds(kernel, scenario):
    # the cells keep one thing on the GPU for good, bitsandbytes' 64-byte table per device and quant
    # type (test_bitsandbytes_table_is_kept_once_per_device_and_quant_type): made here first
    kernel.bitsandbytes_table("nf4", torch.device("cuda", torch.cuda.current_device()))
    _allocated_after(scenario)  # bitsandbytes' first use keeps a little for good (1 KiB): not in the measure
    without = _allocated_after(scenario)
    with_kernel = _allocated_after(scenario, kernel.triton_dequantize_nf4)
    print(f"{scenario.__name__[1:]}: {without} B still allocated without the kernel, {with_kernel} B with it")
    assert with_kernel == without, f"{with_kernel - without} more bytes stay allocated after the kernel ran"


def _add_launch_hook(hook):
    """Set a Triton launch-enter hook where this Triton keeps it; returns how to remove it."""
    import triton
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is not None and hasattr(runtime.launch_enter_hook, "add"):  # Triton >= 3.5: a HookChain
        runtime.launch_enter_hook.add(hook)
        return lambda: runtime.launch_enter_hook.remove(hook)
    owner = runtime if runtime is not None else __import__("triton.compiler", fromlist=["x"]).CompiledKernel
    owner.launch_enter_hook = hook
    return lambda: setattr(owner, "launch_enter_hook", None)


@pytest.mark.gpu
def test_a_plan_holds_its_table_after_the_kept_tables_are_dropped(kernel):
    # the table a plan reads outlives _TABLES' reference to it: dropped, its block emptied from the cache and
    # filled with other values, a later call still reads bitsandbytes' codebook
    layer = _layer(shape=(64, 256))
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    assert _plan(kernel, W, qs) is not None
    kernel._TABLES.clear()
    gc.collect()
    torch.cuda.empty_cache()
    garbage = [torch.full((n,), float("nan"), device=DEVICE) for n in (1, 16, 64, 256) * 16]
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)
    assert garbage


@pytest.mark.gpu
@pytest.mark.parametrize("field", ["absmax", "state2.absmax", "offset"])
def test_a_field_made_anew_at_each_read_is_held_through_the_launch(kernel, field):
    # a property making a new tensor at each read (a copy, a cache rebuilt): the tensor a call read is alive until
    # its launch, whatever the output's allocation takes; every call is exact
    layer = _layer(shape=(64, 256))
    W, qs = layer.weight, copy.copy(layer.weight.quant_state)
    qs.state2 = copy.copy(qs.state2)
    owner, name = (qs.state2, "absmax") if field == "state2.absmax" else (qs, field)
    held = getattr(owner, name)
    reads = []

    def read_anew(instance):
        reads.append(None)
        return held.clone()
    owner.__class__ = type(type(owner).__name__, (type(owner),), {name: property(read_anew)})
    expected = bnbf.dequantize_4bit(W, qs)
    for _ in range(4):
        assert torch.equal(kernel.dequantize_nf4(W, qs), expected)
    assert len(reads) > 4


def test_under_a_dispatch_mode_no_table_is_kept(kernel):
    # what a mode sees may be no plain tensor (FakeTensorMode's, FunctionalTensorMode's): a table made under one is
    # the call's own; the next call outside keeps one
    from torch.utils.flop_counter import FlopCounterMode
    layer = _layer(shape=(64, 256))
    W, qs = layer.weight, layer.weight.quant_state
    kernel._TABLES.clear()
    with FlopCounterMode(display=False):
        _assert_bnb(kernel.dequantize_nf4(W, qs), W, qs)
    assert not kernel._TABLES
    _assert_bnb(kernel.dequantize_nf4(W, qs), W, qs)
    assert len(kernel._TABLES) == 1


@pytest.mark.gpu
def test_under_a_dispatch_mode_a_call_is_the_torch_op_the_mode_sees(kernel):
    # make_fx (real tensors) records the kernel as bitsandbytes' graph records its op, and the graph's replay is
    # exact; FlopCounterMode sees the op and the bits are bitsandbytes'; a weight planned before takes no plan
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.flop_counter import FlopCounterMode
    layer = _layer(shape=(64, 256))
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    graph = make_fx(lambda weight: kernel.dequantize_nf4(weight, qs))(W)
    assert "nf4_triton.dequantize_4bit.default" in {str(node.target) for node in graph.graph.nodes}
    _assert_bnb(graph(W), W, qs)
    with FlopCounterMode(display=False):
        _assert_bnb(kernel.dequantize_nf4(W, qs), W, qs)


@pytest.mark.gpu
def test_a_launch_hook_set_after_the_first_call_sees_every_later_call(kernel):
    # profilers hook Triton's launches: none of ours may bypass a hook, whenever it was set
    layer = _layer(seed=50)
    W, qs = layer.weight, layer.weight.quant_state
    kernel.triton_dequantize_nf4(layer)
    kernel.triton_dequantize_nf4(layer)
    seen = []
    remove = _add_launch_hook(lambda metadata: seen.append(metadata))
    try:
        for _ in range(3):
            _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)
    finally:
        remove()
    assert len(seen) == 3, f"the hook saw {len(seen)} of 3 launches"
    kernel.triton_dequantize_nf4(layer)
    assert len(seen) == 3 and _fast(kernel, W, qs) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("compiled_first", [True, False])
def test_eager_and_compiled_calls_launch_one_configuration(kernel, monkeypatch, compiled_first):
    # whichever runs first, eager and torch.compile calls choose their configuration the same way
    torch._dynamo.reset()  # a graph from the other order's run would be reused without a trace
    chosen = []
    choose = kernel.launch_config
    monkeypatch.setattr(kernel, "launch_config", lambda *args: chosen.append(choose(*args)) or chosen[-1])
    layer = _layer(shape=(512, 1024), seed=60 + compiled_first)
    compiled = torch.compile(kernel.triton_dequantize_nf4, fullgraph=True)
    order = [compiled, kernel.triton_dequantize_nf4] if compiled_first else [kernel.triton_dequantize_nf4, compiled]
    results = [fn(layer) for fn in order]
    assert torch.equal(results[0], results[1])
    assert len(chosen) >= 2 and len(set(chosen)) == 1, chosen


@pytest.mark.gpu
def test_a_field_emptied_after_its_tensor_died_is_not_replayed(kernel):
    # a field set to None (its tensor dies) leaves no key: validation answers, naming it
    layer = _layer(seed=32)
    W, qs = layer.weight, layer.weight.quant_state
    for _ in range(2):
        kernel.triton_dequantize_nf4(layer)
    assert _fast(kernel, W, qs) is not None
    qs.state2.absmax = None  # the only reference to the old absmax2: it dies here
    gc.collect()
    assert _fast(kernel, W, qs) is None
    with pytest.raises(ValueError, match=r"quant_state\.state2\.absmax is missing"):
        kernel.triton_dequantize_nf4(layer)


def _other_forms(qs):
    """The quant state's fields in forms people pass besides a QuantState: a SimpleNamespace (its
    state2 too), and a QuantState whose state2 is a SimpleNamespace."""
    state2 = types.SimpleNamespace(absmax=qs.state2.absmax, code=qs.state2.code, blocksize=qs.state2.blocksize,
                                   dtype=qs.state2.dtype, nested=False)
    fields = {name: getattr(qs, name) for name in ("absmax", "code", "quant_type", "offset", "dtype", "shape",
                                                   "blocksize", "nested")}
    with_namespace_state2 = copy.copy(qs)
    with_namespace_state2.state2 = state2
    return {"SimpleNamespace": types.SimpleNamespace(state2=state2, **fields),
            "state2 a SimpleNamespace": with_namespace_state2}


@pytest.mark.parametrize("form", ["SimpleNamespace", "state2 a SimpleNamespace"])
def test_a_quant_state_that_is_not_a_quantstate_gets_bitsandbytes_bits(kernel, form):
    # unsloth's launcher dequantizes these; ours must too, on every call, and raise nothing; their fields are
    # read as a QuantState's, so they are planned alike (on a GPU: the interpreter plans nothing)
    layer = _layer(seed=40)
    W, qs = layer.weight, layer.weight.quant_state
    other = _other_forms(qs)[form]
    for _ in range(3):
        _assert_bnb(kernel.dequantize_nf4(W, other), W, qs)
    assert (_plan(kernel, W, other) is not None) == (DEVICE == "cuda")


def test_a_quant_state_without_nested_is_refused_as_bitsandbytes_refuses_it(kernel):
    # bitsandbytes' dequantize_4bit decides double quantization by quant_state.nested: without it, it raises
    layer = _layer(seed=41)
    other = _other_forms(layer.weight.quant_state)["SimpleNamespace"]
    del other.nested
    with pytest.raises(ValueError, match=r"quant_state\.nested is missing"):
        kernel.dequantize_nf4(layer.weight, other)


@pytest.mark.parametrize("state2", ["object", "list", "none"])
def test_bitsandbytes_list_format_is_refused_naming_it(kernel, state2):
    # [absmax, shape, dtype, blocksize, [offset, state2] or None, quant_type, code], as bitsandbytes
    # before 0.41.2 kept it (unsloth's _unpack_quant_state still reads it)
    layer = _layer(seed=42)
    qs = layer.weight.quant_state
    stats = {"object": [qs.offset, qs.state2], "none": None,
             "list": [qs.offset, [qs.state2.absmax, qs.state2.code, qs.state2.blocksize]]}[state2]
    listed = [qs.absmax, qs.shape, qs.dtype, qs.blocksize, stats, qs.quant_type, qs.code]
    with pytest.raises(ValueError, match=r"dequantize_nf4: quant_state\.absmax is missing \(a list has none\)"):
        kernel.dequantize_nf4(layer.weight, listed)


class _RaisingLaunch:
    """A compiled kernel whose launcher raises (a sticky CUDA error, say)."""
    function, packed_metadata = 0, ()

    @staticmethod
    def run(*values):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.gpu  # (the interpreter makes no plans)
def test_an_error_a_plans_launch_raises_reaches_the_caller(kernel):
    # as Triton's own launch's would: nothing warned or given up, and once launches work the plan is used again
    layer = _layer((80, 320), seed=43)
    W, qs = layer.weight, layer.weight.quant_state
    kernel.triton_dequantize_nf4(layer)
    key = kernel.key_of(W, qs)[0]
    plan = kernel._plans[key]
    kernel._plans[key] = plan._replace(compiled=_RaisingLaunch())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeError, match="an illegal memory access"):
                kernel.triton_dequantize_nf4(layer)
    finally:
        kernel._plans[key] = plan
    _assert_bnb(kernel.triton_dequantize_nf4(layer), W, qs)
    assert torch.cuda.current_device() == 0


def _two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")


@pytest.mark.gpu
@pytest.mark.parametrize("current", [0, 1])
def test_a_weight_on_the_gpu_that_is_not_current_gets_bitsandbytes_bits(kernel, current):
    # a model split over two GPUs (accelerate's device_map="auto" makes no layer's GPU current): every call,
    # the first and its plan's, gives bitsandbytes' bits and leaves the current GPU as it was
    _two_gpus()
    layer = helpers.make_layer(96, 320, torch.bfloat16, device=f"cuda:{1 - current}", seed=44)
    W, qs = layer.weight, layer.weight.quant_state
    torch.cuda.set_device(current)
    try:
        for _ in range(3):
            out = kernel.triton_dequantize_nf4(layer)
            assert out.device == W.device and torch.cuda.current_device() == current
            _assert_bnb(out, W, qs)
        assert _plan(kernel, W, qs) is not None
    finally:
        torch.cuda.set_device(0)


@pytest.mark.gpu
def test_a_weight_on_the_gpu_that_is_not_current_launches_on_its_gpus_current_stream(kernel):
    # GPU 1's current stream captures a CUDA graph while GPU 0 is current: a launch on any other stream, or on
    # GPU 0, would run at once (or fail) instead of being captured; the replay gives bitsandbytes' bits
    _two_gpus()
    layer = helpers.make_layer(96, 320, torch.float16, device="cuda:1", seed=45)
    W, qs = layer.weight, layer.weight.quant_state
    reference = bnbf.dequantize_4bit(W, qs)
    kernel.triton_dequantize_nf4(layer)  # the plan made (and the table kept) before the capture
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device=1)
    torch.cuda.synchronize(1)
    try:
        with torch.cuda.graph(graph, stream=stream):  # (makes GPU 1 current)
            torch.cuda.set_device(0)
            out = kernel.triton_dequantize_nf4(layer)
            assert torch.cuda.current_device() == 0
            torch.cuda.set_device(1)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(1)
    finally:
        torch.cuda.set_device(0)
    assert torch.equal(out, reference)


STICKY_ERROR = """
import sys, torch
sys.path[:0] = [{root!r}, {tests!r}]
import helpers
from benchmarks.cells import load_kernel_cells
kernel = load_kernel_cells()
layer = helpers.make_layer(256, 512, torch.bfloat16)
for _ in range(2):
    kernel.triton_dequantize_nf4(layer)
W, qs = layer.weight, layer.weight.quant_state
assert kernel._plans.get(kernel.key_of(W, qs)[0]) is not None
torch.zeros(4, device="cuda")[torch.tensor([64], device="cuda")] = 1.0  # a device-side assert: sticky
try:
    torch.cuda.synchronize()
    print("NOT STICKY")
except RuntimeError as error:
    print("STICKY", str(error).splitlines()[0])
try:
    out = kernel.triton_dequantize_nf4(layer)
    torch.cuda.synchronize()
    print("RETURNED", out.shape)
except Exception as error:
    print("RAISED", type(error).__name__, str(error).splitlines()[0])
"""


@pytest.mark.gpu
def test_a_sticky_cuda_error_reaches_the_caller(tmp_path):
    # once the GPU has failed, a replay raises and so does Triton's launch: the caller sees the error
    result = _in_a_fresh_process(tmp_path, STICKY_ERROR)
    assert "STICKY" in result.stdout and "NOT STICKY" not in result.stdout, result.stdout + result.stderr[-3000:]
    assert "RAISED" in result.stdout, result.stdout + result.stderr[-3000:]


def test_a_first_call_inside_graph_capture_keeps_no_table_and_never_syncs(kernel, monkeypatch):
    # what a first call inside CUDA-graph capture must not do, seen on the CPU: keep a table made then (its
    # values would exist only inside the graph: kernels of that graph make it), or sync (.item()); its bits are
    # bitsandbytes' all the same
    layer = _layer(seed=70)
    W, qs = layer.weight, layer.weight.quant_state
    expected = bnbf.dequantize_4bit(W, qs)

    def syncs(tensor):
        raise AssertionError("a sync (.item()) inside graph capture")

    monkeypatch.setattr(kernel, "capturing", lambda device: True)
    monkeypatch.setattr(kernel, "_TABLES", {})
    monkeypatch.setattr(kernel, "_plans", type(kernel._plans)())  # (a plan of a freed weight at W's addresses)
    monkeypatch.setattr(torch.Tensor, "item", syncs)
    out = kernel.dequantize_nf4(W, qs)
    assert kernel._TABLES == {} and kernel._plans == {}
    monkeypatch.undo()
    assert_same_bits(out, expected, "captured")


def test_every_input_of_a_launch_tells_kinds_apart(kernel):
    # a kind's compiled kernel launches every later weight of the kind: whatever Triton specializes on (each
    # tensor's dtype and address mod 16, every other argument, constexpr and option), the GPU and the kernel
    # must give another kind
    layer = _layer(seed=90)
    layout = kernel.validate(layer.weight, layer.weight.quant_state)
    out = torch.empty(layout.shape, dtype=layout.dtype, device=DEVICE)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.DEFAULT_CONFIG, (9, 0))
    jit = kernel._dequantize_4bit_kernel
    base = kernel.kind_key(jit, args, constexprs, options, 0)
    assert kernel.kind_key(jit, tuple(args), dict(constexprs), dict(options), 0) == base
    shifted = torch.empty(args[1].numel() + 4, dtype=torch.uint8, device=DEVICE)[4:]  # 4 bytes off 16
    changed = {
        "a tensor's dtype": (jit, (args[0], args[1].view(torch.int8), *args[2:]), constexprs, options, 0),
        "a tensor's address mod 16": (jit, (args[0], shifted, *args[2:]), constexprs, options, 0),
        "n": (jit, (*args[:-1], args[-1] + 16), constexprs, options, 0),
        "a constexpr": (jit, args, {**constexprs, "BLOCKSIZE": 128}, options, 0),
        "an option": (jit, args, constexprs, {**options, "num_warps": 8}, 0),
        "the GPU": (jit, args, constexprs, options, 1),
        "the kernel": (types.SimpleNamespace(fn=lambda: None), args, constexprs, options, 0),
    }
    for name, arguments in changed.items():
        assert kernel.kind_key(*arguments) != base, name


@pytest.mark.parametrize("patched", ["empty", "empty_strided"])
def test_a_first_call_while_torchs_constructors_make_meta_tensors_and_the_calls_after(kernel, monkeypatch, patched):
    # accelerate's init_empty_weights(include_buffers=True) before 0.22 (and helpers copied from it) replaces
    # torch.empty and other constructors with ones making meta tensors, whatever device they are given: an output
    # made by one holds no memory, and a launch into it writes to address 0. A weight's first call under such a
    # patch (its kind already compiled, so it plans), then its later calls once the patch is gone: the plan made
    # then must not keep the patched function
    known = _layer(seed=91)
    kernel.dequantize_nf4(known.weight, known.weight.quant_state)
    layer = _layer(seed=92)
    W, qs = layer.weight, layer.weight.quant_state
    expected = bnbf.dequantize_4bit(W, qs)
    make = getattr(torch, patched)

    def make_on_meta(*args, **kwargs):
        return make(*args, **{**kwargs, "device": "meta"})

    monkeypatch.setattr(torch, patched, make_on_meta)
    outs = [kernel.dequantize_nf4(W, qs)]
    monkeypatch.undo()
    outs += [kernel.dequantize_nf4(W, qs) for _ in range(2)]
    for call, out in enumerate(outs):
        assert_same_bits(out, expected, f"call {call} (the first under the patch)")


@pytest.mark.parametrize("wrapper", ["peft LoRA", "torch.compile"])
def test_a_layer_whose_weight_is_a_property_gives_its_weights_bits(kernel, wrapper):
    # peft's LoRA layer (what QLoRA code holds) and torch.compile's module have no weight parameter of their own:
    # layer.weight reaches the Linear4bit's, and so must triton_dequantize_nf4 (it read the parameters: KeyError)
    layer = _layer(shape=(64, 128), seed=47)
    if wrapper == "peft LoRA":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(torch.nn.Sequential(layer), LoraConfig(r=4, target_modules=["0"]))
        wrapped = model.base_model.model[0]
    else:
        wrapped = torch.compile(layer)
    assert "weight" not in wrapped._parameters and wrapped.weight is layer.weight
    for _ in range(2):
        _assert_bnb(kernel.triton_dequantize_nf4(wrapped), layer.weight, layer.weight.quant_state)


def test_under_torch_func_transforms_each_result_is_bitsandbytes(kernel):
    # torch.func's grad, jacrev, vjp, jvp and vmap over the input (per-sample gradients: vmap of grad) wrap the
    # tensors a call reads or makes in tensors without storage: the call reads what they wrap, and answers as
    # bitsandbytes does under the same transform
    layer = _layer(shape=(48, 64), dtype=torch.float32, seed=5)
    W, qs = layer.weight, layer.weight.quant_state
    x, xs = torch.randn(64, device=DEVICE), torch.randn(3, 64, device=DEVICE)

    def transformed(dequantize):
        def loss(x):
            return (dequantize(W, qs) @ x).square().sum()

        def matvec(x):
            return dequantize(W, qs) @ x
        return {"grad": torch.func.grad(loss)(x),
                "jacrev": torch.func.jacrev(matvec)(x),
                "vjp": torch.func.vjp(matvec, x)[1](torch.ones(48, device=DEVICE))[0],
                "jvp": torch.func.jvp(matvec, (x,), (torch.ones_like(x),))[1],
                "vmap": torch.func.vmap(matvec)(xs),
                "vmap of grad": torch.func.vmap(torch.func.grad(loss))(xs)}
    expected = transformed(bnbf.dequantize_4bit)
    for _ in range(2):  # (a weight's first call, and a later one)
        ours = transformed(kernel.dequantize_nf4)
        for name in expected:
            assert_same_bits(ours[name], expected[name], name)
    assert_same_bits(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs), "after them")


@pytest.mark.parametrize("transform", ["vmap over W", "functionalize"])
def test_a_weight_batched_by_vmap_or_functionalized_is_refused_by_name(kernel, transform):
    # what a torch.func transform makes of W itself holds no storage of W's: refused by name (bitsandbytes'
    # op answers these), and the weight's calls after it are exact
    layer = _layer(shape=(48, 64), seed=6)
    W, qs = layer.weight, layer.weight.quant_state
    if transform == "vmap over W":
        call = functools.partial(torch.func.vmap(kernel.dequantize_nf4, in_dims=(0, None)), torch.stack([W, W]))
    else:
        call = functools.partial(torch.func.functionalize(kernel.dequantize_nf4), W)
    with pytest.raises(ValueError, match=r"^dequantize_nf4: W is vmapped or functionalized \(torch\.func\)$"):
        call(qs)
    assert_same_bits(kernel.dequantize_nf4(W, qs), bnbf.dequantize_4bit(W, qs), "after it")

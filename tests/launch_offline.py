"""The launch path against the installed Triton's own JIT and launcher, without a GPU (offline_gpu.py, two
stand-in GPUs of capability 7.5). Each call's launches are compared with Triton's own launch of the freshly
validated state (the stand-in records every C launch: the GPU current, the stream, every address and value).

Reported, as one JSON line: for a nested and a plain layout, the launches of a new kind's first call, of its plan,
of W.t() and of another weight of the kind, each against Triton's; each case the launch path's header names, as
(Triton's launches, direct launches) per call; Triton's per-launch state this Triton has (launch hooks, debug mode,
instrumentation mode, pre-run hooks), set after a plan exists and cleared; validation's constants assigned after a
plan exists; a cell run again during a first call; the launch cell run again at each step of a first call, with
another kind's first call between; a weight on the GPU that is not current, first call and plan, with the GPU
current and the stream each launch had; what changes the key (each field, a storage swapped, W changed in place);
weights Triton specializes apart (the key must tell apart every pair Triton compiles apart); quant states that are
not a QuantState; a launch that raises; the compiled kernel a kind keeps alive; two threads' first calls of one kind
at once; two threads keeping plans at once at the bound; benchmarks/t4_code.py's sm_75 launches.
Own process."""
import ast
import copy
import gc
import importlib.util
import itertools
import json
import os
import sys
import tempfile
import threading
import types
import warnings
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import triton  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from benchmarks.cells import NOTEBOOK, PASTE_UNIT, kernel_cell_sources, load_kernel_cells  # noqa: E402
from reference import changed_value  # noqa: E402

CAPABILITY = (7, 5)


def weight(shape=(64, 256), nested=True, dtype=torch.bfloat16, seed=0, shift=None, offset=None, gpu=0):
    """A quantized weight on stand-in GPU `gpu`; `shift` = (field, bytes) places that tensor off its
    allocation's start."""
    torch.manual_seed(seed)
    W, q = bnbf.quantize_4bit(torch.randn(shape), blocksize=64, quant_type="nf4", compress_statistics=nested)
    q.dtype = dtype
    if offset is not None:
        q.offset = offset(q.offset)
    if shift is not None:
        field, by = shift
        owner, name = (q.state2, field[7:]) if field.startswith("state2.") else (q, field)
        tensor = W if field == "W" else getattr(owner, name)
        moved = torch.empty(tensor.nbytes + by, dtype=torch.uint8)[by:].view(tensor.dtype).reshape(tensor.shape)
        moved.copy_(tensor)
        if field == "W":
            W = moved
        else:
            setattr(owner, name, moved)
    if gpu != 0:
        W = offline_gpu.on_gpu(W, gpu)
        for owner, name in ((q, "absmax"), (q, "offset"), (q.state2, "absmax"), (q.state2, "code")):
            if owner is not None and isinstance(getattr(owner, name), torch.Tensor):
                setattr(owner, name, offline_gpu.on_gpu(getattr(owner, name), gpu))
    return W, q


def triton_record(kernel, W, q, gpu=None):
    """Triton's own launch of the freshly validated W, q (W's GPU current, or `gpu`): its launch records, the
    output's address written OUT."""
    layout = kernel.validate(W, q)
    out = torch.empty(layout.shape, dtype=layout.dtype)
    previous = offline_gpu.GPUS.exchange(layout.packed.get_device() if gpu is None else gpu)
    start = len(offline_gpu.LAUNCHES)
    try:
        kernel.launch_via_triton(layout, out, kernel.launch_config(CAPABILITY), CAPABILITY)
    finally:
        offline_gpu.GPUS.exchange(previous)
    return [_marked(launch, out) for launch in offline_gpu.LAUNCHES[start:]]


def _marked(launch, out):
    gpu, arguments = launch
    address = out.data_ptr()

    def mark(value):
        if isinstance(value, tuple):
            return tuple(mark(v) for v in value)
        return "OUT" if isinstance(value, int) and value == address else value
    return [gpu, mark(arguments)]


class Counted:
    """Launches counted: Triton's (its JIT's run) and every stand-in C launch (Triton's and the plans')."""
    triton = 0

    @classmethod
    def install(cls, kernel):
        jit = kernel._dequantize_4bit_kernel
        run = jit.run

        def counting_run(*args, **kwargs):
            cls.triton += 1
            return run(*args, **kwargs)

        jit.run = counting_run  # kernel[grid](...) calls the JITFunction's run


def calls(call, times=1):
    """(Triton's launches, direct launches) per call of call(), `times` calls."""
    counts = []
    for _ in range(times):
        triton_runs, launches = Counted.triton, len(offline_gpu.LAUNCHES)
        call()
        triton_runs = Counted.triton - triton_runs
        counts.append([triton_runs, len(offline_gpu.LAUNCHES) - launches - triton_runs])
    return counts


def recorded(kernel, W, q):
    """dequantize_nf4(W, q): its launches' records (the output's address written OUT) and its launch counts."""
    start, triton_runs = len(offline_gpu.LAUNCHES), Counted.triton
    out = kernel.dequantize_nf4(W, q)
    counts = [Counted.triton - triton_runs, len(offline_gpu.LAUNCHES) - start - (Counted.triton - triton_runs)]
    return [_marked(launch, out) for launch in offline_gpu.LAUNCHES[start:]], counts, out


def case(kernel, nested, dtype):
    """A new kind's first call, its plan, W.t() and another weight of the kind, each against Triton's launch."""
    W, q = weight(nested=nested, dtype=dtype, seed=1 if nested else 2)
    result = {}
    for name, view in (("first call", W), ("plan", W), ("W.t(), first", W.t()), ("W.t(), plan", W.t())):
        mine, counts, out = recorded(kernel, view, q)
        result[name] = {"launches": counts, "matches_triton": mine == triton_record(kernel, view, q),
                        "shape": list(out.shape)}
    W2, q2 = weight(nested=nested, dtype=dtype, seed=3 if nested else 4)
    mine, counts, _ = recorded(kernel, W2, q2)
    result["another weight of the kind"] = {"launches": counts, "matches_triton": mine == triton_record(kernel, W2, q2)}
    result["problems"] = sum((fake.problems for fake in offline_gpu.FakeLaunch.made), [])
    return result


def _namespace(q):
    """q's fields on SimpleNamespaces (its state2 too): a quant state that is not a QuantState."""
    fields = {name: getattr(q, name) for name in ("absmax", "code", "quant_type", "offset", "dtype", "shape",
                                                   "blocksize", "nested")}
    state2 = q.state2 and types.SimpleNamespace(absmax=q.state2.absmax, code=q.state2.code,
                                                blocksize=q.state2.blocksize, dtype=q.state2.dtype, nested=False)
    return types.SimpleNamespace(state2=state2, **fields)


def _with(module, name, value, work):
    """work() with module.name set to value for its duration."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        return work()
    finally:
        setattr(module, name, before)


def paths(kernel):
    """Each case the launch path's header names, as (Triton's launches, direct launches) per call, and whether a
    plan was kept."""
    W, q = weight(shape=(16, 256), dtype=torch.float16, seed=60)
    report = {}

    def planned(W_, q_):
        return kernel._plans.get(kernel.key_of(W_, q_)[0]) is not None

    report["a new kind"] = calls(lambda: kernel.dequantize_nf4(W, q))
    report["a plan that holds"] = calls(lambda: kernel.dequantize_nf4(W, q), times=2)
    W2, q2 = weight(shape=(16, 256), dtype=torch.float16, seed=61)
    report["a new key of a known kind"] = calls(lambda: kernel.dequantize_nf4(W2, q2)) + [planned(W2, q2)]
    q2.dtype = torch.float32
    report["a new key of a new kind"] = calls(lambda: kernel.dequantize_nf4(W2, q2), times=2)
    namespace = _namespace(q)
    report["a SimpleNamespace quant state"] = calls(lambda: kernel.dequantize_nf4(W, namespace), times=2) + [
        planned(W, namespace)]
    W3, q3 = weight(shape=(16, 256), dtype=torch.float16, seed=62)  # first called in capture
    report["a table decoded in CUDA-graph capture"] = in_capture(kernel, lambda: calls(
        lambda: kernel.dequantize_nf4(W3, q3), times=2) + [planned(W3, q3)])
    def again():
        return calls(lambda: kernel.dequantize_nf4(W, q), times=2)

    report["NF4_FAST_LAUNCH=0"] = _with(kernel, "FAST_LAUNCH", False, again)
    report["torch.compile"] = _with(kernel, "_is_compiling", lambda: True, again)
    for state, (set_it, clear_it) in triton_states(kernel).items():
        set_it()
        try:
            report[state] = again()
        finally:
            clear_it()
    override = kernel.DEFAULT_CONFIG._replace(num_warps=8)
    report["CONFIG_OVERRIDE set"] = _with(kernel, "CONFIG_OVERRIDE", override, again)
    configs = dict(kernel.LAUNCH_CONFIGS)  # changed in place after a plan exists
    kernel.LAUNCH_CONFIGS[CAPABILITY] = configs[CAPABILITY]._replace(num_warps=2)
    report["LAUNCH_CONFIGS changed"] = again()
    kernel.LAUNCH_CONFIGS.update(configs)
    calls(lambda: kernel.dequantize_nf4(W, q))  # (a plan again in the configuration in use: only the kernel differs)
    original = kernel._dequantize_4bit_kernel  # the kernel cell run again: another JITFunction
    kernel._dequantize_4bit_kernel = triton.jit(original.fn)
    Counted.install(kernel)
    report["the kernel cell run again"] = again()
    kernel._dequantize_4bit_kernel = original
    report["a compile hook that skips compiling"] = skipped_compile(kernel, triton_states(kernel)["a compile hook"])
    report["after all that, the plan"] = calls(lambda: kernel.dequantize_nf4(W, q))
    return report


def in_capture(kernel, work):
    """work() as during a CUDA graph's capture, before any call kept a table: each call makes its own table (in a
    graph, by kernels of the graph)."""
    tables, capturing = dict(kernel._TABLES), kernel.capturing
    kernel._TABLES.clear()
    kernel.capturing = lambda device: True
    try:
        return work()
    finally:
        kernel.capturing = capturing
        kernel._TABLES.update(tables)


def skipped_compile(kernel, hook):
    """A new kind's first call while a compile hook skips compiling (Triton's launch then launches nothing and
    returns None): nothing of it kept; once the hook is gone, its calls launch what Triton launches."""
    W, q = weight(shape=(8, 384), dtype=torch.float32, seed=63)
    set_it, clear_it = hook
    skipping = _with(_hook, "skips", True, lambda: _skipping(kernel, W, q, set_it, clear_it))
    try:
        later = [recorded(kernel, W, q) for _ in range(2)]
    except Exception as error:  # (a plan kept from the skipped call has no kernel to launch)
        return {"while skipping": skipping, "launches after": f"raised {type(error).__name__}: {error}"}
    return {"while skipping": skipping, "launches after": [counts for _, counts, _ in later],
            "matches_triton": all(mine == triton_record(kernel, W, q) for mine, _, _ in later)}


def _skipping(kernel, W, q, set_it, clear_it):
    """(Triton's launches, C launches of any kind) per call of two, with the hook set."""
    set_it()
    try:
        counts = []
        for _ in range(2):
            triton_runs, launches = Counted.triton, len(offline_gpu.LAUNCHES)
            try:
                kernel.dequantize_nf4(W, q)
            except Exception as error:  # (a plan kept from the skipped call has no kernel to launch)
                return counts + [f"raised {type(error).__name__}: {error}"]
            counts.append([Counted.triton - triton_runs, len(offline_gpu.LAUNCHES) - launches])
        return counts
    finally:
        clear_it()


def _hook(*args, **kwargs):
    _hook.calls += 1
    return _hook.skips  # (a compile hook that returns True skips the compile)


_hook.calls = 0
_hook.skips = False


class FalsyHook(list):
    """A hook that reads as False (an empty list) and counts its calls: Triton calls any hook that is not None."""

    def __call__(self, *args, **kwargs):
        _hook.calls += 1


def _stages_hook(*args):
    """Triton 3.7+'s add_stages_inspection_hook: called bare at each launch (a key and hash to compile by), and with
    the compiler's stages while it compiles (left as they are)."""
    _hook.calls += 1
    return ("nf4-probe", "nf4-probe") if not args else None


def triton_states(kernel):
    """What this Triton's launch does besides launching, as (set, clear) pairs: launch hooks (3.5+: a HookChain),
    debug mode (TRITON_DEBUG up to 3.3, knobs.runtime.debug from 3.4), an instrumentation mode (3.6+), a
    JITFunction pre-run hook, the JITFunction's own debug flag (read from 3.3)."""
    knobs = getattr(triton, "knobs", None)
    owner = getattr(knobs, "runtime", None) or triton.compiler.CompiledKernel
    jit = kernel._dequantize_4bit_kernel
    states = {}
    for which in ("enter", "exit"):
        name = f"launch_{which}_hook"
        chain = getattr(owner, name)
        if hasattr(chain, "add"):
            states[f"a launch {which} hook"] = (lambda c=chain: c.add(_hook), lambda c=chain: c.remove(_hook))
        else:
            states[f"a launch {which} hook"] = (lambda n=name: setattr(owner, n, _hook),
                                                 lambda n=name: setattr(owner, n, None))
        states[f"a launch {which} hook that reads as False"] = (lambda n=name: setattr(owner, n, FalsyHook()),
                                                                 lambda n=name, c=chain: setattr(owner, n, c))
    if hasattr(owner, "add_stages_inspection_hook"):  # (3.7+)
        states["a stages inspection hook"] = (lambda: setattr(owner, "add_stages_inspection_hook", _stages_hook),
                                              lambda: setattr(owner, "add_stages_inspection_hook", None))
    if kernel.TRITON_VERSION < (3, 4):
        states["debug mode"] = (lambda: os.environ.__setitem__("TRITON_DEBUG", "1"),
                                lambda: os.environ.pop("TRITON_DEBUG"))
    else:
        states["debug mode"] = (lambda: setattr(knobs.runtime, "debug", True),
                                lambda: setattr(knobs.runtime, "debug", False))
    compilation = getattr(knobs, "compilation", None)
    if kernel.TRITON_VERSION >= (3, 6) and hasattr(compilation, "instrumentation_mode"):
        states["an instrumentation mode"] = (lambda: setattr(compilation, "instrumentation_mode", "nf4-probe"),
                                             lambda: setattr(compilation, "instrumentation_mode", ""))
    states["a pre-run hook"] = (lambda: jit.pre_run_hooks.append(_hook), lambda: jit.pre_run_hooks.remove(_hook))
    compile_hook = (owner, "jit_cache_hook") if hasattr(owner, "jit_cache_hook") else (type(jit), "cache_hook")
    post_compile_hook = ((owner, "jit_post_compile_hook") if hasattr(owner, "jit_post_compile_hook")
                         else (type(jit), "compiled_hook"))  # (3.2, 3.3: JITFunction's)
    for label, where in (("a compile hook", compile_hook), ("a post-compile hook", post_compile_hook)):
        states[label] = (lambda w=where: setattr(*w, _hook), lambda w=where: setattr(*w, None))
        states[f"{label} that reads as False"] = (lambda w=where: setattr(*w, FalsyHook()),
                                                  lambda w=where: setattr(*w, None))
    states["the kernel's own debug flag"] = (lambda: setattr(jit, "debug", True), lambda: setattr(jit, "debug", None))
    return states


def triton_state_after_a_plan(kernel):
    """Each of this Triton's per-launch states set after a weight's plan exists: the call is Triton's launch, with
    Triton's arguments; once cleared, the plan's again."""
    W, q = weight(shape=(8, 128), dtype=torch.float16, seed=70)
    kernel.dequantize_nf4(W, q)
    report = {}
    for state, (set_it, clear_it) in triton_states(kernel).items():
        set_it()
        try:
            mine, counts, _ = recorded(kernel, W, q)
            matches = mine == triton_record(kernel, W, q)
        finally:
            clear_it()
        after = recorded(kernel, W, q)[1]
        report[state] = {"launches": counts, "matches_triton": matches, "after": after}
    report["hook calls"] = _hook.calls
    return report


def _run_wrapper_cell(kernel, source):
    """The wrapper cell's source run in the cells' namespace, as a notebook runs it again; the stand-in's
    capability check put back over the device_capability it defines."""
    exec(source, vars(kernel))
    kernel.device_capability = lambda device: CAPABILITY


def constants_after_a_plan(kernel):
    """Validation's constants assigned from another cell once a weight's plan exists, the wrapper cell not run again
    (validation took them as the cell ran), each then called twice: per call, [whether it read the state to validate
    it, whether its launches match Triton's own launch of a fresh validation], or "refused: <error>". Then the wrapper
    cell run again with its BLOCKSIZES literal edited to leave out the weight's blocksize: that call's outcome. The
    wrapper cell, as it is, runs again after (every plan made before is then stale)."""
    W, q = weight(shape=(8, 128), dtype=torch.float16, seed=72)  # blocksize 64
    kernel.dequantize_nf4(W, q)
    reads = []
    read_state = kernel.read_state

    def counted_read_state(*args):
        reads.append(args)
        return read_state(*args)

    def outcome():
        reads.clear()
        try:
            mine = recorded(kernel, W, q)[0]
            return [len(reads) > 0, mine == triton_record(kernel, W, q)]
        except (ValueError, TypeError, RuntimeError) as error:
            return f"refused: {error}"

    held = {"BLOCKSIZES": kernel.BLOCKSIZES, "MIN_CAPABILITY": kernel.MIN_CAPABILITY}
    values = {"BLOCKSIZES without the blocksize": ("BLOCKSIZES", (32, 128)),
              "BLOCKSIZES a list": ("BLOCKSIZES", list(held["BLOCKSIZES"])),
              "BLOCKSIZES holding a list": ("BLOCKSIZES", (*held["BLOCKSIZES"], [8192])),
              "BLOCKSIZES a tensor": ("BLOCKSIZES", torch.tensor(held["BLOCKSIZES"])),
              "MIN_CAPABILITY above 7.5": ("MIN_CAPABILITY", (8, 0)),
              "MIN_CAPABILITY holding a list": ("MIN_CAPABILITY", (7, [0]))}
    report = {}
    kernel.read_state = counted_read_state
    try:
        for name, (constant, value) in values.items():
            setattr(kernel, constant, value)
            calls = [outcome(), outcome()]
            if name == "BLOCKSIZES a list":
                kernel.BLOCKSIZES.remove(64)
                calls.append(outcome())
            setattr(kernel, constant, held[constant])
            report[name] = calls
    finally:
        kernel.read_state = read_state
    wrapper = kernel_cell_sources(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)))[1]
    literal = "BLOCKSIZES = (32, 64, 128,"
    assert wrapper.count(literal) == 1, "the BLOCKSIZES literal moved"
    try:
        _run_wrapper_cell(kernel, wrapper.replace(literal, "BLOCKSIZES = (32, 128,"))
        report["the wrapper cell run again, its BLOCKSIZES without the blocksize"] = outcome()
    finally:
        _run_wrapper_cell(kernel, wrapper)
    return report


def _edited_kernel(source):
    """The kernel cell's JITFunction from `source`, the cell edited (Triton reads a kernel's source from its file)."""
    path = Path(tempfile.mkdtemp(prefix="nf4_edited_")) / "edited_kernel_cell.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("nf4_edited_kernel_cell", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._dequantize_4bit_kernel


def _next_call(kernel, W, q):
    """dequantize_nf4(W, q)'s outcome: "refused: <error>"; its launches as (Triton's, direct) and whether they match
    Triton's own launch of a fresh validation; or "returned where a fresh validation refuses: <error>"."""
    try:
        mine, counts, _ = recorded(kernel, W, q)
    except ValueError as error:
        return f"refused: {error}"
    try:
        return [counts, mine == triton_record(kernel, W, q)]
    except ValueError as error:
        return f"returned where a fresh validation refuses: {error}"


def a_cell_run_again_during_a_first_call(kernel):
    """A weight's first call, between its validation and its plan (sys.setprofile stands in for another thread),
    sees the wrapper cell run again with BLOCKSIZES edited to leave out its blocksize (CONFIG_OVERRIDE set again,
    the same object), or the kernel cell run again with its kernel edited (its halves swapped; the weight of a kind
    not compiled before): per case, whether the weight's kind was new, whether the plan the call kept holds the build
    of the kernel it is stamped with (Triton's hash), and the next call's outcome (_next_call). The cells as they are
    come back after."""
    notebook = Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK))
    kernel_cell, wrapper = kernel_cell_sources(notebook)[:2]
    literal = "BLOCKSIZES = (32, 64, 128,"
    swap = "tl.interleave(high, low)"
    assert wrapper.count(literal) == 1 and kernel_cell.count(swap) == 1, "the edits' places moved"
    edited_wrapper = wrapper.replace(literal, "BLOCKSIZES = (32, 128,")
    original_kernel = kernel._dequantize_4bit_kernel
    kernel._dequantize_4bit_kernel = _edited_kernel(kernel_cell.replace(swap, "tl.interleave(low, high)"))
    Counted.install(kernel)  # (its launches counted as Triton's, as the original's are)
    edited_kernel, kernel._dequantize_4bit_kernel = kernel._dequantize_4bit_kernel, original_kernel

    def run_the_wrapper_cell(override):
        _run_wrapper_cell(kernel, edited_wrapper)
        kernel.CONFIG_OVERRIDE = override

    def run_the_kernel_cell(override):
        kernel._dequantize_4bit_kernel = edited_kernel

    report = {}
    cases = {"the wrapper cell": (run_the_wrapper_cell, (8, 128), torch.float16),
             "the kernel cell": (run_the_kernel_cell, (8, 192), torch.float32)}
    for seed, (name, (run_the_cell, shape, dtype)) in enumerate(cases.items()):
        W, q = weight(shape=shape, dtype=dtype, seed=80 + seed)
        override = kernel.CONFIG_OVERRIDE = kernel.launch_config(CAPABILITY)
        layout = kernel.validate(W, q)
        out = torch.empty(layout.shape, dtype=layout.dtype)
        grid, args, constexprs, options = kernel.launch_arguments(layout, out, override, CAPABILITY)
        new_kind = kernel.kind_key(original_kernel, args, constexprs, options, 0) not in kernel._kinds

        def mid_call(frame, event, argument):
            if event == "call" and frame.f_code.co_name == "plan_and_launch":
                sys.setprofile(None)
                run_the_cell(override)
        sys.setprofile(mid_call)
        try:
            kernel.dequantize_nf4(W, q)
        finally:
            sys.setprofile(None)
        plan = kernel._plans.get(kernel.key_of(W, q)[0])
        holds_its_build = plan is not None and plan.made_with[0][grid](*args, **constexprs, **options).hash == \
            plan.compiled.hash
        report[name] = {"a new kind": new_kind, "the plan holds its kernel's build": holds_its_build,
                        "the next call": _next_call(kernel, W, q)}
        _run_wrapper_cell(kernel, wrapper)
        kernel._dequantize_4bit_kernel = original_kernel
    return report


def a_first_call_at_each_step_of_a_wrapper_cell_run(kernel):
    """The wrapper cell run again, edited (its launch arguments halve BLOCKS_PER_PROGRAM: other launches, as exact),
    with a new weight's first call between two of its top-level statements, as another thread's call may fall: at
    each such place, the next call of that weight once the cell has run must launch what Triton's own launch of a
    fresh validation launches. The statements before which it did not. The cell as it is runs again after."""
    wrapper = kernel_cell_sources(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)))[1]
    halves = "config.weights_per_program // layout.blocksize)"
    assert wrapper.count(halves) == 1, "the launch arguments' tile moved"
    edited = wrapper.replace(halves, "config.weights_per_program // (2 * layout.blocksize))")
    lines = edited.splitlines(keepends=True)
    starts = [min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
              for node in ast.parse(edited).body]
    wrong = []
    for n, start in enumerate(starts[1:]):
        W, q = weight(shape=(16, 512), dtype=torch.float16, seed=100 + n)  # (a first call; other grids once edited)
        _run_wrapper_cell(kernel, wrapper)  # (the cell as it is; then the edited one, the call between its parts)
        _run_wrapper_cell(kernel, "".join(lines[:start]))
        kernel.dequantize_nf4(W, q)
        _run_wrapper_cell(kernel, "".join(lines[start:]))
        if _next_call(kernel, W, q) not in ([[0, 1], True], [[1, 0], True]):
            wrong.append(lines[start].strip()[:60])
    _run_wrapper_cell(kernel, wrapper)
    return wrong


def the_launch_cell_run_again_at_each_step_of_a_first_call(kernel):
    """A weight's first call, of a known kind and of a new one, where another thread (sys.setprofile stands in for
    it), at one step of the call (a call, or a return from one, made by a function of the launch cell), runs the
    launch cell again, sets PLANS_KEPT to 1 and makes another kind's first call; at each such step in turn:
    [kind, step, what was called, what went wrong] where either call raised or launched other than Triton's own
    launch of a fresh validation, more plans than PLANS_KEPT were kept, or a weight's next call launched otherwise;
    and the steps each kind's call has. Each step starts from the cell run afresh."""
    launch_cell = kernel_cell_sources(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)))[2]
    namespace = vars(kernel)
    cell_functions = {node.name for node in ast.parse(launch_cell).body if isinstance(node, ast.FunctionDef)}
    wrong, steps = [], {}
    for kind in ("a known kind", "a new kind"):
        for step in itertools.count():
            exec(launch_cell, namespace)  # (no plan, no kind)
            if kind == "a known kind":
                kernel.dequantize_nf4(*weight(shape=(16, 256), dtype=torch.float16, seed=110))
            W, q = weight(shape=(16, 256), dtype=torch.float16, seed=111 + 2 * step)
            other = weight(shape=(8, 128), dtype=torch.float32, seed=112 + 2 * step)  # (a kind of its own)
            called, other_call = [], []

            def another_thread():
                exec(launch_cell, namespace)
                kernel.PLANS_KEPT = 1
                launches = len(offline_gpu.LAUNCHES)
                try:
                    other_call.append(recorded(kernel, *other)[0] == triton_record(kernel, *other))
                except Exception as error:  # (any: what is wrong is that it raised)
                    other_call.append(f"raised {type(error).__name__}: {error}"[:300])
                del offline_gpu.LAUNCHES[launches:]  # (not the first call's)

            def at_a_step(frame, event, argument):
                caller = frame.f_back if event == "call" else frame
                if (event in ("call", "c_call", "c_return") and caller is not None
                        and caller.f_globals is namespace and caller.f_code.co_name in cell_functions):
                    name = frame.f_code.co_name if event == "call" else getattr(argument, "__name__", "?")
                    called.append(f"{event} {name}")
                    if len(called) == step + 1:
                        sys.setprofile(None)
                        another_thread()
            sys.setprofile(at_a_step)
            try:
                mine = recorded(kernel, W, q)[0] == triton_record(kernel, W, q)
            except Exception as error:  # (any: what is wrong is that it raised)
                mine = f"raised {type(error).__name__}: {error}"[:300]
            finally:
                sys.setprofile(None)
            if len(called) <= step:  # the call made fewer steps: every step was taken
                steps[kind] = step
                break
            where = [kind, step, called[step]]
            problems = []
            if mine is not True:
                problems.append(f"the call: {mine}")
            if other_call[0] is not True:
                problems.append(f"the other call: {other_call[0]}")
            if dict.__len__(kernel._plans) > 1:
                problems.append(f"{dict.__len__(kernel._plans)} plans kept, PLANS_KEPT 1")
            for weight_called in ((W, q), other):
                following = _next_call(kernel, *weight_called)
                if following[1:] != [True]:
                    problems.append(f"a next call: {following}")
            wrong += [[*where, problem] for problem in problems]
    exec(launch_cell, namespace)
    return {"wrong": wrong, "steps": steps}


def another_gpu(kernel):
    """A weight on one stand-in GPU called while the other is current (a model split over two GPUs): its first
    call and its plan launch with its GPU current and that GPU's stream (Triton's arguments), the current GPU as
    it was after each."""
    report = {}
    for gpu, current in ((1, 0), (0, 1)):
        W, q = weight(shape=(24, 128), dtype=torch.float16, seed=80 + gpu, gpu=gpu)
        offline_gpu.GPUS.exchange(current)
        rows = []
        for _ in range(2):
            mine, counts, _ = recorded(kernel, W, q)
            rows.append({"launches": counts, "gpus": [launch[0] for launch in mine],
                         "streams": [launch[1][3] for launch in mine], "current_after": offline_gpu.GPUS.current,
                         "matches_triton": mine == triton_record(kernel, W, q)})
        offline_gpu.GPUS.exchange(0)
        report[f"on GPU {gpu}, GPU {current} current"] = rows
    return report


def a_tensor_on_the_other_gpu(kernel):
    """What a call answers where one quant-state tensor is on the other stand-in GPU: its error, or "returned"."""
    W, q = weight(shape=(24, 128), dtype=torch.float16, seed=83, gpu=1)
    q.absmax = offline_gpu.on_gpu(q.absmax, 0)
    try:
        kernel.dequantize_nf4(W, q)
    except ValueError as error:
        return str(error)
    return "returned"


def key_changes(kernel):
    """What changes a weight's key: each field (QUANT_STATE_FIELDS, STATE2_FIELDS) set to another value, each
    tensor's storage swapped (`t.data = ...`) or reinterpreted at its address (another dtype or shape, fewer values,
    stride 0, a lazily negated view, a storage of another extent, its address now another GPU's), W changed in place or
    conjugated. The names whose change left the key as it was (each must change it, or make it unreadable)."""
    W, q = weight(shape=(32, 128), seed=90)
    before = kernel.key_of(W, q)[0]
    unseen = []

    def seen(name, change, undo):
        change()
        try:
            same = kernel.key_of(W, q)[0] == before
        except ValueError:  # a field missing: the call raises validation's error
            same = False
        undo()
        if same:
            unseen.append(name)

    fields = [(q, name) for name in kernel.QUANT_STATE_FIELDS] + [(q.state2, name) for name in kernel.STATE2_FIELDS]
    for owner, name in fields:
        value = getattr(owner, name)
        other = changed_value(value) if not isinstance(value, bool) else not value
        label = name if owner is q else f"state2.{name}"
        seen(label, lambda: setattr(owner, name, other), lambda: setattr(owner, name, value))
        seen(f"{label} deleted", lambda: delattr(owner, name), lambda: setattr(owner, name, value))
    tensors = {"W": W, "absmax": q.absmax, "offset": q.offset, "state2.absmax": q.state2.absmax,
               "state2.code": q.state2.code}
    for name, tensor in tensors.items():
        data = tensor.data
        seen(f"{name}.data swapped", lambda: setattr(tensor, "data", data.clone()),
             lambda: setattr(tensor, "data", data))
        other = {torch.uint8: torch.int8, torch.float32: torch.int32}[data.dtype]
        seen(f"{name}.data another dtype", lambda: setattr(tensor, "data", data.view(other)),
             lambda: setattr(tensor, "data", data))
        seen(f"{name}.data fewer values", lambda: setattr(tensor, "data", data.reshape(-1)[:-1]),
             lambda: setattr(tensor, "data", data))
        if data.numel() > 1:  # (one value's stride-0 view is itself)
            seen(f"{name}.data stride 0", lambda: setattr(tensor, "data", data.reshape(-1)[:1].expand(data.numel())),
                 lambda: setattr(tensor, "data", data))
        seen(f"{name}.data a lazily negated view", lambda: setattr(tensor, "data", torch._neg_view(data)),
             lambda: setattr(tensor, "data", data))
        seen(f"{name}.data another shape", lambda: setattr(tensor, "data", data.unsqueeze(0)),
             lambda: setattr(tensor, "data", data))
        # its address now GPU 1's: one address space, but an address GPU 0 freed (empty_cache) can be GPU 1's next
        gpu_1_blocks = offline_gpu.GPUS.memory.setdefault(1, [[], offline_gpu.GPUS.BLOCK])[0]
        its_memory = torch.empty(0, dtype=torch.uint8).set_(data.untyped_storage())
        seen(f"{name}'s address on GPU 1", lambda: gpu_1_blocks.append(its_memory), gpu_1_blocks.pop)
        # the same values at the same address, on storages of two extents: on the CPU, a numpy array's view
        # shares its memory with a storage of its own extent (resize_ may shrink a storage in place as well),
        # and on two storages of one extent that start apart: the same address at two offsets
        n = data.nbytes
        memory = torch.zeros(3 * n, dtype=torch.uint8).numpy()
        storages = {"long": (torch.from_numpy(memory[n:3 * n]), 0), "short": (torch.from_numpy(memory[n:2 * n]), 0),
                    "started earlier": (torch.from_numpy(memory[0:2 * n]), n)}
        keys = {}
        for label, (storage, offset) in storages.items():
            tensor.data = storage[offset:offset + n].view(data.dtype).view(data.shape)
            keys[label] = kernel.key_of(W, q)[0]
        tensor.data = data
        for label in ("short", "started earlier"):
            if keys[label] == keys["long"]:
                unseen.append(f"{name}.data at its address on a storage {label}")
    seen("W.t_()", W.t_, W.t_)
    complex_W = W.data.reshape(-1).view(torch.complex64)  # (W's bytes; a conjugate is a lazy view of them)
    if kernel.key_of(complex_W, q)[0] == kernel.key_of(complex_W.conj(), q)[0]:
        unseen.append("W's bytes as complex, conjugated")
    shape = list(q.shape)
    others = {"a list shape": ("shape", shape), "a tuple shape of floats": ("shape", tuple(map(float, shape))),
              "a shape holding a tensor": ("shape", (torch.tensor(shape[0]), shape[1])),
              "quant_type a str subclass": ("quant_type", type("Nf4", (str,), {})("nf4")),
              "nested a tensor": ("nested", torch.tensor(True)), "blocksize a bool": ("blocksize", True),
              "absmax sparse": ("absmax", q.absmax.to_sparse()), "absmax the tensor class": ("absmax", torch.Tensor)}
    for name, (field, other) in others.items():  # no key: every call is validated (key_of answers, never raises)
        held = getattr(q, field)
        setattr(q, field, other)
        try:
            keyed = kernel.key_of(W, q)[0] is not None
        except Exception:
            keyed = True
        if keyed:
            unseen.append(name)
        setattr(q, field, held)
    assert kernel.key_of(W, q)[0] == before
    return unseen


SWEEP = {  # weights Triton may specialize apart
    "aligned": {},
    "W off by 1 byte": {"shift": ("W", 1)},
    "W off by 8 bytes": {"shift": ("W", 8)},
    "absmax off by 4 bytes": {"shift": ("absmax", 4)},
    "state2.absmax off by 4 bytes": {"shift": ("state2.absmax", 4)},
    "offset off by 4 bytes": {"shift": ("offset", 4)},
    "size 72 (8 mod 16)": {"shape": (1, 72)},
    "size 100 (4 mod 16)": {"shape": (5, 20)},
    "size 1": {"shape": (1, 1)},
    "size 4096": {"shape": (16, 256)},
    "fp32, plain absmax": {"nested": False, "dtype": torch.float32},
    "a 1-d offset": {"offset": lambda o: o.reshape(1)},
    "fp16": {"dtype": torch.float16},
}


def sweep(kernel):
    """Each weight of SWEEP called twice: Triton's arguments each time, and how many compiled kernels each kind key
    stands for (one: a key Triton compiles apart is another key)."""
    compiled_of_key, rows = {}, {}
    for seed, (name, spec) in enumerate(SWEEP.items()):
        W, q = weight(seed=10 + seed, **spec)
        layout = kernel.validate(W, q)
        out = torch.empty(layout.shape, dtype=layout.dtype)
        grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.launch_config(CAPABILITY),
                                                                  CAPABILITY)
        compiled = kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)
        kind = kernel.kind_key(kernel._dequantize_4bit_kernel, args, constexprs, options,
                               layout.packed.get_device())
        compiled_of_key.setdefault(kind, set()).add(id(compiled))
        results = [recorded(kernel, W, q) for _ in range(2)]
        rows[name] = {"matches_triton": all(mine == triton_record(kernel, W, q) for mine, _, _ in results),
                      "launches": [counts for _, counts, _ in results],
                      "planned": kernel._plans.get(kernel.key_of(W, q)[0]) is not None}
    return {"rows": rows, "keys": len(compiled_of_key), "kernels": len(set().union(*compiled_of_key.values())),
            "keys_with_two_kernels": sum(len(ids) > 1 for ids in compiled_of_key.values())}


def other_quant_states(kernel):
    """Quant states people pass that are not a QuantState with a QuantState's state2: each call gets Triton's
    arguments for the equivalent QuantState and is planned; bitsandbytes' list format (before 0.41.2), with
    state2 an object or a list, or a plain absmax: refused, the message naming the list."""
    W, q = weight(shape=(48, 128), seed=30)
    expected = triton_record(kernel, W, q)
    with_namespace_state2 = copy.copy(q)
    with_namespace_state2.state2 = _namespace(q).state2
    report = {}
    for name, form in {"SimpleNamespace": _namespace(q), "QuantState, state2 a SimpleNamespace": with_namespace_state2}.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = [recorded(kernel, W, form) for _ in range(2)]
        report[name] = {"matches_triton": all(mine == expected for mine, _, _ in results),
                        "launches": [counts for _, counts, _ in results], "warnings": [str(w.message) for w in caught]}
    state2 = q.state2
    lists = {"list, state2 an object": [q.absmax, q.shape, q.dtype, q.blocksize, [q.offset, state2], q.quant_type,
                                        q.code],
             "list, state2 a list": [q.absmax, q.shape, q.dtype, q.blocksize,
                                     [q.offset, [state2.absmax, state2.code, state2.blocksize]], q.quant_type, q.code],
             "list, plain absmax": [q.absmax, q.shape, q.dtype, q.blocksize, None, q.quant_type, q.code]}
    for name, form in lists.items():
        try:
            kernel.dequantize_nf4(W, form)
            report[name] = "no error"
        except ValueError as error:
            report[name] = str(error)
    return report


def a_launch_raises(kernel):
    """A planned weight's launch raises (a sticky CUDA error, say): the error reaches the caller, as Triton's launch's
    would; nothing is warned or given up, and once launches work again the weight's next calls take its plan."""
    W, q = weight(shape=(72, 128), seed=44)
    for _ in range(2):
        kernel.dequantize_nf4(W, q)
    fake = offline_gpu.fake_launch_of(kernel._plans[kernel.key_of(W, q)[0]].compiled)
    fake.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            kernel.dequantize_nf4(W, q)
            error = "no error"
        except RuntimeError as raised:
            error = str(raised)
        finally:
            fake.error = None
    results = [recorded(kernel, W, q) for _ in range(2)]
    return {"error": error, "warnings": [str(w.message) for w in caught],
            "launches": [counts for _, counts, _ in results],
            "matches_triton": all(mine == triton_record(kernel, W, q) for mine, _, _ in results)}


def held_transposed(kernel):
    """A weight first called as W.t() and held so (unsloth's LoRA code passes W.t()): its first call (validated)
    and its later ones (its plan) return out.t(), as bitsandbytes does, with Triton's arguments."""
    W, q = weight(shape=(40, 256), dtype=torch.float16, seed=91)
    transposed = W.t()
    results = [recorded(kernel, transposed, q) for _ in range(2)]
    return {"launches": [counts for _, counts, _ in results], "shapes": [list(out.shape) for _, _, out in results],
            "matches_triton": all(mine == triton_record(kernel, transposed, q) for mine, _, _ in results)}


def compiled_kernel_lifetime(kernel):
    """A plan keeps the compiled kernel that owns its function: with Triton's own cache of it emptied, the kernel
    lives on and a later call launches it, with Triton's arguments."""
    W, q = weight(shape=(8, 256), seed=71)
    for _ in range(2):
        kernel.dequantize_nf4(W, q)
    owner = weakref.ref(kernel._plans[kernel.key_of(W, q)[0]].compiled)
    jit = kernel._dequantize_4bit_kernel
    for cache in getattr(jit, "device_caches", {}).values():  # Triton 3.3+: (kernels, ...) per device
        cache[0].clear()
    for cache in getattr(jit, "cache", {}).values():  # Triton 3.2: kernels per device
        cache.clear()
    gc.collect()
    mine, counts, _ = recorded(kernel, W, q)
    return {"alive": owner() is not None, "launches": counts,
            "matches_triton": mine == triton_record(kernel, W, q)}


def _first_and_second_at_once(kernel, weights):
    """kernel.dequantize_nf4 of two (W, q) at once, in threads named "first" and "second": the names of the
    threads whose call returned."""
    returned = []

    def work(name, W, q):
        kernel.dequantize_nf4(W, q)
        returned.append(name)

    threads = [threading.Thread(target=work, name=name, args=(name, *wq))
               for name, wq in zip(("first", "second"), weights)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(returned)


def two_threads_first_call(kernel):
    """Two threads make the first call of one new kind at once, their Triton launches interleaved (the first waits
    inside its launch until the second is launching): both get Triton's arguments, one kind is kept."""
    weights = [weight(shape=(24, 256), dtype=torch.float32, seed=85 + i) for i in range(2)]
    launcher = offline_gpu.FakeLaunch
    second_launching = threading.Event()
    call = launcher.__call__

    def interleaved(self, *values):
        if threading.current_thread().name == "second":
            second_launching.set()
        else:
            second_launching.wait(timeout=10)
        return call(self, *values)

    kinds = len(kernel._kinds)
    launcher.__call__ = interleaved
    try:
        returned = _first_and_second_at_once(kernel, weights)
    finally:
        launcher.__call__ = call
    matches = all(recorded(kernel, W, q)[0] == triton_record(kernel, W, q) for W, q in weights)
    return {"interleaved": second_launching.is_set(), "new_kinds": len(kernel._kinds) - kinds,
            "outputs": returned, "later_calls_match_triton": matches}


class _WaitingPlans(dict):
    """The launch path's plans, where each of the threads "first" and "second" reads their size and then waits (a
    second at most) until the other has read it too: two threads keeping plans at once both read the size before
    either keeps its plan, unless the keeping is locked."""

    def __init__(self):
        super().__init__()
        self.read = {"first": threading.Event(), "second": threading.Event()}

    def __len__(self):
        size = super().__len__()
        name = threading.current_thread().name
        if name in self.read:
            self.read[name].set()
            self.read["second" if name == "first" else "first"].wait(timeout=1)
        return size


def two_threads_keep_at_the_bound(kernel):
    """Two threads' first calls of a known kind keep their plans at once with one plan allowed: the plans kept
    stay within PLANS_KEPT."""
    weights = [weight(shape=(24, 256), dtype=torch.float32, seed=87 + i) for i in range(2)]
    kernel.dequantize_nf4(*weight(shape=(24, 256), dtype=torch.float32, seed=86))  # (the kind is known)
    plans, bound = kernel._plans, kernel.PLANS_KEPT
    kernel._plans, kernel.PLANS_KEPT = _WaitingPlans(), 1
    try:
        returned = _first_and_second_at_once(kernel, weights)
        kept = dict.__len__(kernel._plans)
    finally:
        kernel._plans, kernel.PLANS_KEPT = plans, bound
    return {"kept": kept, "bound": 1, "outputs": returned}


def t4_code_launches(kernel):
    """benchmarks/t4_code.py's sm_75 launches: for ours, the JIT build's launcher called with the paste unit's
    launcher_arguments (the stand-in loads the sm_75 build under the JIT build's function handle), Triton's
    arguments; for the copy kernel, a launch that parses."""
    from benchmarks import t4_code
    W, q = weight(shape=(64, 256), seed=50)
    layout = kernel.validate(W, q)
    out = torch.empty(layout.shape, dtype=layout.dtype)
    config = kernel.launch_config(CAPABILITY)
    start = len(offline_gpu.LAUNCHES)
    sm75 = t4_code.ours(kernel, layout, out, config)  # (Triton's launch into out first)
    other = torch.empty_like(out)
    sm75.into(other)
    triton_launch, ours = offline_gpu.LAUNCHES[start], offline_gpu.LAUNCHES[-1]
    packed, absmax = layout.packed, layout.absmax
    copy_kernel = t4_code.copy_launch(kernel, packed, absmax, torch.empty(packed.numel() * 2, dtype=torch.int16),
                                      2048, 4, True)
    copy_kernel.into(torch.empty(packed.numel() * 2, dtype=torch.int16))
    problems = sum((fake.problems for fake in offline_gpu.FakeLaunch.made), [])
    return {"target": sm75.build.compiled.metadata.target.arch,
            "matches_triton": _marked(ours, other) == _marked(triton_launch, out), "problems": problems}


def main():
    offline_gpu.install(75, gpus=2)
    kernel = load_kernel_cells(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)), tags=PASTE_UNIT)
    kernel.device_capability = lambda device: CAPABILITY  # the CPU tensors are the stand-in GPUs'
    Counted.install(kernel)
    report = {"triton": triton.__version__,
              "nested": case(kernel, True, torch.bfloat16), "plain": case(kernel, False, torch.float32),
              "paths": paths(kernel), "triton_state": triton_state_after_a_plan(kernel),
              "constants": constants_after_a_plan(kernel),
              "a_cell_run_again_during_a_first_call": a_cell_run_again_during_a_first_call(kernel),
              "a_first_call_at_each_step": a_first_call_at_each_step_of_a_wrapper_cell_run(kernel),
              "the_launch_cell_at_each_step": the_launch_cell_run_again_at_each_step_of_a_first_call(kernel),
              "another_gpu": another_gpu(kernel), "a_tensor_on_the_other_gpu": a_tensor_on_the_other_gpu(kernel),
              "key_changes": key_changes(kernel), "sweep": sweep(kernel),
              "other_quant_states": other_quant_states(kernel), "a_launch_raises": a_launch_raises(kernel),
              "held_transposed": held_transposed(kernel), "compiled_kernel_lifetime": compiled_kernel_lifetime(kernel),
              "two_threads_first_call": two_threads_first_call(kernel),
              "two_threads_keep_at_the_bound": two_threads_keep_at_the_bound(kernel),
              "t4_code": t4_code_launches(kernel)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

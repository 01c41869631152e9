"""The launch path against the installed Triton's own launcher, without a GPU (offline_gpu.py).

For a nested and a plain layout: a kind's first call (Triton's launch), which learns the values the
compiled kernel's launcher passes its C launch function (by a copy of the launcher: Triton's own launches
nothing more and stays as it was); calls through the weight's plan (a direct launch by that C function),
the plan stepping aside for a launch hook set
after the first call, a field deleted, changed or its storage swapped (`t.data = ...`), another GPU
current; the stream a direct launch passes; another weight of the same kind, planned without a launch by
Triton. Then: each case the launch path's header names, counted as Triton's launches and direct ones; a
sweep of weights that Triton specializes differently (addresses off 16 bytes, sizes, dtypes, an fp64
offset): the key must tell apart every pair that Triton compiles apart, and each plan must pass exactly
what Triton passes for its weight; a direct launch that raises (the caller sees it); the compiled kernel kept alive by its
kind; two threads making a kind's first call at once. The stand-in's "kernel" writes a digest of every
argument but the output, so equal bits mean equal arguments. Prints one JSON line. Own process."""
import copy
import json
import os
import sys
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from benchmarks.cells import NOTEBOOK, PASTE_UNIT, load_kernel_cells  # noqa: E402
from reference import bits, changed_value  # noqa: E402

CAPABILITY = (7, 5)


def weight(shape=(64, 256), nested=True, dtype=torch.bfloat16, seed=0, shift=None, offset=None):
    """A quantized weight; `shift` = (field, bytes) places that tensor off its allocation's start."""
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
    return W, q


class Launch:
    """What dequantize_nf4_via_triton prepares for W: its output, arguments and key."""

    def __init__(self, kernel, W, q):
        self.kernel, self.W, self.q = kernel, W, q
        self.validated = kernel.validate(W, q)
        self.layout = self.validated.layout
        self.out = torch.empty(self.layout.shape, dtype=self.layout.dtype)
        self.config = kernel.launch_config(CAPABILITY)
        self.grid, self.args, self.constexprs, self.options = kernel.launch_arguments(
            self.layout, self.out, self.config, CAPABILITY)
        tensors = [a.data_ptr() for a in self.args if isinstance(a, torch.Tensor)]  # the inputs, then out
        self.key = kernel.kind_key(self.layout, self.config, CAPABILITY, tensors)

    def triton(self):
        """Triton's own launch into self.out: its compiled kernel, and the bits it "wrote"."""
        offline_gpu.forget_outputs()  # a launch for another weight wrote that weight's size
        compiled = self.launch()
        offline_gpu.fake_launch_of(compiled).expect_output(self.out)
        assert self.launch() is compiled
        return compiled, bits(self.out).clone()

    def launch(self):
        return self.kernel._dequantize_4bit_kernel[self.grid](*self.args, **self.constexprs, **self.options)


class Counted:
    """Launches counted: Triton's (its JIT's run) and every C launch (Triton's and the plans' direct ones)."""
    triton = 0

    def __init__(self, kernel):
        self.kernel = kernel

    @classmethod
    def install(cls, kernel):
        jit = kernel._dequantize_4bit_kernel
        run = jit.run

        def counting_run(*args, **kwargs):
            cls.triton += 1
            return run(*args, **kwargs)

        jit.run = counting_run  # kernel[grid](...) calls the JITFunction's run

    def calls(self, fake, call, times=1):
        """(Triton's launches, direct launches) per call of call(), `times` calls; every stand-in C launch
        counted (up to Triton 3.6 each compiled kernel has its own)."""
        counts = []
        for _ in range(times):
            triton, c_launches = Counted.triton, _all_c_launches()
            call()
            triton = Counted.triton - triton
            counts.append((triton, _all_c_launches() - c_launches - triton))
        return counts


def _all_c_launches():
    return sum(fake.calls for fake in offline_gpu.FakeLaunch.made)


def case(kernel, nested, dtype):
    W, q = weight(nested=nested, dtype=dtype)
    first = Launch(kernel, W, q)
    compiled, triton_bits = first.triton()
    fake = offline_gpu.fake_launch_of(compiled)
    kernel._kinds.pop(first.key, None)  # (first.triton() went around the launch path)
    launches = fake.calls
    out = kernel.dequantize_nf4(W, q)  # the kind's first call: Triton's
    result = {"first_call_matches_triton": torch.equal(bits(out), triton_bits),
              "kind": kernel._kinds.get(first.key) is not None}
    plan = kernel._plans.get(kernel._identity(q))
    result["fast"] = plan is not None
    # the kind launches by the launcher's own C function (compiled.run not in the way), left as it was
    result["c_launch"] = plan is not None and plan.kind.launch is fake
    result["launcher_unchanged"] = compiled.run.launch is fake and fake.calls == launches + 1
    if plan is not None:
        fast = plan(W, q)
        result["fast_matches_triton"] = fast is not None and torch.equal(bits(fast), triton_bits)
        for which in ("enter", "exit"):  # a profiler starts
            offline_gpu.set_launch_hook(lambda *a: None, which)
            result[f"fast_with_an_{which}_hook_set_later"] = plan(W, q) is not None
            offline_gpu.set_launch_hook(None, which)
        code = q.code
        del q.code  # validation names the missing field: the plan steps aside, raising nothing
        result["fast_with_a_field_deleted"] = plan(W, q) is not None
        q.code = code
        flipped = plan(W.t(), q)  # W.t() after W: the same bytes, the output transposed back
        result["transposed_view_matches_triton"] = flipped is not None and torch.equal(
            bits(flipped.t()), triton_bits) and flipped.shape == triton_bits.shape[::-1]
        result["other_view_declined"] = plan(W.view(-1), q) is None  # its bytes, another shape
        try:  # validation names what W is; the plan must not try to read it
            result["not_a_tensor_declined"] = plan(W.tolist(), q) is None
        except Exception as error:
            result["not_a_tensor_declined"] = f"{type(error).__name__}: {error}"
        result["fields_unseen_when_changed"] = unseen_changes(kernel, plan, W, q)
        result["storage_swaps_unseen"] = unseen_storage_swaps(kernel, plan, W, q)
        result["other_gpu_current"] = other_gpu_current(kernel, plan, W, q)
        result["stream"] = stream_of_a_direct_launch(kernel, plan, W, q, fake)
    W2, q2 = weight(nested=nested, dtype=dtype, seed=1)  # another weight: the same kind
    second = Launch(kernel, W2, q2)
    _, second_bits = second.triton()
    counts = Counted(kernel).calls(fake, lambda: result.update(out=kernel.dequantize_nf4(W2, q2)))
    result["same_key"] = second.key == first.key
    result["second_weight_launches"] = counts[0]
    result["second_weight_fast"] = kernel._plans.get(kernel._identity(q2)) is not None
    result["second_weight_matches_triton"] = torch.equal(bits(result.pop("out")), second_bits)
    result["problems"] = fake.problems
    return result


def held_transposed(kernel):
    """A weight first called as W.t() and held so (unsloth's LoRA code passes W.t()): its first call (validated)
    and its later ones (its plan, W itself) return out.t(), as bitsandbytes does, with Triton's bits."""
    W, q = weight(shape=(40, 256), dtype=torch.float16, seed=90)
    transposed = W.t()
    triton_bits = Launch(kernel, transposed, q).triton()[1]
    fake = offline_gpu.fake_launch_of(Launch(kernel, transposed, q).launch())
    outputs = []
    counts = Counted(kernel).calls(fake, lambda: outputs.append(kernel.dequantize_nf4(transposed, q)), times=2)
    return {"launches": counts, "shapes": [list(out.shape) for out in outputs],
            "matches_triton": all(torch.equal(bits(out.t()), triton_bits) for out in outputs)}


def unseen_changes(kernel, plan, W, q):
    """Each field of QUANT_STATE_FIELDS (and STATE2_FIELDS, nested) changed in turn: the names whose change
    the plan did not see (it must step aside for each: the fields decide the launch)."""
    unseen, changed = [], 0
    for owner, name in [(q, n) for n in kernel.QUANT_STATE_FIELDS] + [
            (q.state2, n) for n in kernel.STATE2_FIELDS if q.state2 is not None]:
        value = getattr(owner, name)
        other = changed_value(value)
        if other is None:
            continue
        setattr(owner, name, other)
        if plan(W, q) is not None:
            unseen.append(name if owner is q else f"state2.{name}")
        setattr(owner, name, value)
        changed += 1
    assert plan(W, q) is not None and changed == (12 if q.state2 is not None else 6), changed
    return unseen


def unseen_storage_swaps(kernel, plan, W, q):
    """`t.data = other` on each tensor the kernel reads (the object kept, its storage swapped) and on W:
    the names whose swap the plan did not see."""
    tensors = {"absmax": q.absmax, "code": q.code, "W": W}
    if q.state2 is not None:
        tensors.update({"offset": q.offset, "state2.absmax": q.state2.absmax, "state2.code": q.state2.code})
    unseen = []
    for name, tensor in tensors.items():
        storage = tensor.data
        tensor.data = storage.clone()
        if plan(W, q) is not None:
            unseen.append(name)
        tensor.data = storage
    assert plan(W, q) is not None
    return unseen


def other_gpu_current(kernel, plan, W, q):
    """Whether the plan launched with another GPU current than its weight's (it must step aside)."""
    current = offline_gpu.torch._C._cuda_getDevice
    kernel._current_gpu = lambda: 1  # the stand-in's weights are on "GPU" None
    try:
        return plan(W, q) is not None
    finally:
        kernel._current_gpu = current


def stream_of_a_direct_launch(kernel, plan, W, q, fake):
    """The stream a direct launch passes when another stream is current, and whether its bits are Triton's
    launch's on that stream (the stand-in's digest covers the stream)."""
    other = offline_gpu.STREAM + 1
    streams = []

    def watching(*values):
        streams.append(values[3])
        return fake(*values)

    kernel._current_stream = lambda index: other
    triton_stream = offline_gpu.OfflineGPU.get_current_stream
    offline_gpu.OfflineGPU.get_current_stream = lambda self, device=None: other
    kind = plan.kind
    plan.kind = kind._replace(launch=watching)
    try:
        direct = plan(W, q)
        plan.kind = kind
        by_triton = kernel.dequantize_nf4_via_triton(W, q)
    finally:
        plan.kind = kind
        kernel._current_stream = offline_gpu.torch._C._cuda_getCurrentRawStream
        offline_gpu.OfflineGPU.get_current_stream = triton_stream
    return {"passed": streams, "expected": other, "matches_triton": torch.equal(bits(direct), bits(by_triton))}


def paths(kernel):
    """Each case the launch path's header names, as (Triton's launches, direct launches) per call."""
    W, q = weight(shape=(16, 256), dtype=torch.float16, seed=60)
    fake = offline_gpu.fake_launch_of(Launch(kernel, W, q).triton()[0])
    counted, report = Counted(kernel), {}

    def call(state=None, weight_=None):
        return lambda: kernel.dequantize_nf4(weight_ if weight_ is not None else W, state if state is not None else q)

    report["a new kind"] = counted.calls(fake, call())
    report["a plan that holds"] = counted.calls(fake, call(), times=2)
    W2, q2 = weight(shape=(16, 256), dtype=torch.float16, seed=61)
    report["a weight with no plan"] = counted.calls(fake, call(q2, W2)) + [kernel._identity(q2) in kernel._plans]
    q2.dtype = torch.float32
    report["a plan that declined (a new kind)"] = counted.calls(fake, call(q2, W2), times=2)
    namespace = _namespace(q)
    report["a quant state without weak references"] = counted.calls(fake, call(namespace), times=2) + [
        kernel._identity(namespace) in kernel._plans]
    W3, q3 = weight(shape=(16, 256), dtype=torch.float16, seed=62, offset=lambda o: o.half())
    report["an offset converted for the call"] = counted.calls(fake, call(q3, W3), times=2) + [
        kernel._identity(q3) in kernel._plans]
    report["NF4_FAST_LAUNCH=0"] = _with(kernel, "FAST_LAUNCH", False, lambda: counted.calls(fake, call(), 2))
    report["torch.compile"] = _with(kernel, "_is_compiling", lambda: True, lambda: counted.calls(fake, call(), 2))
    offline_gpu.set_launch_hook(lambda *a: None)
    try:
        report["a launch hook set"] = counted.calls(fake, call(), 2)
    finally:
        offline_gpu.set_launch_hook(None)
    report["after all that, the plan"] = counted.calls(fake, call())
    return report


def _with(module, name, value, work):
    """work() with module.name set to value for its duration."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        return work()
    finally:
        setattr(module, name, before)


def hook_before(kernel):
    """A launch hook set before a kind's first call: one launch, by Triton, and nothing learned."""
    W, q = weight(dtype=torch.float16, seed=3)
    fake = offline_gpu.fake_launch_of(Launch(kernel, W, q).triton()[0])
    calls = fake.calls
    offline_gpu.set_launch_hook(lambda *a: None)  # the C launcher calls it (the stand-in does not)
    try:
        out = kernel.dequantize_nf4(W, q)
    finally:
        offline_gpu.set_launch_hook(None)
    return {"triton_launches": fake.calls - calls, "kind": Launch(kernel, W, q).key in kernel._kinds,
            "output": list(out.shape), "fast": kernel._identity(q) in kernel._plans}


def converted_offset_first(kernel):
    """A kind first seen on a weight whose fp16 offset the wrapper converts (a temporary, so no plan): its
    first call is Triton's, its later calls one direct launch each, validated; a weight of the kind with its
    own fp32 offset is then planned at once."""
    W, q = weight(shape=(32, 128), dtype=torch.float16, seed=4, offset=lambda o: o.half())
    launch = Launch(kernel, W, q)
    fake = offline_gpu.fake_launch_of(launch.triton()[0])
    counted = Counted(kernel)
    first = counted.calls(fake, lambda: kernel.dequantize_nf4(W, q), times=2)
    W2, q2 = weight(shape=(32, 128), dtype=torch.float16, seed=5)
    key2 = Launch(kernel, W2, q2).key
    other = counted.calls(fake, lambda: kernel.dequantize_nf4(W2, q2))
    return {"launches": first, "kind": bool(kernel._kinds.get(launch.key)),
            "fast": kernel._identity(q) in kernel._plans, "same_key": key2 == launch.key,
            "other_weight_launches": other, "other_weight_fast": kernel._identity(q2) in kernel._plans}


def _calls(kernel, W, q, fake, times=2):
    """dequantize_nf4(W, q) `times` times: per call, its output's bits and the C launches it made
    (Triton's launch makes one, a direct launch one), and the warnings all the calls gave."""
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(times):
            calls = fake.calls
            out = kernel.dequantize_nf4(W, q)
            results.append((bits(out), fake.calls - calls))
    return results, [str(warning.message) for warning in caught]


def _namespace(q):
    """q's fields on SimpleNamespaces (q's state2 too): a quant state without weak references."""
    fields = {name: getattr(q, name) for name in ("absmax", "code", "quant_type", "offset", "dtype",
                                                   "shape", "blocksize")}
    state2 = q.state2 and types.SimpleNamespace(absmax=q.state2.absmax, code=q.state2.code,
                                                blocksize=q.state2.blocksize, dtype=q.state2.dtype)
    return types.SimpleNamespace(state2=state2, **fields)


def other_quant_states(kernel):
    """Quant states people pass that are not a QuantState with a QuantState's state2: each call gives
    Triton's bits for the equivalent QuantState; a SimpleNamespace has no plan (nothing to watch it by), a
    later call one direct launch; a QuantState whose state2 is a SimpleNamespace is planned. bitsandbytes'
    list format (before 0.41.2), with state2 an object or a list, or a plain absmax: refused, the message
    naming the format."""
    W, q = weight(shape=(48, 128), seed=30)
    triton_bits = Launch(kernel, W, q).triton()[1]
    fake = offline_gpu.fake_launch_of(Launch(kernel, W, q).launch())
    with_namespace_state2 = copy.copy(q)
    with_namespace_state2.state2 = _namespace(q).state2
    report = {}
    for name, form in {"SimpleNamespace": _namespace(q),
                       "QuantState, state2 a SimpleNamespace": with_namespace_state2}.items():
        results, caught = _calls(kernel, W, form, fake)
        report[name] = {"matches_triton": all(torch.equal(b, triton_bits) for b, _ in results),
                        "later_call_launches": results[-1][1], "warnings": caught,
                        "plan": kernel._identity(form) in kernel._plans}
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
        except TypeError as error:
            report[name] = str(error)
    return report


def direct_launch_raises(kernel):
    """A planned weight's direct launch raises (a sticky CUDA error, say): the error reaches the caller, as
    Triton's launch's would; nothing is warned or given up, and once launches work again the weight's next
    calls launch directly, with Triton's bits."""
    W, q = weight(shape=(72, 128), seed=44)
    compiled, triton_bits = Launch(kernel, W, q).triton()
    fake = offline_gpu.fake_launch_of(compiled)
    _calls(kernel, W, q, fake)  # a plan made, then used
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
    results, later_warnings = _calls(kernel, W, q, fake)
    return {"error": error, "warnings": [str(w.message) for w in caught] + later_warnings,
            "planned": kernel._identity(q) in kernel._plans, "launches": [n for _, n in results],
            "matches_triton": all(torch.equal(b, triton_bits) for b, _ in results)}


def compiled_kernel_lifetime(kernel):
    """A kind keeps the compiled kernel that owns its function: with Triton's own cache of it emptied, the
    kernel lives on and a later call launches it directly, with Triton's bits."""
    import gc
    import weakref
    W, q = weight(shape=(8, 256), seed=70)
    launch = Launch(kernel, W, q)
    compiled, triton_bits = launch.triton()
    kernel.dequantize_nf4(W, q)
    owner = weakref.ref(kernel._kinds[launch.key].compiled)
    jit = kernel._dequantize_4bit_kernel
    for cache in getattr(jit, "device_caches", {}).values():  # Triton 3.3+: (kernels, ...) per device
        cache[0].clear()
    for cache in getattr(jit, "cache", {}).values():  # Triton 3.2: kernels per device
        cache.clear()
    del compiled
    gc.collect()
    out = kernel.dequantize_nf4(W, q)
    return {"alive": owner() is not None, "matches_triton": torch.equal(bits(out), triton_bits)}


def two_threads_first_call(kernel):
    """Two threads make the first call of one new kind at once, their Triton launches interleaved (the first
    waits inside its launch until the second is launching): both get Triton's bits, one kind is kept, and
    Triton's launcher is left as it was."""
    import threading
    weights = [weight(shape=(24, 256), dtype=torch.float16, seed=80 + i) for i in range(2)]
    expected = []
    for W, q in weights:
        compiled, triton_bits = Launch(kernel, W, q).triton()
        expected.append(triton_bits)
    key = Launch(kernel, *weights[0]).key
    kernel._kinds.pop(key, None)
    launcher = compiled.run
    fake = launcher.launch
    second_launching = threading.Event()
    offline_gpu.forget_outputs()

    def interleaved(*values):
        if threading.current_thread().name == "second":
            second_launching.set()
        else:
            second_launching.wait(timeout=10)
        return fake(*values)

    launcher.launch = interleaved
    outputs = {}

    def work(name, W, q):
        outputs[name] = kernel.dequantize_nf4(W, q)

    threads = [threading.Thread(target=work, name=name, args=(name, *wq)) for name, wq in zip(("first", "second"),
                                                                                            weights)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    launcher.launch = fake
    return {"interleaved": second_launching.is_set(), "kind": kernel._kinds.get(key) is not None,
            "launcher_unchanged": compiled.run.launch is fake, "outputs": sorted(outputs)}


def t4_code_launches(kernel):
    """benchmarks/t4_code.py's sm_75 launches: for ours, the JIT build's launcher called with the paste unit's
    launcher_arguments (the stand-in loads the sm_75 build under the JIT build's function handle), Triton's
    bits; for the copy kernel, a launch that parses."""
    from benchmarks import t4_code
    W, q = weight(shape=(64, 256), seed=50)
    launch = Launch(kernel, W, q)
    compiled, triton_bits = launch.triton()
    sm75 = t4_code.ours(kernel, launch.layout, launch.out, launch.config)
    other = torch.empty_like(launch.out)
    sm75.into(other)  # (the stand-in writes where Triton's launch put its output)
    packed, absmax = launch.layout.packed, launch.layout.absmax
    copy = t4_code.copy_launch(kernel, packed, absmax, torch.empty(packed.numel() * 2, dtype=torch.int16), 2048, 4,
                               True)
    copy.into(torch.empty(packed.numel() * 2, dtype=torch.int16))
    return {"target": sm75.build.compiled.metadata.target.arch, "matches_triton": torch.equal(bits(other), triton_bits),
            "problems": offline_gpu.fake_launch_of(compiled).problems
            + offline_gpu.fake_launch_of(copy.jit_compiled).problems}


SWEEP = {  # weights Triton may specialize apart
    "aligned": {},
    "W off by 1 byte": {"shift": ("W", 1)},
    "W off by 8 bytes": {"shift": ("W", 8)},
    "absmax off by 4 bytes": {"shift": ("absmax", 4)},
    "state2.absmax off by 4 bytes": {"shift": ("state2.absmax", 4)},
    "offset off by 4 bytes": {"shift": ("offset", 4)},  # (code: not read; bitsandbytes' table is)
    "size 72 (8 mod 16)": {"shape": (1, 72)},
    "size 100 (4 mod 16)": {"shape": (5, 20)},
    "size 1": {"shape": (1, 1)},
    "size 4096": {"shape": (16, 256)},
    "fp32, plain absmax": {"nested": False, "dtype": torch.float32},
    "fp64 offset": {"offset": lambda o: o.double().reshape(1)},
    "fp16": {"dtype": torch.float16},
}


def sweep(kernel):
    compiled_of_key, rows = {}, {}
    for seed, (name, spec) in enumerate(SWEEP.items()):
        W, q = weight(seed=10 + seed, **spec)
        launch = Launch(kernel, W, q)
        compiled, triton_bits = launch.triton()
        compiled_of_key.setdefault(launch.key, set()).add(id(compiled))
        for _ in range(2):  # the kind's first call where it is new (Triton's), then the weight's plan
            out = kernel.dequantize_nf4(W, q)
        plan = kernel._plans.get(kernel._identity(q))
        fast = plan(W, q) if plan is not None else None
        rows[name] = {"matches_triton": torch.equal(bits(out), triton_bits),
                      "fast": fast is not None, "fast_matches_triton": fast is not None
                      and torch.equal(bits(fast), triton_bits)}
    return {"rows": rows, "keys": len(compiled_of_key),
            "kernels": len(set().union(*compiled_of_key.values())),
            "keys_with_two_kernels": sum(len(ids) > 1 for ids in compiled_of_key.values())}


def main():
    offline_gpu.install(75)
    kernel = load_kernel_cells(Path(os.environ.get("NF4_NOTEBOOK", NOTEBOOK)), tags=PASTE_UNIT)
    kernel.device_capability = lambda device: CAPABILITY  # the CPU tensors are the stand-in GPU's
    Counted.install(kernel)
    report = {"triton": offline_gpu.triton.__version__,
              "nested": case(kernel, True, torch.bfloat16), "plain": case(kernel, False, torch.float32),
              "with_launch_hook": hook_before(kernel), "converted_offset_first": converted_offset_first(kernel),
              "sweep": sweep(kernel), "other_quant_states": other_quant_states(kernel),
              "paths": paths(kernel), "direct_launch_raises": direct_launch_raises(kernel),
              "held_transposed": held_transposed(kernel),
              "compiled_kernel_lifetime": compiled_kernel_lifetime(kernel),
              "two_threads_first_call": two_threads_first_call(kernel), "t4_code": t4_code_launches(kernel)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

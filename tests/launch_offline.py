"""The launch path against the installed Triton's own launcher, without a GPU (offline_gpu.py).

For a nested and a plain layout: a key's first call (Triton's launch, then one
recorded and made a template, whose replay is checked), calls through the weight's plan, a launch
hook set after the first call and a QuantState field deleted (the plan steps aside); another weight
of the same key, whose plan is made from the template without a launch by Triton; a launch hook set
before a key's first call (nothing is learned). Then a sweep of weights that Triton specializes
differently (addresses off 16 bytes, sizes, dtypes, an fp64 offset): the key must tell apart every
pair that Triton compiles apart, and each plan must pass exactly what Triton passes for its weight.
The stand-in's "kernel" writes a digest of every argument but the output, so equal bits mean equal
arguments. Prints one JSON line. Run in its own process."""
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
from reference import bits, distinct_equal  # noqa: E402

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
        self.key = kernel.template_key(self.layout, self.config, CAPABILITY, tensors)

    def triton(self):
        """Triton's own launch into self.out: its compiled kernel, and the bits it "wrote"."""
        offline_gpu.forget_outputs()  # a launch for another weight wrote that weight's size
        compiled = self.launch()
        offline_gpu.fake_launch_of(compiled).expect_output(self.out)
        assert self.launch() is compiled
        return compiled, bits(self.out).clone()

    def launch(self):
        return self.kernel._dequantize_4bit_kernel[self.grid](*self.args, **self.constexprs, **self.options)

    def by_plan(self):
        self.kernel.launch_by_plan(self.W, self.q, self.validated, self.out, self.config, CAPABILITY)


def case(kernel, nested, dtype):
    W, q = weight(nested=nested, dtype=dtype)
    first = Launch(kernel, W, q)
    compiled, triton_bits = first.triton()
    fake = offline_gpu.fake_launch_of(compiled)
    first_calls = fake.calls
    first.by_plan()
    result = {"triton_launches_on_a_new_key": fake.calls - first_calls - 1,
              "template": bool(kernel._templates.get(first.key)),
              "recorded_launch_unchanged": torch.equal(bits(first.out), triton_bits)}
    plan = kernel._plans.get(kernel._identity(q))
    result["fast"] = plan is not None
    if plan is not None:
        fast = plan(W, q)
        result["fast_matches_triton"] = fast is not None and torch.equal(bits(fast), triton_bits)
        offline_gpu.set_launch_hook(lambda *a: None)  # a profiler starts
        result["fast_with_a_hook_set_later"] = plan(W, q) is not None
        offline_gpu.set_launch_hook(None)
        code = q.code
        del q.code  # Triton's path names the missing field: the plan steps aside, raising nothing
        result["fast_with_a_field_deleted"] = plan(W, q) is not None
        q.code = code
        flipped = plan(W.t(), q)  # W.t() after W: the same bytes, the output transposed back
        result["transposed_view_matches_triton"] = flipped is not None and torch.equal(
            bits(flipped.t()), triton_bits) and flipped.shape == triton_bits.shape[::-1]
        result["fields_unseen_when_replaced"] = unseen_replacements(kernel, plan, W, q)
    W2, q2 = weight(nested=nested, dtype=dtype, seed=1)  # another weight: the same key
    second = Launch(kernel, W2, q2)
    _, second_bits = second.triton()
    calls = fake.calls
    out = kernel.dequantize_nf4(W2, q2)  # no plan for q2 yet: its plan from the template
    result["same_key"] = second.key == first.key
    result["second_weight_triton_launches"] = fake.calls - calls - 1  # the plan's launch is one
    result["second_weight_fast"] = kernel._plans.get(kernel._identity(q2)) is not None
    result["second_weight_matches_triton"] = torch.equal(bits(out), second_bits)
    result["problems"] = fake.problems
    return result


def _replacement(value):
    """An equal value that is another object; for a dtype or a small int (singletons), another value."""
    if isinstance(value, torch.dtype):
        return torch.float64 if value != torch.float64 else torch.float32
    if isinstance(value, int) and -5 <= value <= 256:
        return value * 2
    return distinct_equal(value)


def unseen_replacements(kernel, plan, W, q):
    """Each field of QUANT_STATE_FIELDS (and STATE2_FIELDS, nested) replaced in turn by another
    object: the names whose replacement the plan did not see (it must step aside for each)."""
    unseen, replaced = [], 0
    for owner, name in [(q, n) for n in kernel.QUANT_STATE_FIELDS] + [
            (q.state2, n) for n in kernel.STATE2_FIELDS if q.state2 is not None]:
        value = getattr(owner, name)
        if (other := _replacement(value)) is None:  # None (a plain layout's offset and state2)
            continue
        setattr(owner, name, other)
        if plan(W, q) is not None:
            unseen.append(name if owner is q else f"state2.{name}")
        setattr(owner, name, value)
        replaced += 1
    assert plan(W, q) is not None and replaced == (12 if q.state2 is not None else 6), replaced
    return unseen


def hook_before(kernel):
    """A launch hook set before a key's first call: one launch, by Triton, and nothing learned."""
    W, q = weight(dtype=torch.float16, seed=3)
    fake = offline_gpu.fake_launch_of(Launch(kernel, W, q).triton()[0])
    calls = fake.calls
    offline_gpu.set_launch_hook(lambda *a: None)  # the C launcher calls it (the stand-in does not)
    try:
        out = kernel.dequantize_nf4(W, q)
    finally:
        offline_gpu.set_launch_hook(None)
    return {"triton_launches": fake.calls - calls, "template": Launch(kernel, W, q).key in kernel._templates,
            "output": list(out.shape), "fast": kernel._identity(q) in kernel._plans}


def converted_offset_first(kernel):
    """A key first seen on a weight whose fp16 offset the wrapper converts (a temporary, so no plan):
    its recording is checked and kept, and the weight's later calls are one launch by Triton each,
    not recorded again; a weight of the key with its own fp32 offset is then planned at once."""
    W, q = weight(shape=(32, 128), dtype=torch.float16, seed=4, offset=lambda o: o.half())
    launch = Launch(kernel, W, q)
    fake = offline_gpu.fake_launch_of(launch.triton()[0])
    calls = fake.calls
    kernel.dequantize_nf4(W, q)  # the key's first call: Triton's, recorded, the replay checked
    first = fake.calls - calls
    calls = fake.calls
    kernel.dequantize_nf4(W, q)
    W2, q2 = weight(shape=(32, 128), dtype=torch.float16, seed=5)
    key2 = Launch(kernel, W2, q2).key
    calls2 = fake.calls
    kernel.dequantize_nf4(W2, q2)
    return {"first_call_launches": first, "later_call_launches": calls2 - calls,
            "template": bool(kernel._templates.get(launch.key)), "fast": kernel._identity(q) in kernel._plans,
            "same_key": key2 == launch.key, "other_weight_launches": fake.calls - calls2,
            "other_weight_fast": kernel._identity(q2) in kernel._plans}


def _calls(kernel, W, q, fake, times=2):
    """dequantize_nf4(W, q) `times` times: per call, its output's bits and the C launches it made
    (Triton's launch makes one, a replay one), and the warnings all the calls gave."""
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
    Triton's bits for the equivalent QuantState, with no plan kept (nothing to watch them by), a
    later call one launch (the template's replay). bitsandbytes' list format (before 0.41.2), with
    state2 an object or a list, or a plain absmax: refused, the message naming the format."""
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


def _raising(error):
    def c_launch(*arguments):
        raise error
    return c_launch


def replay_raises(kernel):
    """A plan's C launch raises (as a Triton whose launcher takes other arguments would): that call gets
    Triton's bits by Triton's launch with one warning naming the error, later calls of that kind
    (its other weight too) are Triton's with no warning, another kind still replays. Then a new kind
    whose recorded replay raises in its check, and a sticky error that Triton's launch raises too."""
    stale = TypeError("function takes exactly 18 arguments (17 given)")
    A, B, C = (weight(shape=shape, seed=seed) for shape, seed in (((56, 128), 40), ((56, 128), 41),
                                                                  ((40, 128), 42)))
    report = {}
    for name, (W, q) in zip("ABC", (A, B, C)):
        launch = Launch(kernel, W, q)
        fake = offline_gpu.fake_launch_of(launch.triton()[0])
        results, caught = _calls(kernel, W, q, fake)  # a plan made, then replayed
        report[name] = {"key": repr(launch.key), "planned": kernel._identity(q) in kernel._plans}
        if name == "A":  # the kind's C launch breaks: A's plan, and the template B's plan came from
            plan = kernel._plans[kernel._identity(q)]
            plan.launch = plan.launch._replace(c_launch=_raising(stale))
            triton_bits = launch.triton()[1]
        if name == "B":
            results, caught = _calls(kernel, *A, fake)
            report["A"].update(matches_triton=all(torch.equal(b, triton_bits) for b, _ in results),
                               launches=[n for _, n in results], warnings=caught,
                               planned_after=kernel._identity(A[1]) in kernel._plans)
            b_bits = launch.triton()[1]
            results, caught = _calls(kernel, W, q, fake)
            report["B"].update(matches_triton=all(torch.equal(b, b_bits) for b, _ in results),
                               warnings=caught, planned_after=kernel._identity(q) in kernel._plans)
    report["same_key"] = report["A"]["key"] == report["B"]["key"] != report["C"]["key"]
    c_results, caught = _calls(kernel, *C, fake)
    report["C"].update(launches=[n for _, n in c_results], warnings=caught,
                       planned_after=kernel._identity(C[1]) in kernel._plans)

    D = weight(shape=(24, 128), seed=43)  # a new kind: its template's check replay raises
    launch = Launch(kernel, *D)
    triton_bits = launch.triton()[1]
    record_launch = kernel.record_launch
    kernel.record_launch = lambda *args: record_launch(*args)._replace(c_launch=_raising(stale))
    try:
        results, caught = _calls(kernel, *D, fake)
    finally:
        kernel.record_launch = record_launch
    report["D"] = {"matches_triton": all(torch.equal(b, triton_bits) for b, _ in results), "warnings": caught,
                   "template": kernel._templates.get(launch.key) is not None,
                   "planned": kernel._identity(D[1]) in kernel._plans}

    E = weight(shape=(72, 128), seed=44)  # planned, then the GPU fails: Triton's launch raises too
    fake = offline_gpu.fake_launch_of(Launch(kernel, *E).triton()[0])
    _calls(kernel, *E, fake)
    fake.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    try:
        kernel.dequantize_nf4(*E)
        report["E"] = "no error"
    except RuntimeError as error:
        report["E"] = str(error)
    finally:
        fake.error = None
    return report


def t4_code_launches(kernel):
    """benchmarks/t4_code.py's sm_75 launches, made with the paste unit's recorder: for ours, the function and
    launch metadata found where Triton's C launch takes them and swapped, the rest what Triton passes (the
    stand-in loads the sm_75 build under the JIT build's function handle); for the copy kernel, a launch that
    parses."""
    from benchmarks import t4_code
    W, q = weight(shape=(64, 256), seed=50)
    launch = Launch(kernel, W, q)
    compiled, triton_bits = launch.triton()
    sm75 = t4_code.ours(kernel, launch.layout, launch.out, launch.config)
    other = torch.empty_like(launch.out)
    sm75.into(other)
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
        for _ in range(2):  # the key's first call where it is new, then a plan for this weight
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
    report = {"triton": offline_gpu.triton.__version__,
              "nested": case(kernel, True, torch.bfloat16), "plain": case(kernel, False, torch.float32),
              "with_launch_hook": hook_before(kernel), "converted_offset_first": converted_offset_first(kernel),
              "sweep": sweep(kernel), "other_quant_states": other_quant_states(kernel),
              "replay_raises": replay_raises(kernel), "t4_code": t4_code_launches(kernel)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

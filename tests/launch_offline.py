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
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offline_gpu  # noqa: E402  (before torch and triton are used)
import torch  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402

from kernel_cells import NOTEBOOK, PASTE_UNIT, load_kernel_cells  # noqa: E402
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
        self.layout = kernel.nf4_layout(W, q)
        self.out = torch.empty(self.layout.shape, dtype=self.layout.dtype)
        self.config = kernel.launch_config(self.layout, CAPABILITY)
        self.grid, self.args, self.constexprs, self.options = kernel.launch_arguments(
            self.layout, self.out, self.config, CAPABILITY)
        self.key = kernel.template_key(self.layout, self.config, CAPABILITY, [a.data_ptr() for a in self.args[:6]])

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
        self.kernel.launch_by_plan(self.W, self.q, self.layout, self.out, self.config, CAPABILITY)


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
              "sweep": sweep(kernel)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()

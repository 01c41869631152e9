"""The T4 path, executed on the GPU we have (run with -s to see what each test reports).

1. The sm_75 build, bit for bit. The CUDA driver JIT-compiles PTX written for an older target when
   it loads it on a newer GPU. Each case is launched once through Triton on this GPU with a T4
   configuration and the T4's constexprs (capability 7.5: Triton's own fp32 -> bf16 conversion,
   which on sm_75 is an integer round-to-nearest-even sequence); the same source is compiled for
   sm_75 with the same options, its PTX loaded on this GPU and launched with exactly the arguments
   Triton passed to its own build, only the function, its launch metadata and the output swapped
   (t4_code.Sm75Launch). The result must have bitsandbytes' bits: the T4's own conversion,
   lookups and masks run on silicon. Every T4_CANDIDATES configuration and the T4's LAUNCH_CONFIGS
   entry; NaN and infinite scales too, compared bit for bit (what bitsandbytes gives is printed).
   One known difference, asserted as exactly that: bitsandbytes flushes subnormal scales and products
   to zero (its kernels are built with FTZ), the kernel keeps them. (FP4's code 0b1000 is -0.0 in
   bitsandbytes' CUDA decoder and in the table the kernel reads: bitsandbytes' own decoding of it on
   an x86 host's CPU.)
2. A T4 (capability patched to 7.5) launches its LAUNCH_CONFIGS entry, with the entry's grid and
   block: nothing tuned in the first call, one kernel and one allocation per later call, bit-exact
   (seen through the profiler's kernel records and torch.cuda.memory_stats).
3. A GPU Triton cannot build this kernel for (capability patched to 6.0) is refused by name.
4. The notebook's torch.compile report on an emulated T4 (no native bf16 for Inductor, caches off,
   capability 7.5): fp16 compiles and matches eager; bf16 is reported as refused, nothing raised or printed.
"""
import json
import math
import os
import tempfile

import pytest
import torch
import triton

import helpers
from benchmarks import t4_code as t4
from reference import bits

pytestmark = pytest.mark.gpu
T4 = t4.T4


# ---------------------------------------------------------------------------------------------
# 1. The sm_75 build on this GPU
# ---------------------------------------------------------------------------------------------
def t4_configs(kernel):
    """What a T4 can run: every T4_CANDIDATES entry, and whatever LAUNCH_CONFIGS holds for (7, 5)."""
    configs = t4.t4_configs(kernel)
    if T4 in kernel.LAUNCH_CONFIGS and kernel.LAUNCH_CONFIGS[T4] not in configs:
        configs.append(kernel.LAUNCH_CONFIGS[T4])
    return configs


def sm75_run(kernel, layout, config):
    """The sm_75 build of the kernel on `layout`, run on this GPU: (out75, out_jit, facts), the sm_75
    build's output (filled with 0xFF bytes before the launch, so every value must be written), the
    JIT build's output, and what was built and loaded."""
    out_jit = torch.empty(layout.shape, dtype=layout.dtype, device=layout.packed.device)
    launch = t4.ours(kernel, layout, out_jit, config)
    out75 = torch.empty_like(out_jit)
    out75.view(torch.uint8).fill_(0xFF)  # NaN in fp16, bf16 and fp32
    launch.into(out75)
    torch.cuda.synchronize()
    return out75, out_jit, launch.facts()


def _linear4bit(out_features, in_features, dtype, quant_type="nf4", compress_statistics=True):
    """A bitsandbytes Linear4bit quantized on the GPU, as the published procedure builds its layers."""
    import bitsandbytes as bnb
    torch.manual_seed(out_features + in_features)
    layer = bnb.nn.Linear4bit(in_features, out_features, bias=None, compute_dtype=dtype, quant_type=quant_type,
                              compress_statistics=compress_statistics).to("cuda")
    layer.weight.quant_state.dtype = dtype
    return layer


def _layer(*args, **kwargs):
    layer = _linear4bit(*args, **kwargs)
    return layer.weight, layer.weight.quant_state


def _quantized(shape, dtype, weights=None, **kwargs):
    import bitsandbytes.functional as bnbf
    torch.manual_seed(sum(shape))
    W, qs = bnbf.quantize_4bit(torch.randn(shape, device="cuda") if weights is None else weights, **kwargs)
    qs.dtype = dtype
    return W, qs


def _one_row(dtype):
    # a packed weight of shape (1, n): bitsandbytes (and the kernel) return the transpose
    W, qs = _layer(16, 64, dtype)
    return W.data.reshape(1, -1), qs


CASES = {
    # the published procedure's three weight shapes (out, in), and a 70B-class MLP weight
    "8192x2048-fp16": lambda: _layer(8192, 2048, torch.float16),
    "4096x1024-bf16": lambda: _layer(4096, 1024, torch.bfloat16),
    "14336x4096-bf16": lambda: _layer(14336, 4096, torch.bfloat16),
    "28672x8192-bf16": lambda: _layer(28672, 8192, torch.bfloat16),
    # fp32 output
    "4096x1024-fp32": lambda: _layer(4096, 1024, torch.float32),
    # FP4, nested and plain
    "fp4-nested-1024x4096-bf16": lambda: _layer(1024, 4096, torch.bfloat16, quant_type="fp4"),
    "fp4-plain-1000x3000-fp16": lambda: _layer(1000, 3000, torch.float16, quant_type="fp4",
                                               compress_statistics=False),
    # NF4 with a plain fp32 absmax
    "nf4-plain-4096x1024-bf16": lambda: _layer(4096, 1024, torch.bfloat16, compress_statistics=False),
    "nf4-plain-300x520-fp32": lambda: _layer(300, 520, torch.float32, compress_statistics=False),
    # odd element counts, partial blocks and partial tiles
    "odd-33x97-bf16": lambda: _quantized((33, 97), torch.bfloat16, blocksize=64, quant_type="nf4"),
    "odd-3x7-fp16": lambda: _quantized((3, 7), torch.float16, blocksize=64, quant_type="nf4"),
    "odd-fp4-plain-129x255-fp32": lambda: _quantized((129, 255), torch.float32, blocksize=64, quant_type="fp4",
                                                     compress_statistics=False),
    "partial-tile-300x520-bf16": lambda: _layer(300, 520, torch.bfloat16),
    "blocksize-256-nested-96x4160-fp16": lambda: _quantized((96, 4160), torch.float16, blocksize=256,
                                                            quant_type="nf4", compress_statistics=True),
    # (1, n): a one-row weight, and a packed weight of one row (returned transposed)
    "one-row-1x4160-fp16": lambda: _layer(1, 4160, torch.float16),
    "packed-one-row-bf16": lambda: _one_row(torch.bfloat16),
}


def _reference(layout, W, qs):
    import bitsandbytes.functional as bnbf
    reference = bnbf.dequantize_4bit(W, qs)
    if layout.transposed:
        reference = reference.t()
    assert reference.shape == layout.shape
    return reference


def _otherbits(out, reference):
    """How many values' bits differ (FP4's code 0b1000 included: bitsandbytes' CUDA decoder returns -0.0 for it,
    and the kernel reads bitsandbytes' own decoding of the codes, not get_4bit_type('fp4')'s +0.0)."""
    return int((bits(out) != bits(reference)).sum())


@pytest.mark.parametrize("case", list(CASES))
def test_sm75_build_matches_bitsandbytes_on_silicon(kernel, case):
    W, qs = CASES[case]()
    layout = kernel.validate(W, qs)
    reference = _reference(layout, W, qs)
    for config in t4_configs(kernel):
        out75, out_jit, facts = sm75_run(kernel, layout, config)
        assert torch.equal(bits(out75), bits(out_jit)), f"{case} {config}: the sm_75 and sm_xx builds differ"
        differ = _otherbits(out75, reference)
        print(f"{case:>34} {tuple(config)}: sm_75 PTX ({facts['ptx_bytes']} bytes) JIT-compiled by the driver: "
              f"{facts['registers']} registers, {facts['spills']} spilled, {facts['shared_bytes']} B shared, "
              f"{facts['num_warps']} warps; values with other bits than bitsandbytes: {differ}")
        assert differ == 0, f"{case} {config}: {differ} of {out75.numel()} values differ from bitsandbytes"
        assert facts["spills"] == 0, f"{case} {config}: {facts['spills']} registers spilled"
        assert facts["registers"] > 0


# NaN and infinite scales. A nested weight of 8 x 16384 weights has one absmax2 per 16384 weights:
# each gets its own special value (bitsandbytes computes code2[q] * absmax2 + offset, then
# code[nibble] * absmax, then rounds to the output dtype). 3.4e38 overflows bf16 and fp16 when rounded.
SPECIAL_ABSMAX2 = (float("inf"), float("nan"), float("-inf"), 3.4e38, -3.4e38, 1e38, None, None)  # None: kept
# Subnormal scales (the offset zeroed, else it dominates the sum): below 2**-126, and 1.2e-38 just
# above it, whose products with code2 are subnormal.
SUBNORMAL_ABSMAX2 = (1e-39, -1e-40, 1e-42, 1.4e-45, 1.1754942e-38, 1.2e-38, None, None)


def _with_absmax2(dtype, values, zero_offset=False):
    W, qs = _quantized((128, 1024), dtype, blocksize=64, quant_type="nf4", compress_statistics=True)
    absmax2 = qs.state2.absmax.clone()  # a new tensor, as bitsandbytes and transformers assign them
    assert absmax2.numel() == len(values)
    for i, value in enumerate(values):
        if value is not None:
            absmax2[i] = value
    qs.state2.absmax = absmax2
    if zero_offset:
        qs.offset = torch.zeros_like(qs.offset)
    return W, qs


def _plain_with_special_absmax(dtype):
    W, qs = _quantized((128, 1024), dtype, blocksize=64, quant_type="nf4", compress_statistics=False)
    absmax = qs.absmax.clone()
    absmax[:6] = torch.tensor([float("inf"), float("nan"), float("-inf"), 3.4e38, 1e38, -1e38])
    qs.absmax = absmax
    return W, qs


def _nan_offset(dtype):
    W, qs = _quantized((128, 1024), dtype, blocksize=64, quant_type="nf4", compress_statistics=True)
    qs.offset = torch.full_like(qs.offset, float("nan"))
    return W, qs


def _weight_with_inf(dtype):
    torch.manual_seed(0)
    weights = torch.randn(128, 1024, device="cuda")
    weights[3, 7], weights[70, 500] = float("inf"), float("-inf")
    return _quantized((128, 1024), dtype, weights=weights, blocksize=64, quant_type="nf4", compress_statistics=True)


SPECIAL = {
    "absmax2-inf-nan-huge": lambda dtype: _with_absmax2(dtype, SPECIAL_ABSMAX2),
    "plain-absmax-inf-nan-huge": _plain_with_special_absmax,
    "offset-nan": _nan_offset,
    "weight-with-inf": _weight_with_inf,
}


def _describe_values(t):
    """What a tensor holds: how many finite values (of them subnormal, -0.0), infinities and NaNs,
    and the NaNs' bit patterns."""
    raw = bits(t).reshape(-1)
    flat, wide = t.reshape(-1), t.reshape(-1).float()
    nan = torch.isnan(wide)
    patterns = sorted({f"0x{v & (0xFFFF if t.element_size() == 2 else 0xFFFFFFFF):0{2 * t.element_size()}x}"
                       for v in raw[nan].unique().tolist()})
    subnormal = (flat != 0) & (flat.abs() < torch.finfo(t.dtype).tiny)
    negative_zero = (flat == 0) & torch.signbit(flat)
    return (f"finite {int(torch.isfinite(wide).sum())} (subnormal {int(subnormal.sum())}, -0.0 "
            f"{int(negative_zero.sum())}), +inf {int((wide == math.inf).sum())}, "
            f"-inf {int((wide == -math.inf).sum())}, NaN {int(nan.sum())} {patterns}")


def _special_configs(kernel):
    # NaN handling depends on the lookup and the conversion, not on the tile: one configuration per
    # lookup among the T4's, and the T4's LAUNCH_CONFIGS entry
    configs, lookups = [], set()
    for config in t4_configs(kernel):
        if config.lookup not in lookups or config == kernel.LAUNCH_CONFIGS.get(T4):
            configs.append(config)
            lookups.add(config.lookup)
    return configs


def _comparebits(kernel, W, qs, label, allowed=None):
    """Per configuration (config, values whose bits differ from bitsandbytes' in the sm_75 build,
    in the JIT build); `allowed(out, reference)` marks differences not to count."""
    layout = kernel.validate(W, qs)
    reference = _reference(layout, W, qs)
    print(f"{label}: bitsandbytes gives {_describe_values(reference)}")
    results = []
    for config in _special_configs(kernel):
        out75, out_jit, facts = sm75_run(kernel, layout, config)
        counts = []
        for out in (out75, out_jit):
            differ = bits(out) != bits(reference)
            counts.append((int(differ.sum()), int((differ & allowed(out, reference)).sum()) if allowed else 0))
        print(f"    {tuple(config)}: sm_75 build {_describe_values(out75)}; values with other bits: sm_75 "
              f"{counts[0][0]}, sm_{facts['jit_target']} {counts[1][0]}"
              + (f" (of them allowed: {counts[0][1]}, {counts[1][1]})" if allowed else ""))
        results.append((config, counts[0][0] - counts[0][1], counts[1][0] - counts[1][1]))
    return results


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", list(SPECIAL))
def test_nan_and_infinite_scales_give_bitsandbytesbits(kernel, case, dtype):
    W, qs = SPECIAL[case](dtype)
    for config, differ75, differ_jit in _comparebits(kernel, W, qs, f"{case} {helpers.short_dtype(dtype)}"):
        assert differ75 == 0, f"{case} {config}: the sm_75 build gives other bits in {differ75} values"
        assert differ_jit == 0, f"{case} {config}: the JIT build gives other bits in {differ_jit} values"


def _flushed_by_bitsandbytes(out, reference):
    # where bitsandbytes gives zero and the kernel a zero of either sign, a subnormal, or the smallest
    # normal (a subnormal fp32 value rounded up to bf16)
    return (reference == 0) & (out.abs() <= torch.finfo(out.dtype).tiny)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_subnormal_scales_differ_only_where_bitsandbytes_flushes_them(kernel, dtype):
    """bitsandbytes' CUDA kernels are compiled to flush subnormals to zero (FMUL.FTZ / FADD.FTZ in every
    kDequantizeBlockwise of its sm_75 and sm_90 cubins); the kernel's mul.rn.f32 and mul.f32 keep them.
    So for scales, or scaled codes, below 2**-126 (weights under ~1e-37: none in practice) bitsandbytes
    gives a zero where the kernel gives a subnormal, a zero of the other sign, or (a subnormal rounded
    up to bf16) 2**-126, and nothing else differs (what an emulation of both on the CPU predicts).
    Printed: how many values that is."""
    W, qs = _with_absmax2(dtype, SUBNORMAL_ABSMAX2, zero_offset=True)
    results = _comparebits(kernel, W, qs, f"subnormal absmax2, offset 0, {helpers.short_dtype(dtype)}",
                            allowed=_flushed_by_bitsandbytes)
    for config, other75, other_jit in results:
        assert other75 == 0, f"{config}: {other75} values differ from bitsandbytes beyond its flushing"
        assert other_jit == 0, f"{config}: the JIT build differs from bitsandbytes beyond its flushing in {other_jit}"


# ---------------------------------------------------------------------------------------------
# 2. A T4 launches its table entry, once per call
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def as_capability(kernel, monkeypatch):
    """Make torch report another compute capability to the kernel cells. Triton's driver binds
    torch.cuda.get_device_capability when it starts, so it is started first and keeps building for
    the real GPU. The cells ask on a weight's first call, and its plan keeps the answer: the plans are
    forgotten before and after."""
    real = triton.runtime.driver.active.get_current_target().arch

    def patch(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        kernel._plans.clear()
        return real

    yield patch
    monkeypatch.undo()
    kernel._plans.clear()


def _expected_t4_config(kernel, n):
    """The LAUNCH_CONFIGS[(7, 5)] entry (one for every size), or None when the table has none."""
    return kernel.LAUNCH_CONFIGS.get(T4)


def _kernel_launches(work):
    """(name, grid, block) of every kernel the GPU ran during work(), from the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    return [(e["name"], e["args"].get("grid"), e["args"].get("block")) for e in events
            if e.get("ph") == "X" and e.get("cat") == "kernel"]


def test_a_t4_launches_its_table_entry_once_per_call(kernel, as_capability):
    import bitsandbytes.functional as bnbf
    layer = _linear4bit(4096, 4096, torch.bfloat16)  # quantized before the patch
    W, qs = layer.weight, layer.weight.quant_state
    reference = bnbf.dequantize_4bit(W, qs)
    torch.cuda.synchronize()
    real = as_capability(T4)
    n = reference.numel()
    expected = _expected_t4_config(kernel, n)

    first = []
    launched = _kernel_launches(lambda: first.append(kernel.triton_dequantize_nf4(layer)))
    ours = [(tuple(grid), tuple(block)) for name, grid, block in launched if "_dequantize_4bit_kernel" in name]
    print(f"first call, capability 7.5 reported (sm_{real} built): our kernel ran {len(ours)} time(s), "
          f"(grid, block) {sorted(set(ours))}")
    # a kind's first call: Triton's launch, Triton's launch again (recorded), and one check
    # of the recording's replay against it; nothing tuned: every launch has one grid and block
    assert 1 <= len(ours) <= 3 and len(set(ours)) == 1, f"the first call ran our kernel as {ours}"
    assert torch.equal(bits(first[0]), bits(reference))

    for _ in range(3):
        kernel.triton_dequantize_nf4(layer)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()["allocation.all.allocated"]
    out = kernel.triton_dequantize_nf4(layer)
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"] - stats
    assert allocations == 1, f"a later call allocated {allocations} times"
    launched = _kernel_launches(lambda: [kernel.triton_dequantize_nf4(layer) for _ in range(5)])
    print(f"5 later calls: GPU kernels {[(name[:40], grid, block) for name, grid, block in launched]}; "
          f"{allocations} allocation per call")
    assert len(launched) == 5 and all("_dequantize_4bit_kernel" in name for name, _, _ in launched), launched
    assert all(grid is not None and block is not None for _, grid, block in launched), \
        "the profiler's trace gives no grid or block for the kernels"
    assert torch.equal(bits(out), bits(reference))
    grids = {(tuple(grid), tuple(block)) for _, grid, block in launched} | set(ours)
    assert len(grids) == 1, f"the calls launched different grids or blocks: {grids}"
    (grid, block), = grids
    if expected is None:
        print(f"LAUNCH_CONFIGS has no (7, 5) entry: launched grid {grid}, block {block} "
              f"(tests/test_t4_static.py requires the entry)")
        return
    print(f"LAUNCH_CONFIGS[(7, 5)] for {n} weights: {expected}; launched grid {grid}, block {block}")
    assert block == (32 * expected.num_warps, 1, 1), f"block {block}: not {expected.num_warps} warps"
    assert grid == (math.ceil(n / expected.weights_per_program), 1, 1), \
        f"grid {grid}: not {expected.weights_per_program} weights a program"


# ---------------------------------------------------------------------------------------------
# 3. A GPU Triton cannot build this kernel for
# ---------------------------------------------------------------------------------------------
def test_a_gpu_older_than_sm70_is_refused_by_name(kernel, as_capability):
    layer = _linear4bit(256, 256, torch.float16)  # quantized before the patch
    as_capability((6, 0))
    for attempt in range(2):  # refused again: the refusal leaves nothing behind that a retry could use
        with pytest.raises(RuntimeError) as error:
            kernel.triton_dequantize_nf4(layer)
        message = str(error.value)
        print(f"capability 6.0, call {attempt + 1}: {message}")
        assert torch.cuda.get_device_name(0) in message
        assert "compute capability (6, 0), below this kernel's (7, 0)" in message


# ---------------------------------------------------------------------------------------------
# 4. The notebook's torch.compile report on an emulated T4
# ---------------------------------------------------------------------------------------------
def test_compile_report_on_an_emulated_t4(kernel, as_capability, monkeypatch, capfd):
    import torch._inductor.config
    from torch._dynamo.device_interface import get_interface_for_device
    interface = get_interface_for_device("cuda")
    real = interface.get_compute_capability()
    as_capability(T4)
    # Inductor's own question, as on a T4 (torch/_inductor/compile_fx.py, _check_triton_bf16_support)
    monkeypatch.setattr(interface, "is_bf16_supported",
                        staticmethod(lambda including_emulation=True: bool(including_emulation)))
    # Inductor still builds its kernels for the silicon under it: an sm_75 cubin does not load here
    monkeypatch.setattr(interface, "get_compute_capability", staticmethod(lambda device=None: real))
    # a fresh T4 has no cached graph: a cache hit would skip Inductor's bf16 check
    with torch._inductor.config.patch(force_disable_caches=True):
        report = helpers.compile_report(kernel.triton_dequantize_nf4, (torch.float16, torch.bfloat16))
    printed = capfd.readouterr()  # nothing of the refusal on the output (it logged a temporary folder's path)
    assert "does not support bfloat16" not in printed.err + printed.out and "_inductor" not in printed.err, printed
    print(json.dumps(report, indent=1, default=str))
    assert report["capability"] == "7.5" and report["bf16_native"] is False
    fp16, bf16 = report["dtypes"]["torch.float16"], report["dtypes"]["torch.bfloat16"]
    assert fp16["compiled"] is True
    assert fp16["weights_bit_identical"] and fp16["mlp_close_to_eager"]
    assert fp16["mlp_bit_identical_to_compiled_mlp_on_eager_weights"]
    assert fp16["mlp_bit_identical_to_eager_with_emulate_precision_casts"]
    assert fp16["repeats_identical"] and not fp16["recompiled"]
    assert bf16["compiled"] is False and bf16["refused_by"] == "Inductor"
    assert "BF16 is not supported" in bf16["reason"], bf16

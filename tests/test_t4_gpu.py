"""The T4 path, executed on the GPU we have (run with -s to see what each test reports).

1. The sm_75 build, bit for bit. The CUDA driver JIT-compiles PTX written for an older target when
   it loads it on a newer GPU. Each case here is launched once through Triton on this GPU with a T4
   configuration and the T4's constexprs (BF16_RNE on: the hand rounding to bf16), which builds the
   JIT's sm_xx kernel; the same source is then compiled for sm_75 with the same options, its PTX
   loaded on this GPU, and launched with exactly the arguments Triton passed to the sm_xx build
   (recorded from Triton's own launcher), only the function, its launch metadata and the output
   swapped. The result must be torch.equal to bitsandbytes: the T4's own rounding sequence, lookups
   and masks run on silicon.
2. A GPU with no measured configuration (capability patched to 7.5) tunes in its first call for a
   size class and never again: later calls launch one kernel and allocate one tensor.
3. A GPU Triton cannot build this kernel for (capability patched to 6.0) is refused by name.
4. The notebook's torch.compile report on an emulated T4 (no native bf16 for Inductor, caches off,
   capability 7.5): fp16 compiles and matches eager; bf16 is reported as refused, nothing raised.
"""
import json
from pathlib import Path

import pytest
import torch
import triton

import helpers

pytestmark = pytest.mark.gpu
T4 = (7, 5)
T4_TARGET = 75
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# 1. The sm_75 build on this GPU
# ---------------------------------------------------------------------------------------------
def t4_configs(kernel):
    """What a T4 can run: every TUNING_CANDIDATES entry, and whatever the static analysis
    (results/t4-static/sass_mix.json) recommends beyond them."""
    configs = list(kernel.TUNING_CANDIDATES)
    analysis = ROOT / "results" / "t4-static" / "sass_mix.json"
    if analysis.exists():
        for config in json.loads(analysis.read_text())["recommendation"]["recommended"]:
            config = kernel.LaunchConfig(*config)
            if config not in configs:
                configs.append(config)
    return configs


def _options_for(target, metadata):
    """The compile options of a JIT build (its metadata), for another target: every CUDAOptions
    field whose default does not depend on the target, as the JIT set it; the rest (arch, fp8
    support, ...) left for the backend to derive for `target`."""
    from triton.compiler.compiler import make_backend
    here = make_backend(metadata.target).parse_options({})
    there = make_backend(target).parse_options({})
    derived = {name for name in vars(here) if getattr(here, name) != getattr(there, name)} | {"arch"}
    return {name: _tuples(getattr(metadata, name)) for name in vars(here)
            if name not in derived and hasattr(metadata, name)}


def _tuples(value):
    # metadata comes back from JSON with lists where the options held (hashable) tuples
    return tuple(map(_tuples, value)) if isinstance(value, list) else value


def _swap(value, old, new):
    # one recorded launcher argument with `old` (by identity) replaced by `new`, in nested tuples too
    if value is old:
        return new
    if type(value) is tuple:
        return tuple(_swap(v, old, new) for v in value)
    return value


def _count(value, old):
    if value is old:
        return 1
    return sum(_count(v, old) for v in value) if type(value) is tuple else 0


def sm75_launch(kernel, layout, config):
    """Run the sm_75 build of the kernel on `layout` on this GPU. Returns (out75, out_jit, facts):
    the sm_75 build's output (a fresh tensor, filled with 0xFF bytes before the launch), the JIT
    build's output, and what was built and loaded."""
    from triton.backends.compiler import GPUTarget
    driver = triton.runtime.driver.active
    out_jit = torch.empty(layout.shape, dtype=layout.dtype, device=layout.packed.device)
    # The JIT's own build for this GPU, with the T4's constexprs and options
    compiled = kernel.launch_nf4(layout, out_jit, config, T4)
    target = GPUTarget("cuda", T4_TARGET, compiled.metadata.target.warp_size)
    options = _options_for(target, compiled.metadata)
    sm75 = triton.compile(compiled.src, target=target, options=options)
    ptx = sm75.asm["ptx"]
    assert ".target sm_75" in ptx, "the PTX is not written for sm_75"
    for name, value in options.items():
        assert _tuples(getattr(sm75.metadata, name)) == value, f"option {name} differs"
    for name in ("global_scratch_size", "profile_scratch_size", "num_ctas", "launch_cooperative_grid",
                 "launch_pdl"):
        # the JIT build's launcher allocates scratch and sets these: the sm_75 build must need the same
        if hasattr(compiled.metadata, name):
            assert getattr(sm75.metadata, name) == getattr(compiled.metadata, name), name
    # The driver JIT-compiles the sm_75 PTX for this GPU (null-terminated text where a cubin goes)
    loaded = driver.utils.load_binary(sm75.name, ptx.encode() + b"\0", sm75.metadata.shared,
                                      driver.get_current_device())
    function, registers, spills = loaded[1], loaded[2], loaded[3]
    # What Triton passes to the JIT build's C launcher, recorded (nothing launched)...
    recorded, launcher = kernel._record(compiled, lambda: kernel.launch_nf4(layout, out_jit, config, T4))
    args = list(recorded)
    assert args[4] == compiled.function, "the function handle is not the launcher's fifth argument"
    args[4] = function
    at = [i for i, value in enumerate(args) if type(value) is tuple and value == tuple(compiled.packed_metadata)]
    assert len(at) == 1, f"the launch metadata {compiled.packed_metadata} is not one argument of {len(args)}"
    args[at[0]] = tuple(sm75.packed_metadata)  # num_warps, num_ctas, the sm_75 build's shared memory
    assert sum(_count(v, out_jit) for v in args) == 1, "the output is not passed once"
    out75 = torch.empty_like(out_jit)
    out75.view(torch.uint8).fill_(0xFF)  # NaN in fp16, bf16 and fp32: every value must be written
    # ...and passed again, to the sm_75 function, into a fresh output
    launcher.launch(*(_swap(v, out_jit, out75) for v in args))
    facts = {"ptx_bytes": len(ptx), "registers": registers, "spills": spills,
             "shared": sm75.metadata.shared, "jit_target": compiled.metadata.target.arch,
             "num_warps": sm75.metadata.num_warps}
    return out75, out_jit, facts


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


def _quantized(shape, dtype, **kwargs):
    import bitsandbytes.functional as bnbf
    torch.manual_seed(sum(shape))
    W, qs = bnbf.quantize_4bit(torch.randn(shape, device="cuda"), **kwargs)
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


@pytest.mark.parametrize("case", list(CASES))
def test_sm75_build_matches_bitsandbytes_on_silicon(kernel, case):
    import bitsandbytes.functional as bnbf
    W, qs = CASES[case]()
    layout = kernel.nf4_layout(W, qs)
    reference = bnbf.dequantize_4bit(W, qs)
    if layout.transposed:
        reference = reference.t()
    assert reference.shape == layout.shape
    for config in t4_configs(kernel):
        out75, out_jit, facts = sm75_launch(kernel, layout, config)
        torch.cuda.synchronize()
        assert torch.equal(out_jit, reference), f"{case} {config}: the sm_{facts['jit_target']} build differs"
        same = torch.equal(out75, reference)
        print(f"{case:>34} {tuple(config)}: sm_75 PTX ({facts['ptx_bytes']} bytes) JIT-compiled by the driver: "
              f"{facts['registers']} registers, {facts['spills']} spilled, {facts['shared']} B shared, "
              f"{facts['num_warps']} warps; torch.equal bitsandbytes: {same}")
        assert same, f"{case} {config}: the sm_75 build differs from bitsandbytes in " \
                     f"{(out75 != reference.contiguous()).sum().item()} of {out75.numel()} values"
        assert facts["spills"] == 0, f"{case} {config}: {facts['spills']} registers spilled"
        assert facts["registers"] > 0


# ---------------------------------------------------------------------------------------------
# 2. An unmeasured GPU tunes in its first call only
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def as_capability(monkeypatch):
    """Make torch report another compute capability to the kernel cells. Triton's driver binds
    torch.cuda.get_device_capability when it starts, so it is started first and keeps building for
    the real GPU."""
    real = triton.runtime.driver.active.get_current_target().arch

    def patch(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        return real

    return patch


def test_an_unmeasured_gpu_tunes_in_its_first_call_only(kernel, as_capability, monkeypatch):
    import bitsandbytes.functional as bnbf
    layer = _linear4bit(4096, 4096, torch.bfloat16)  # quantized before the patch
    W, qs = layer.weight, layer.weight.quant_state
    reference = bnbf.dequantize_4bit(W, qs)
    real = as_capability(T4)  # the bf16 output below is rounded by the kernel's own code, on silicon
    monkeypatch.setattr(kernel, "TUNED_CONFIGS", {})
    tunings = []
    tune = kernel._tune

    def counted(*args, **kwargs):
        tunings.append(args)
        return tune(*args, **kwargs)

    monkeypatch.setattr(kernel, "_tune", counted)

    first = kernel.triton_dequantize_nf4(layer)  # the warm-up call: tunes
    assert len(tunings) == 1 and len(kernel.TUNED_CONFIGS) == 1
    (key, chosen), = kernel.TUNED_CONFIGS.items()
    assert chosen in kernel.TUNING_CANDIDATES and key[1] == T4 and key[2] == torch.bfloat16
    assert torch.equal(first, reference)
    print(f"first call on an unmeasured GPU (7.5 reported, sm_{real} built): tuned {key} -> {chosen}")
    tuned = dict(kernel.TUNED_CONFIGS)

    for _ in range(3):
        kernel.triton_dequantize_nf4(layer)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()["allocation.all.allocated"]
    out = kernel.triton_dequantize_nf4(layer)
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"] - stats
    assert allocations == 1, f"a later call allocated {allocations} times"
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            kernel.triton_dequantize_nf4(layer)
        torch.cuda.synchronize()
    launched = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"5 later calls: GPU activity {launched}; {allocations} allocation per call")
    assert len(launched) == 5 and all("_dequantize_4bit_kernel" in name for name in launched), launched
    assert torch.equal(out, reference)
    assert len(tunings) == 1 and kernel.TUNED_CONFIGS == tuned, "a later call tuned again"


# ---------------------------------------------------------------------------------------------
# 3. A GPU Triton cannot build this kernel for
# ---------------------------------------------------------------------------------------------
def test_a_gpu_older_than_sm70_is_refused_by_name(kernel, as_capability):
    layer = _linear4bit(256, 256, torch.float16)  # quantized before the patch
    as_capability((6, 0))
    with pytest.raises(RuntimeError) as error:
        kernel.triton_dequantize_nf4(layer)
    message = str(error.value)
    print(f"capability 6.0: {message}")
    assert torch.cuda.get_device_name(0) in message
    assert "6.0" in message and "7.0" in message
    assert id(layer.weight.quant_state) not in kernel._PLANS


# ---------------------------------------------------------------------------------------------
# 4. The notebook's torch.compile report on an emulated T4
# ---------------------------------------------------------------------------------------------
def test_compile_report_on_an_emulated_t4(kernel, as_capability, monkeypatch):
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
    monkeypatch.setattr(kernel, "TUNED_CONFIGS", {})
    # a fresh T4 has no cached graph: a cache hit would skip Inductor's bf16 check
    with torch._inductor.config.patch(force_disable_caches=True):
        report = helpers.compile_report(kernel, (torch.float16, torch.bfloat16))
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
    # the kernel itself took the T4 path in the eager calls: tuned for capability 7.5
    assert kernel.TUNED_CONFIGS and all(key[1] == T4 for key in kernel.TUNED_CONFIGS)

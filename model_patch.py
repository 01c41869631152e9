"""Use the notebook's NF4 kernel in a model: bitsandbytes' 4-bit layers dequantize through it.

Not one of the kernel cells the puzzle asks for: an extra for people who want the kernel inside a model
(QLoRA training, prefill). In a notebook, paste the kernel cells (the cells tagged `kernel`, which
define `dequantize_nf4`), put this file next to the notebook, and hand the patch the kernel's
function:

    import model_patch

    with model_patch.use_triton_dequantize(dequantize_nf4):   # for the block
        model(input_ids=ids, labels=ids).loss.backward()

    model_patch.use_triton_dequantize(dequantize_nf4)          # or from now on, in this process
    model_patch.use_triton_dequantize(enable=False)            # bitsandbytes' own functions back

What it changes, and only while it is on: the module attributes where bitsandbytes dequantizes a
4-bit weight are replaced by wrappers that call `dequantize_nf4`:
- bitsandbytes.functional.dequantize_4bit: a Linear4bit's backward, and the dequantize helpers peft
  and transformers call (merging LoRA, `dequantize()`); older bitsandbytes also dequantize there in
  the forward, with `W.t()`;
- the step of bitsandbytes' CUDA 4-bit matmul that dequantizes and then calls F.linear, which
  bitsandbytes picks for large batches (prefill, training); bitsandbytes.matmul_4bit is wrapped
  only to note which QuantState that step belongs to.
Where bitsandbytes runs its own fused 4-bit matmul (decode, small batches) nothing changes. Any call
the kernel cannot answer with bitsandbytes' exact bits (another layout, a device it does not run on,
an input dtype other than the weight's, torch.compile tracing) goes to bitsandbytes: the patch
changes nothing but speed. PATCH_CALLS counts who answered what. Switching off puts back the very
objects that were there (a wrapper another library put over a replacement stays, with a warning).

check_in_a_small_llama() is the notebook's check that this holds in a model: one QLoRA step of a
small Llama, bit for bit the same with and without the patch.
"""
import functools
import inspect
import sys
import tempfile
import textwrap
import threading
import warnings
from collections import Counter

import torch
import torch.nn.functional as F

# bitsandbytes' 4-bit types and blocksizes: anything else is bitsandbytes' to refuse, in its words.
_BNB_QUANT_TYPES = ("nf4", "fp4")
_BNB_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
# Calls by path and by who answered them, counted without a lock (statistics): ("dequantize_4bit",
# "triton" | "bitsandbytes"); ("matmul_4bit", "bitsandbytes"): every 4-bit matmul, of which
# ("dequantize+linear", "triton" | "bitsandbytes") are those bitsandbytes answers by dequantizing
# (the rest run its fused kernels).
PATCH_CALLS = Counter()
_CALLER = threading.local()  # .quant_state: the matmul_4bit call running on this thread
_PATCH_LOCK = threading.Lock()
# The attribute a replacement carries, (itself, the kernel function it calls), tells ours from
# bitsandbytes' functions and from a wrapper another library puts over one (functools.wraps copies
# the attribute, not the identity).
_KERNEL_ATTRIBUTE = "_nf4_triton_patch"


def _kernel_function_of(function):
    """The kernel function our replacement `function` calls; None if it is none of ours."""
    marker = getattr(function, _KERNEL_ATTRIBUTE, None)
    if isinstance(marker, tuple) and len(marker) == 2 and marker[0] is function:
        return marker[1]
    return None


def _our_replacement_in(function):
    """Our replacement that `function` is, or wraps (another library's wrapper put over one, its
    __wrapped__ followed); None where there is none."""
    innermost = inspect.unwrap(function, stop=lambda each: _kernel_function_of(each) is not None)
    return innermost if _kernel_function_of(innermost) is not None else None


def _kernel_may_answer(W, quant_state):
    """Cheap checks that the kernel can give bitsandbytes' bits for this weight here (validate
    checks the rest on a first call). False sends the call to bitsandbytes."""
    if quant_state is None or not isinstance(W, torch.Tensor):
        return False
    if (getattr(quant_state, "quant_type", None) not in _BNB_QUANT_TYPES
            or getattr(quant_state, "blocksize", None) not in _BNB_BLOCKSIZES
            or getattr(quant_state, "packing_format_for_cpu", False)):  # bnb's CPU-only repacking
        return False
    with torch._C.DisableTorchFunctionSubclass():  # Params4bit's __torch_function__ costs ~1 us
        device = W.device
    if device.type == "cuda":
        if torch.version.hip is not None:
            return False  # the scale is inline PTX: NVIDIA only
    elif device.type == "cpu":
        # On the CPU the kernel runs only in Triton's interpreter (TRITON_INTERPRET=1). Without it,
        # dequantize_nf4 refuses with its own "dequantize_nf4: ... runs on CUDA" error, which
        # _declined takes as expected: bitsandbytes answers.
        shape = quant_state.shape
        # bitsandbytes' CPU kernel starts a new absmax block at each row; the layout (and CUDA, and
        # this kernel) run blocks across rows. The two agree when rows are whole blocks.
        if not shape or shape[-1] % quant_state.blocksize:
            return False
    else:
        return False
    return True  # validate checks the rest


def _declined(path, error):
    """A call the kernel raised on, which bitsandbytes now answers: warn unless it was expected."""
    # validate's and device_capability's refusals start with "dequantize_nf4:" and are expected;
    # anything else is worth a warning. bitsandbytes answers either way.
    if not str(error).startswith("dequantize_nf4:"):
        warnings.warn(f"use_triton_dequantize: {path} went to bitsandbytes after the kernel failed "
                      f"({type(error).__name__}: {error})", RuntimeWarning, stacklevel=4)


def _kernel_answer(path, dequantize_nf4, W, quant_state):
    """W dequantized by the kernel and counted for `path`; None where the kernel raised."""
    try:
        dequantized = dequantize_nf4(W, quant_state)
    except Exception as error:
        _declined(path, error)
        return None
    PATCH_CALLS[path, "triton"] += 1
    return dequantized


def _dequantize_4bit_through_triton(original, dequantize_nf4):
    """bitsandbytes.functional.dequantize_4bit: Linear4bit's backward, peft's and transformers'
    dequantize functions (LoRA merging, dequantize()), bitsandbytes' older forward."""
    @functools.wraps(original)
    def dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None,
                        quant_type="fp4"):
        if torch.compiler.is_compiling():  # dynamo traces bitsandbytes' own code, as unpatched
            return original(A, quant_state, absmax, out, blocksize, quant_type)
        # Given a quant_state, bitsandbytes ignores blocksize and quant_type; so does the kernel.
        if absmax is None and out is None and _kernel_may_answer(A, quant_state):
            W = _kernel_answer("dequantize_4bit", dequantize_nf4, A, quant_state)
            if W is not None:
                return W
        PATCH_CALLS["dequantize_4bit", "bitsandbytes"] += 1
        return original(A, quant_state, absmax, out, blocksize, quant_type)
    return dequantize_4bit


def _remember_quant_state(original, dequantize_nf4=None):
    """bitsandbytes.matmul_4bit: runs as before, with its QuantState noted for this thread, so that
    the forward's dequantize step below can use the QuantState's launch plan. (`dequantize_nf4` is
    not called here: the dequantize step calls it.)"""
    @functools.wraps(original)
    def matmul_4bit(A, B, quant_state, out=None, bias=None):
        if torch.compiler.is_compiling():  # nothing to note: the traced graph runs none of ours
            return original(A, B, quant_state, out=out, bias=bias)
        PATCH_CALLS["matmul_4bit", "bitsandbytes"] += 1
        outer = getattr(_CALLER, "quant_state", None)
        _CALLER.quant_state = quant_state
        try:
            return original(A, B, quant_state, out=out, bias=bias)
        finally:
            _CALLER.quant_state = outer
    return matmul_4bit


def _is_state_of(qs, shapeB, absmax, blocksize, quant_type, absmax_8bit, absmax_code,
                 absmax_offset):
    """Whether the dequantize step's arguments are the QuantState `qs`'s own."""
    # The fallback's arguments are qs's own tensors (by identity), as bitsandbytes' matmul passes
    # them.
    if list(shapeB) != list(qs.shape) or blocksize != qs.blocksize or quant_type != qs.quant_type:
        return False
    state2 = getattr(qs, "state2", None)
    if absmax_8bit is None:
        return state2 is None and absmax is qs.absmax
    # bitsandbytes adds the offset out of place here (in place in dequantize_4bit): the same bits
    # for the fp32 offset it makes; any other offset dtype stays with bitsandbytes.
    return (state2 is not None and absmax_8bit is qs.absmax and absmax is state2.absmax
            and absmax_code is state2.code and state2.blocksize == 256
            and absmax_offset is qs.offset
            and isinstance(absmax_offset, torch.Tensor) and absmax_offset.dtype == torch.float32)


def _dequantize_linear_through_triton(original, dequantize_nf4):
    """bitsandbytes' CUDA gemm_4bit calls this where it finds dequantize + F.linear faster than
    its fused kernels (large batches: prefill and training); the fused kernels keep the rest
    (decode)."""
    @functools.wraps(original)
    def dequant_linear(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None,
                       absmax_code=None, absmax_offset=None):
        qs = getattr(_CALLER, "quant_state", None)
        # bitsandbytes dequantizes to A's dtype here: the kernel writes qs.dtype, so they must
        # agree.
        if (qs is not None and A.dtype == qs.dtype
                and _is_state_of(qs, shapeB, absmax, blocksize, quant_type,
                                 absmax_8bit, absmax_code, absmax_offset)
                and _kernel_may_answer(B, qs)):
            W = _kernel_answer("dequantize+linear", dequantize_nf4, B, qs)
            if W is not None:
                if B.shape[0] == 1:  # dequantize_4bit's out.t() for a one-row B (the kernel's too): not here
                    W = W.t()
                return F.linear(A, W, bias)
        PATCH_CALLS["dequantize+linear", "bitsandbytes"] += 1
        return original(A, B, shapeB, absmax, blocksize, quant_type, bias,
                        absmax_8bit, absmax_code, absmax_offset)
    return dequant_linear


# (module, attribute, replacement): every caller in bitsandbytes, peft and transformers looks these
# up as module attributes at call time (`F.dequantize_4bit`, `bnb.matmul_4bit`), so replacing the
# attribute reaches them all. bitsandbytes' package imports matmul_4bit by name: both names are
# replaced. The CUDA backend is there when bitsandbytes found a GPU. Each replacement is made by
# make(original, dequantize_nf4).
_TARGETS = (
    ("bitsandbytes.functional", "dequantize_4bit", _dequantize_4bit_through_triton),
    ("bitsandbytes", "matmul_4bit", _remember_quant_state),
    ("bitsandbytes.autograd._functions", "matmul_4bit", _remember_quant_state),
    ("bitsandbytes.backends.cuda.ops", "_dequant_linear_fallback",
     _dequantize_linear_through_triton),
)


def _target_names():
    """Every target's name, "module.attribute", in _TARGETS' order."""
    return [f"{module_name}.{attribute}" for module_name, attribute, _ in _TARGETS]


def _set_patched(wanted):
    """Make each target named in `wanted` ("module.attribute" -> the kernel function it is to
    call) a replacement calling that function, and restore the others; returns the names now
    replaced. A replacement already calling the wanted function stays as it is."""
    import bitsandbytes  # noqa: F401  (loads its functional, autograd and backend modules)
    patched = []
    for module_name, attribute, make in _TARGETS:
        module = sys.modules.get(module_name)
        name = f"{module_name}.{attribute}"
        current = getattr(module, attribute, None)
        if current is None:
            continue
        ours = _our_replacement_in(current)  # None: bitsandbytes' own function
        calling = _kernel_function_of(ours)
        kernel_function = wanted.get(name)
        if ours is not None and ours is not current:  # another library's wrapper over ours: kept
            if kernel_function is not calling:
                warnings.warn(f"use_triton_dequantize: {name} is another library's wrapper over the patch, "
                              f"left as it is: calls through it reach {calling}", RuntimeWarning, stacklevel=3)
        elif kernel_function is not None and kernel_function is not calling:
            original = current if ours is None else ours.__wrapped__  # (ours wrap the original)
            replacement = make(original, kernel_function)
            setattr(replacement, _KERNEL_ATTRIBUTE, (replacement, kernel_function))
            setattr(module, attribute, replacement)
        elif kernel_function is None and ours is not None:
            setattr(module, attribute, ours.__wrapped__)  # the original object, as it was
        if kernel_function is not None:
            patched.append(name)
    return patched


def _patched_now():
    """The targets replaced now: "module.attribute" -> the kernel function its replacement calls."""
    calling = {}
    for module_name, attribute, _ in _TARGETS:
        function = getattr(sys.modules.get(module_name), attribute, None)
        kernel_function = _kernel_function_of(_our_replacement_in(function))
        if kernel_function is not None:
            calling[f"{module_name}.{attribute}"] = kernel_function
    return calling


def _check_kernel_function(dequantize_nf4):
    """A TypeError that says what to pass, unless `dequantize_nf4` is a function to call."""
    if isinstance(dequantize_nf4, bool):  # use_triton_dequantize(False), as the notebook cell had it
        raise TypeError(f"use_triton_dequantize: the first argument is the kernel's dequantize_nf4, "
                        f"not {dequantize_nf4}; to switch the patch off: "
                        "use_triton_dequantize(enable=False)")
    if not callable(dequantize_nf4):
        raise TypeError("use_triton_dequantize: pass the kernel's function, "
                        "use_triton_dequantize(dequantize_nf4), dequantize_nf4 being what the cells "
                        f"tagged `kernel` define (got {dequantize_nf4!r})")


class use_triton_dequantize:
    """Make bitsandbytes dequantize 4-bit weights with `dequantize_nf4`, the kernel cells' function
    (enable=False: stop; no function needed then).

        use_triton_dequantize(dequantize_nf4)             # from now on, in this process
        with use_triton_dequantize(dequantize_nf4): ...   # for the block; what was there comes back
        use_triton_dequantize(enable=False)               # bitsandbytes' own functions, the originals

    Bit for bit the same results: a call the kernel cannot answer exactly (another layout, device,
    output dtype, torch.compile tracing) goes to bitsandbytes. bitsandbytes' fused 4-bit matmul
    kernels (small batches, decode) are left alone. `.patched` lists the functions replaced;
    PATCH_CALLS counts calls.

    Process-wide, like the module attributes it sets; calling it again with the same function
    changes nothing (with another, the replacements call that one), and each switch happens under
    a lock (with-blocks that overlap in several threads restore in the order they exit). A module
    that imported one of these functions by name keeps the object it got."""

    def __init__(self, dequantize_nf4=None, enable=True):
        wanted = {}
        if enable:
            _check_kernel_function(dequantize_nf4)
            wanted = dict.fromkeys(_target_names(), dequantize_nf4)
        with _PATCH_LOCK:
            self.before = _patched_now()
            self.patched = _set_patched(wanted)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        with _PATCH_LOCK:
            _set_patched(self.before)
        return False


# ---------------------------------------------------------------------------------------------
# The check in a model: one QLoRA step of a small Llama, with and without the patch
# ---------------------------------------------------------------------------------------------
# On a GPU 4 x 512 tokens: more than bitsandbytes' fused matmul takes (1536), so the forward
# dequantizes too. On the CPU a tiny model, and the kernel runs in the interpreter; there
# bitsandbytes' forward dequantizes inside its CPU op, so only the backward comes to the kernel.
GPU_LLAMA = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512)
GPU_TOKENS = (4, 512)  # (batch, sequence)
CPU_LLAMA = dict(GPU_LLAMA, hidden_size=64, intermediate_size=128)
CPU_TOKENS = (2, 8)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
LINE_WIDTH = 120  # the list of replaced functions, wrapped (as the notebook shows lines)


def quantized_llama(shape, dtype, device, directory, compute_dtype=None, attn_implementation="eager"):
    """A Llama with random weights (LlamaConfig(**shape)) in `dtype`, saved to `directory` and loaded back
    4-bit as a checkpoint is: BitsAndBytesConfig, NF4, double quantization, compute in `compute_dtype`
    (default: `dtype`). Eager attention unless asked: its backward is deterministic on the GPU."""
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**shape)).to(dtype).save_pretrained(directory)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=compute_dtype or dtype)
    model = LlamaForCausalLM.from_pretrained(directory, quantization_config=quantization, dtype=dtype,
                                             device_map={"": device}, attn_implementation=attn_implementation)
    # bitsandbytes' CPU-only repacking for inference: keep one layout
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


def with_lora(model, **config):
    """peft LoRA on every linear layer (QLoRA; rank 8 unless `config` says otherwise), its adapters random:
    peft's default B = 0 would make every A gradient zero."""
    from peft import LoraConfig, get_peft_model
    lora = LoraConfig(**{"r": 8, "target_modules": "all-linear", **config, "init_lora_weights": False})
    return get_peft_model(model, lora)


def lora_step(model, ids):
    """Logits and LoRA gradients of one training step (forward + backward)."""
    model.train()
    model.zero_grad(set_to_none=True)
    output = model(input_ids=ids, labels=ids, use_cache=False)
    output.loss.backward()
    return output.logits.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def _quietly_loaded_llama(shape, dtype, device):
    """quantized_llama with LoRA, in a temporary directory, without transformers' save and load progress bars
    (for a model of a few MB); the bars are switched back on if they were on."""
    from transformers.utils import logging as transformers_logging
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory() as directory:
            return with_lora(quantized_llama(shape, dtype, device, directory))
    finally:
        if bars:
            transformers_logging.enable_progress_bar()


def check_in_a_small_llama(dequantize_nf4, device):
    """One QLoRA training step of a small Llama (random weights, loaded 4-bit through
    BitsAndBytesConfig: NF4, double quantization; LoRA on every linear layer), in bf16 and in fp16,
    without and with use_triton_dequantize(dequantize_nf4). Returns (exact, lines): exact when the
    logits and every LoRA gradient are bit-identical (torch.equal) and the kernel dequantized in
    both; lines say so per dtype, what PATCH_CALLS counted and which functions were replaced."""
    on_gpu = torch.device(device).type == "cuda"
    shape = GPU_LLAMA if on_gpu else CPU_LLAMA
    tokens = GPU_TOKENS if on_gpu else CPU_TOKENS
    exact = True
    lines = []
    replaced = []
    with warnings.catch_warnings():
        # peft 0.21 asks transformers >= 5.2x for a renamed property, which warns on each model
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*deprecated",
                                category=FutureWarning)
        for dtype in (torch.bfloat16, torch.float16):
            model = _quietly_loaded_llama(shape, dtype, device)
            seeded = torch.Generator().manual_seed(0)
            ids = torch.randint(0, shape["vocab_size"], tokens, generator=seeded).to(device)
            logits, grads = lora_step(model, ids)
            before = PATCH_CALLS.copy()
            with use_triton_dequantize(dequantize_nf4) as patch:
                patched_logits, patched_grads = lora_step(model, ids)
            replaced = patch.patched
            calls = PATCH_CALLS - before
            same = torch.equal(patched_logits, logits) and len(patched_grads) == len(grads)
            for patched_grad, grad in zip(patched_grads, grads):
                same = same and torch.equal(patched_grad, grad)
            exact = exact and same and calls["dequantize_4bit", "triton"] > 0
            kept = calls["dequantize_4bit", "bitsandbytes"] + calls["dequantize+linear", "bitsandbytes"]
            verdict = "bit-identical" if same else "DIFFERENT"
            lines.append(f"{DTYPE_NAMES[dtype]}: logits and {len(grads)} LoRA gradients {verdict} "
                         "with and without the patch;")
            lines.append(f"      our kernel dequantized {calls['dequantize_4bit', 'triton']} weights "
                         f"in the backward and {calls['dequantize+linear', 'triton']} in the forward "
                         f"(of {calls['matmul_4bit', 'bitsandbytes']} 4-bit matmuls); "
                         f"bitsandbytes kept {kept}")
            del model
    lines += textwrap.wrap("Replaced while on: " + ", ".join(replaced), LINE_WIDTH)
    return exact, lines

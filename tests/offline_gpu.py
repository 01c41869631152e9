"""A stand-in for a CUDA GPU that is not there, for Triton's real JIT, compiler and launcher.

With `install(capability)` Triton believes in one GPU of that compute capability: its JIT
specializes and compiles kernels exactly as it would for such a GPU (the bundled ptxas builds the
cubin), and the launcher Triton builds is its own Python class, so the arguments it hands to its C
launch function are what a GPU would get. The stand-in for that C function launches nothing: it
checks every call against the format the real one parses (the generated launcher's
PyArg_ParseTuple string up to Triton 3.6, the fixed one of 3.7 and newer), records it in LAUNCHES
(the GPU current then, and every argument as it reaches the GPU: tensors as addresses) and, once
told which tensor is the output, "runs the kernel" by filling it with a digest of every other
argument, so a call that passes anything else than Triton's own leaves other bytes.

With `install(capability, gpus=2)` it stands in for two such GPUs: torch's current-device calls and
Triton's driver share GPUS.current, each GPU has its own current stream (STREAM + index), and a
tensor is on GPU 0 unless `on_gpu` copied it into another GPU's memory: Tensor.get_device says so.
As on real GPUs (one address space, CUDA's unified addressing), an address belongs to one GPU for
good: every GPU but 0 has memory of its own, which is never freed.

Use it in a process of its own that has not run the interpreter: it replaces Triton's driver.
"""
import ctypes
import hashlib
import os
import re

os.environ.pop("TRITON_INTERPRET", None)
# Triton's own ptxas, as a process that never ran torch.compile finds it: Inductor (in a CUDA 13 build of torch) sets
# TRITON_PTXAS_PATH to torch's ptxas, which a test's subprocess inherits, and that one has no sm_70 (seen on the H200)
os.environ.pop("TRITON_PTXAS_PATH", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.backends.nvidia.driver as nvidia  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

TRITON = tuple(int(part) for part in triton.__version__.split(".")[:2])
STREAM, FUNCTION = 0x5EED, 0xF00D
LAUNCHES = []  # (the GPU current, the arguments as they reach the GPU) of every stand-in C launch
WATCHERS = []  # callables given each launch's record as it is made (what is alive then, say)


class GPUS:
    """The stand-in GPUs: how many, which is current, each one's current stream (STREAM + its index
    unless set), the memory of each GPU but 0 (CPU blocks it hands out slices of, never freed)."""
    count = 1
    current = 0
    streams = {}  # a GPU -> its current stream, where another than STREAM + its index
    memory = {}  # a GPU -> [its blocks (uint8 tensors), bytes of the last one handed out]
    BLOCK = 16 << 20

    @classmethod
    def stream(cls, index):
        """GPU `index`'s current stream, as torch's _cuda_getCurrentRawStream and Triton's driver say."""
        return cls.streams.get(index, STREAM + index)

    @classmethod
    def exchange(cls, index):
        """torch.cuda._exchange_device: `index` current (a negative index: nothing); the one before."""
        previous = cls.current
        if index >= 0:
            if index >= cls.count:
                raise RuntimeError(f"invalid device ordinal {index} ({cls.count} stand-in GPUs)")
            cls.current = index
        return previous


def on_gpu(tensor, gpu):
    """A copy of tensor on stand-in GPU `gpu` (GPU 0: a plain copy), contiguous, 256-byte aligned."""
    if gpu == 0:
        return tensor.clone(memory_format=torch.contiguous_format)
    blocks = GPUS.memory.setdefault(gpu, [[], GPUS.BLOCK])
    size = -(-max(tensor.nbytes, 1) // 256) * 256
    if blocks[1] + size > GPUS.BLOCK:
        blocks[0].append(torch.empty(max(GPUS.BLOCK, size), dtype=torch.uint8))
        blocks[1] = 0
    start, blocks[1] = blocks[1], blocks[1] + size
    copy = blocks[0][-1][start:start + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
    copy.copy_(tensor)
    return copy


def _stand_in_get_device(tensor):
    while torch._C._functorch.is_functorch_wrapped_tensor(tensor):  # (torch.func's: the GPU of what it wraps)
        tensor = torch._C._functorch.get_unwrapped(tensor)
    if tensor.layout != torch.strided or tensor.data_ptr() == 0:  # (no storage, no memory: on GPU 0, as made)
        return 0
    address = tensor.untyped_storage().data_ptr()
    for gpu, (blocks, _) in GPUS.memory.items():
        for block in blocks:
            if block.data_ptr() <= address < block.data_ptr() + block.nbytes:
                return gpu
    return 0
# Triton 3.7+: launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, (warps, ctas, shared),
# metadata, enter hook, exit hook, global scratch, profile scratch, annotations, signature, args)
GENERIC_FORMAT = "iiiKKpp(iii)OOOOOOy*O"


def parse_problems(fmt, args):
    """Where `args` would not parse as PyArg_ParseTuple(args, fmt) does: a list of messages."""
    problems, position, i = [], 0, 0

    def take(kind, value):
        if kind in "ilLKkIHhbB" and not isinstance(value, int):
            problems.append(f"argument {position}: '{kind}' needs an int, got {type(value).__name__}")
        if kind in "fd" and not isinstance(value, (int, float)):
            problems.append(f"argument {position}: '{kind}' needs a number, got {type(value).__name__}")
        if kind == "y*" and not isinstance(value, (bytes, bytearray, memoryview)):
            problems.append(f"argument {position}: 'y*' needs bytes, got {type(value).__name__}")

    while i < len(fmt):
        if position >= len(args):
            return problems + [f"{len(args)} arguments for format {fmt!r}"]
        if fmt[i] == "(":
            close = fmt.index(")", i)
            inner, value = fmt[i + 1:close], args[position]
            if not isinstance(value, tuple) or len(value) != len(inner):
                problems.append(f"argument {position}: needs a tuple of {len(inner)}")
            else:
                for kind, v in zip(inner, value):
                    take(kind, v)
            i, position = close + 1, position + 1
            continue
        kind = fmt[i:i + 2] if fmt[i:i + 2] == "y*" else fmt[i]
        take(kind, args[position])
        i, position = i + len(kind), position + 1
    if position != len(args):
        problems.append(f"{len(args)} arguments for a format of {position}")
    return problems


def _reaching_the_gpu(value):
    # a tensor's address; launch hooks, and the metadata only hooks read, never reach the GPU, so
    # an empty hook, that metadata and None read the same
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if value is None or callable(value) or type(value).__name__ == "LazyDict":
        return "-"
    if isinstance(value, (tuple, list)):
        return tuple(map(_reaching_the_gpu, value))
    if isinstance(value, _KernelArg):  # (Triton 3.7+: one per argument, made per compiled kernel)
        return ("arg", _reaching_the_gpu(value.nested_tuple), value.type)
    return value


def _form(args) -> tuple:
    """What tells one kernel's launch from another's through the same launch function: how many arguments, and
    how many inside each tuple among them."""
    return tuple(len(value) if isinstance(value, tuple) else None for value in args)


class FakeLaunch:
    """Stands in for a C launch function: raises TypeError where the real one's PyArg_ParseTuple
    would, and `error` (when set: a sticky CUDA error, say) on every call."""
    made = []  # every one made

    def __init__(self, fmt):
        self.fmt, self.calls, self.problems, self.error = fmt, 0, [], None
        # (the tensor launches write, where it sits in the call once found, the call's form then): Triton >= 3.7
        # launches every kernel through one launch function, and only calls of that form are that kernel's
        self.output = None
        FakeLaunch.made.append(self)

    def expect_output(self, tensor):
        self.output = (tensor, None, None)

    def __call__(self, *args):
        self.calls += 1
        if self.error is not None:
            raise self.error
        problems = parse_problems(self.fmt, args)
        self.problems += problems
        if problems:
            raise TypeError(f"the launch's arguments do not parse: {problems[0]}")
        LAUNCHES.append((GPUS.current, tuple(_reaching_the_gpu(a) for a in args)))
        for watch in WATCHERS:
            watch(LAUNCHES[-1])
        if self.output is None:
            return
        tensor, path, form = self.output
        if path is None:  # the first call after expect_output is Triton's own: find the tensor
            for i, value in enumerate(args):
                if value is tensor:
                    path = (i,)
                elif isinstance(value, tuple) and any(v is tensor for v in value):
                    path = (i, next(j for j, v in enumerate(value) if v is tensor))
            if path is None:
                self.problems.append("the output is not among the arguments")
                return
            form = _form(args)
            self.output = (tensor, path, form)
        if _form(args) != form:  # another kernel's launch: it writes nothing here
            return
        plain = [_reaching_the_gpu(a) for a in args]
        if len(path) == 1:
            target, plain[path[0]] = plain[path[0]], "out"
        else:
            inner = list(plain[path[0]])
            target, inner[path[1]] = inner[path[1]], "out"
            plain[path[0]] = tuple(inner)
        digest = hashlib.sha256(repr(plain).encode()).digest()
        n = tensor.numel() * tensor.element_size()
        ctypes.memmove(target, (digest * (n // len(digest) + 1))[:n], n)


class _Module:
    def __init__(self, fmt):
        self.launch = FakeLaunch(fmt)


class _Utils:
    """What Triton's JIT, compiler and launcher read from driver.active.utils."""

    def __init__(self):
        self.launch = FakeLaunch(GENERIC_FORMAT)  # Triton >= 3.7: one launch function for all

    def load_binary(self, name, kernel, shared, device):
        values = (1, FUNCTION, 32, 0, 1024)  # module, function, registers, spills, max threads
        return values if TRITON >= (3, 4) else values[:4]

    def get_device_properties(self, device):
        return {"max_shared_mem": 65536, "multiprocessor_count": 40, "max_num_regs": 65536,
                "warpSize": 32, "sm_clock_rate": 1590000, "mem_clock_rate": 5001000, "mem_bus_width": 256}

    def build_signature_metadata(self, signature):
        return ",".join(signature).encode()


class _KernelArg:  # Triton >= 3.7 annotates kernel arguments with these (a C type there)
    def __init__(self, nested_tuple=None, type=None):
        self.nested_tuple, self.type = nested_tuple, type


def _generated_launcher(*args, src=None, **kwargs):
    # Triton <= 3.6 compiles a C launcher per kernel; here, the format it would parse
    source = src if src is not None else args[0]
    return _Module(re.search(r'PyArg_ParseTuple\(args, "([^"]+)"', source).group(1))


class OfflineGPU(nvidia.CudaDriver):
    """Triton's CUDA driver for one GPU of a given capability that is not there."""

    def __init__(self, capability):  # the real one compiles a C module against libcuda
        self.capability = capability
        self.utils = _Utils()
        self.launcher_cls = nvidia.CudaLauncher

    def get_current_device(self):
        return self.capability * 100 + GPUS.current  # one cache per capability and GPU in Triton's JIT

    def set_current_device(self, device):
        GPUS.exchange(device % 100)

    def get_current_stream(self, device=None):
        return GPUS.stream(GPUS.current if device is None else device % 100)

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_device_capability(self, device=None):
        return divmod(self.capability, 10)

    def get_active_torch_device(self):
        return torch.device("cpu")

    @staticmethod
    def is_active():
        return True


def install(capability, gpus=1):
    """Make Triton's NVIDIA backend, and torch's current-device calls, believe in `gpus` GPUs of
    `capability` (75 for a T4)."""
    for name in ("compile_module_from_src", "compile_module_from_file"):
        if hasattr(nvidia, name):
            setattr(nvidia, name, _generated_launcher)
    if hasattr(nvidia, "library_dirs"):
        nvidia.library_dirs = lambda: []
    for name, value in (("PyKernelArg", _KernelArg), ("ARG_CONSTEXPR", 0), ("ARG_KERNEL", 1), ("ARG_TUPLE", 2)):
        if hasattr(nvidia, name):
            setattr(nvidia, name, value)
    driver = OfflineGPU(capability)
    triton.runtime.driver.set_active(driver)
    GPUS.count, GPUS.current = gpus, 0
    torch._C._cuda_getCurrentRawStream = GPUS.stream  # what the cells ask torch
    torch._C._cuda_getDevice = lambda: GPUS.current
    torch._C._cuda_exchangeDevice = GPUS.exchange
    torch.cuda.current_device = lambda: GPUS.current
    torch.cuda._exchange_device = GPUS.exchange  # torch.cuda.device(i) enters and leaves by these
    torch.cuda._maybe_exchange_device = GPUS.exchange
    torch.Tensor.get_device = _stand_in_get_device
    return driver


def fake_launch_of(compiled):
    """The stand-in C launch function a compiled kernel's launcher calls."""
    launch = compiled.run.launch
    return launch if isinstance(launch, FakeLaunch) else triton.runtime.driver.active.utils.launch


def forget_outputs():
    """Every stand-in forgets its output: until told another, its launches write nothing."""
    for fake in FakeLaunch.made:
        fake.output = None


def set_launch_hook(hook, which="enter"):
    """Set (or clear, with None) Triton's launch-enter (or -exit) hook, where this Triton keeps it."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None and hasattr(knobs, "runtime"):
        setattr(knobs.runtime, f"launch_{which}_hook", hook)
    else:
        from triton.compiler import CompiledKernel
        setattr(CompiledKernel, f"launch_{which}_hook", hook)


def ptxas_path(capability):
    """The ptxas this Triton builds `capability` with (3.9 uses ptxas-blackwell for sm_90)."""
    import inspect
    import triton.backends.nvidia.compiler as compiler
    if hasattr(compiler, "get_ptxas"):
        takes_arch = bool(inspect.signature(compiler.get_ptxas).parameters)  # 3.4 and 3.5 take none
        tool = compiler.get_ptxas(capability) if takes_arch else compiler.get_ptxas()
        return tool[0] if isinstance(tool, tuple) else tool.path  # 3.3 returns (path, version)
    return compiler._path_to_binary("ptxas")[0]

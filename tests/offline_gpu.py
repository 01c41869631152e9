"""A stand-in for a CUDA GPU that is not there, for Triton's real JIT, compiler and launcher.

With `install(capability)` Triton believes in one GPU of that compute capability: its JIT
specializes and compiles kernels exactly as it would for such a GPU (the bundled ptxas builds the
cubin), and the launcher Triton builds is its own Python class, so the arguments it hands to its C
launch function are what a GPU would get. The stand-in for that C function launches nothing: it
checks every call against the format the real one parses (the generated launcher's
PyArg_ParseTuple string up to Triton 3.6, the fixed one of 3.7 and newer) and, once told which
tensor is the output, "runs the kernel" by filling it with a digest of every other argument, so a
call that passes anything else than Triton's own leaves other bytes.

Use it in a process of its own that has not run the interpreter: it replaces Triton's driver.
"""
import ctypes
import hashlib
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.backends.nvidia.driver as nvidia  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

TRITON = tuple(int(part) for part in triton.__version__.split(".")[:2])
STREAM, FUNCTION = 0x5EED, 0xF00D
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
    if isinstance(value, tuple):
        return tuple(map(_reaching_the_gpu, value))
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
        return self.capability  # one cache per capability in Triton's JIT

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return STREAM

    def get_current_target(self):
        return GPUTarget("cuda", self.capability, 32)

    def get_device_capability(self, device=None):
        return divmod(self.capability, 10)

    def get_active_torch_device(self):
        return torch.device("cpu")

    @staticmethod
    def is_active():
        return True


def install(capability):
    """Make Triton's NVIDIA backend believe in one GPU of `capability` (75 for a T4)."""
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
    torch._C._cuda_getCurrentRawStream = lambda index: STREAM  # what the wrapper asks torch
    torch._C._cuda_getDevice = lambda: None  # the current device: a CPU tensor's index
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

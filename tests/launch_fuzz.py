"""A stateful differential fuzzer of the launch path (hypothesis' RuleBasedStateMachine): it makes 4-bit
weights, calls them and changes them the way people do, and compares every call with the reference.

The property, for every call: dequantize_nf4 returns bitsandbytes' tensor (the same bits, shape, strides and
dtype), or raises the named error ("dequantize_nf4: ...") a fresh validation of the same state raises; never
other bits, never another exception; a state bitsandbytes refuses is refused; and the current GPU is the one
before the call.

Two backends, one machine:
- "gpu": the reference is bitsandbytes' dequantize_4bit of the state as it is then, compared with torch.equal.
  It is asked only where a fresh validation accepts the state (a state validation refuses may hold tensors
  bitsandbytes would read out of bounds); where it raises, our call must have raised.
- "stand-in" (CPU, tests/offline_gpu.py, two stand-in GPUs): no kernel runs, so "the same bits" means that
  our call made exactly one C launch, with exactly the arguments (and the GPU current) of Triton's own launch
  of the freshly validated state, made with W's GPU current and its stream by the fuzzer (the stand-in's
  record of every launch); shape, strides and dtype are bitsandbytes' (on the CPU) where it accepts the state.
  No launch may read the memory of a table or of a field's copy freed before it: the stand-in watches both.

What it does, drawn at random (a rule each): make a weight (odd sizes and (1, n), fp16/bf16/fp32, nf4/fp4, nested
or not, blocksizes 64 to 4096, on either GPU); call it as W, W.t() or a proxy of W, on the current stream or
another, in this thread or another; replace, swap (`t.data = ...`), change in place, reinterpret at the same
address (another dtype, fewer values, stride 0, a lazily negated view), shrink its storage at its address
(`resize_`), make it sparse, free it (`resize_(0)`), set it to the tensor class itself, delete or set to None each
quant-state field, or set it to a value of another type (a tuple shape of floats or holding a tensor changed in place, nested as a tensor changed in
place, a str subclass equal to anything, a shape holding a size equal to anything); make one field read another
value on one of its reads during a call, or a new copy at every read (a property); make a field a tensor subclass
(one copying when detached, one whose dtype reads as another), or it or W a tensor without memory (a zero tensor);
change W (`t_()`, `unsqueeze_(0)`, `.data` as a (1, n) view, a stride-0
view, a 0-dim view, a lazily negated view, its bytes as complex, called, then their lazy conjugate, its storage
shrunk or freed, freed and another allocated in its place); put everything back; switch the current GPU; set and
clear a launch hook (a function, or one that reads as False), Triton's debug mode, an instrumentation mode, a
stages inspection hook (3.7+), a pre-run hook and the kernel's own debug flag, and require each call made while one
is set to go through Triton's launch; set CONFIG_OVERRIDE, change a LAUNCH_CONFIGS entry in place, keep at most one
or two plans; run the wrapper cell again, as it is or with its blocksize check edited (CONFIG_OVERRIDE set again, the same
object, or not); assign BLOCKSIZES from another cell (without 4096, as a list, 4096 removed from that list in
place, holding a list); drop the kept tables (freed unless a plan holds one); make a first call under torch's default dtype bfloat16, float16 or float64;
set a state2.blocksize of 4, 8 or 16 with a state2.absmax to match; give the offset more dimensions than absmax;
call (a weight's first or not) while torch.empty or torch.empty_strided makes meta tensors, as accelerate's
init_empty_weights made it; call under a FakeTensorMode, a FlopCounterMode and make_fx (whose graph must hold the kernel), and under torch.func's grad, vmap and vmap of grad; make two threads' first calls race for a table; on a GPU, capture a call in a CUDA graph (a process's first or not), replay it or not
before eager calls, delete the graphs, empty the cache and allocate over the freed blocks.

    python tests/launch_fuzz.py --backend stand-in|gpu [--examples N] [--steps K] [--gpus G] [--fixed-seed] [--no-shrink]

prints one JSON line: the examples and calls run, the failure hypothesis found (its shortest steps), if any, the
first Finding raised and the first other exception a call's check or graph work raised.
"""
import argparse
import contextlib
import copy
import functools
import gc
import json
import os
import re
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
BACKEND = "gpu" if "gpu" in sys.argv else "stand-in"
if BACKEND == "stand-in":
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # bitsandbytes' CPU dequantization, eager (no recompiles)
    import offline_gpu  # noqa: F401  (before torch and triton are used: it replaces Triton's driver)

import numpy  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional as bnbf  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from hypothesis import HealthCheck, Phase, settings, strategies as st  # noqa: E402
from hypothesis.stateful import Bundle, RuleBasedStateMachine, precondition, rule, run_state_machine_as_test  # noqa: E402

from benchmarks.cells import NOTEBOOK, kernel_cell_sources, load_kernel_cells  # noqa: E402
from reference import bits  # noqa: E402

NAMED = "dequantize_nf4: "
WRAPPER_CELL = kernel_cell_sources(NOTEBOOK)[1]  # (the kernel, the wrapper, the launch path)
assert WRAPPER_CELL.startswith("# @title The wrapper"), WRAPPER_CELL[:80]
WRAPPER_CELL_CODE = compile(WRAPPER_CELL, "the wrapper cell, run again", "exec")
# the blocksize check, edited to refuse 4096 (the last blocksize), what it reads as it is
BLOCKSIZE_CHECK = re.search(r"or blocksize not in (\w+):", WRAPPER_CELL)
assert BLOCKSIZE_CHECK and WRAPPER_CELL.count(BLOCKSIZE_CHECK[0]) == 1, "the blocksize check moved"
WITHOUT_4096 = f"or blocksize not in {BLOCKSIZE_CHECK[1]}[:-1]:"
WRAPPER_CELL_WITHOUT_4096 = compile(WRAPPER_CELL.replace(BLOCKSIZE_CHECK[0], WITHOUT_4096), "the wrapper cell, edited",
                                    "exec")
ROWS, COLUMNS = (1, 2, 3, 16, 33), (64, 96, 130, 256, 520)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCKSIZES = (64, 256, 4096)
TENSOR_FIELDS = ("absmax", "offset", "code", "state2.absmax", "state2.code")
OTHER_FIELDS = ("quant_type", "dtype", "shape", "blocksize", "nested", "state2", "state2.blocksize",
                "state2.dtype", "state2.nested")
EXCLUSIVE = {"launch enter hook": ["launch enter hook reading as False"],
             "launch enter hook reading as False": ["launch enter hook"]}
FLICKERING_FIELDS = ("absmax", "offset", "state2.absmax", "state2.code", "quant_type", "dtype")
SAME_SIZE_DTYPE = {torch.uint8: torch.int8, torch.float32: torch.int32, torch.float16: torch.int16,
                   torch.bfloat16: torch.float16, torch.float64: torch.int64}
SAME_SIZE_DTYPE.update({other: dtype for dtype, other in list(SAME_SIZE_DTYPE.items())})


class Finding(AssertionError):
    """A call that broke the property. Each is recorded as raised: a fault that depends on the GPU's memory
    (a block reused or not) may not show again while hypothesis replays the steps to shorten them."""

    def __init__(self, message):
        super().__init__(message)
        Stats.findings.append(message)


class Stats:
    calls = 0
    examples = 0
    outcomes = {}  # "bits through a plan", "bits, validated", "refused" -> count
    findings = []  # each Finding's message, as raised
    errors = []  # each other exception a call's check or graph work raised (_recording_errors)

    @classmethod
    def count(cls, outcome):
        cls.outcomes[outcome] = cls.outcomes.get(outcome, 0) + 1


# ---------------------------------------------------------------------------------------------- backends
class StandIn:
    """Two stand-in GPUs (offline_gpu.py) of capability 7.5; the reference is Triton's own launch's record."""
    gpus = 2

    def __init__(self):
        offline_gpu.install(75, gpus=self.gpus)
        self.kernel = load_kernel_cells()
        self.kernel.device_capability = lambda device: (7, 5)  # the CPU tensors are the stand-in GPUs'
        self.device = torch.device("cpu")
        # (a weak reference to its storage, its address) of each table the cells made and each tensor a field made
        # anew for a read; the tables (weakly); for each launch of our last call, the addresses freed by then
        self.made, self.tables, self.freed_at_launch = [], [], []
        offline_gpu.WATCHERS.append(self._note_the_freed)
        self.watch_tables()

    def watch_tables(self):
        """Watch each table the cells make from now on (again after the wrapper cell runs: it defines its maker and
        decodes the codebooks whose copies, on the CPU themselves, are the kept tables)."""
        make = self.kernel.bitsandbytes_codebook

        def making(quant_type, device):
            return self.watch_table(make(quant_type, device))
        self.kernel.bitsandbytes_codebook = making
        for table in self.kernel._CODEBOOKS.values():
            self.watch_table(table)

    def watch_table(self, table):
        """Watch a table the cells made; returns it."""
        self.tables.append(weakref.ref(table))
        self.made_anew(table)
        return table

    def made_anew(self, tensor):
        """Watch tensor (a table, a copy a field made for one read): no launch may read its memory once freed. Its
        storage's Python object lives exactly as long as the storage (torch keeps it while any view is alive)."""
        self.made.append((weakref.ref(tensor.untyped_storage()), tensor.data_ptr()))

    def _made(self, tensor):
        """Whether tensor views a storage watched by made_anew."""
        storage = tensor.untyped_storage()
        return any(reference() is storage for reference, _ in self.made)

    def forget(self):
        """A new example: nothing made before it is watched but the codebooks the wrapper cell decoded."""
        del self.made[:], self.tables[:]
        for table in self.kernel._CODEBOOKS.values():
            self.watch_table(table)

    def _copies_marked(self, records):
        """Launch records with each address a watched tensor had written as COPY (each call reads its own copies
        of a field made anew at each read, all of one value)."""
        watched = {address for _, address in self.made}

        def mark(value):
            if isinstance(value, (tuple, list)):
                return type(value)(mark(inner) for inner in value)
            return "COPY" if isinstance(value, int) and value in watched else value
        return mark(records)

    def freed_reads(self, launches, ours, validated):
        """The watched addresses freed before our last call's launches that they read: out's left out, and those
        of the tensors of `validated` (a fresh validation's: the allocator handed them out again), but watched ones."""
        held = self._held(validated)
        read = set()
        for (gpu, arguments), freed in zip(launches, self.freed_in_our_call):
            if isinstance(ours, torch.Tensor):
                gpu, arguments = _with_output((gpu, arguments), ours)
            read |= (freed - held) & set(_integers(arguments))
        return sorted(map(hex, read))

    def _held(self, validated):
        """The addresses of the tensors of a fresh validation's layout (None: none) that are not watched ones."""
        tensors = [t for t in (validated or ()) if isinstance(t, torch.Tensor)]
        return {t.data_ptr() for t in tensors if not self._made(t)}

    def _note_the_freed(self, launch):
        alive = {address for reference, address in self.made if reference() is not None}
        self.freed_at_launch.append({address for reference, address in self.made if reference() is None} - alive)

    def to_gpu(self, tensor, gpu):
        """A copy of tensor on stand-in GPU `gpu` (its own storage, as a move makes)."""
        return offline_gpu.on_gpu(tensor, gpu)

    def gpu_of(self, tensor):
        return tensor.get_device()

    def table_at(self, address):
        """The table the cells made at `address`, alive; None for one made for a call alone and freed since (the
        freed-at-launch check saw it alive at its launch)."""
        for reference in self.tables:
            table = reference()
            if table is not None and table.data_ptr() == address:
                return table.cpu()
        if any(made_at == address for _, made_at in self.made):
            return None
        raise Finding(f"a launch read a table at {address:#x}, which the cells never made")

    def current_gpu(self):
        return offline_gpu.GPUS.current

    def set_current_gpu(self, gpu):
        offline_gpu.GPUS.exchange(gpu)

    @contextlib.contextmanager
    def other_stream(self, gpu):
        offline_gpu.GPUS.streams[gpu] = offline_gpu.STREAM + 0x100 + gpu
        try:
            yield
        finally:
            offline_gpu.GPUS.streams.pop(gpu, None)

    def call(self, W, q):
        """Our call: its result or exception, and the launches it made."""
        del offline_gpu.LAUNCHES[:], self.freed_at_launch[:]
        try:
            result = self.kernel.dequantize_nf4(W, q)
        except Exception as error:  # judged by check()
            result = error
        self.freed_in_our_call = list(self.freed_at_launch)
        return result, list(offline_gpu.LAUNCHES)

    def expected(self, W, q, validated):
        """Triton's own launch of the freshly validated state, W's GPU current: its record, and
        bitsandbytes' output (its shape, strides and dtype) or its exception."""
        kernel = self.kernel
        layout = validated
        out = torch.empty(layout.shape, dtype=layout.dtype)
        previous = offline_gpu.GPUS.exchange(self.gpu_of(layout.packed))
        del offline_gpu.LAUNCHES[:]
        try:
            kernel.launch_via_triton(layout, out, kernel.launch_config((7, 5)), (7, 5))
        finally:
            offline_gpu.GPUS.exchange(previous)
        record = [_with_output(launch, out) for launch in offline_gpu.LAUNCHES]
        try:
            bnb = bnbf.dequantize_4bit(W, q)
        except RuntimeError as error:  # its CPU kernel's own limits (a (n, 1) bf16 W.t() it cannot view as
            bnb = out.t() if validated.transposed else out  # bytes): its CUDA path's layout, by its rule
            if "doesn't match the broadcast shape" in str(error):  # `absmax += offset`: on every device
                bnb = error
        except Exception as error:  # a refusal on every device: a missing field, a value it rejects
            bnb = error
        return record, bnb

    def check(self, W, q, validated, ours, launches):
        record, bnb = self.expected(W, q, validated)
        if isinstance(bnb, Exception):
            raise Finding(f"ours returned, bitsandbytes raised {type(bnb).__name__}: {bnb}")
        mine = [_with_output(launch, ours) for launch in launches]
        # a watched tensor freed before our launch read its address, unless the state holds a tensor there now (the
        # allocator handed it out again: it is the state's)
        held = self._held(validated)
        for (gpu, arguments), freed in zip(mine, self.freed_in_our_call):
            read = (freed - held) & set(_integers(arguments))
            if read:
                raise Finding(f"a launch read {sorted(map(hex, read))}, freed before it (a table, a field's copy)")
        if len(mine) == len(record) == 1:
            # the table is compared by its values, bitsandbytes' for the quant type (str(): a str subclass's
            # plain str, as its op reads it): ours may be one kept before the fuzzer forgot the kept tables
            address, table = validated.code.data_ptr(), bnbf.get_4bit_type(str(q.quant_type), "cpu")
            for launched in [address, *_at(mine[0], record[0], address)]:
                held = self.table_at(launched)
                if held is not None and not torch.equal(held, table):
                    raise Finding(f"a table launched is not bitsandbytes' {str(q.quant_type)!r} table")
            mine, record = [_masked(mine[0], record[0], address)], [_masked(record[0], record[0], address)]
        mine, record = self._copies_marked(mine), self._copies_marked(record)
        if mine != record:
            raise Finding(f"our launches differ from Triton's for the fresh state:\n ours   {mine}\n Triton {record}")
        _same_layout(ours, bnb)


def _integers(value):
    """The ints in a launch record's nested tuples."""
    if isinstance(value, tuple):
        return [found for inner in value for found in _integers(inner)]
    return [value] if isinstance(value, int) else []


def _masked(launch, reference, address):
    """launch with TABLE where reference holds `address` (records of one structure)."""
    def mask(value, reference_value):
        if isinstance(value, tuple) and isinstance(reference_value, tuple) and len(value) == len(reference_value):
            return tuple(mask(v, r) for v, r in zip(value, reference_value))
        return "TABLE" if reference_value == address and isinstance(reference_value, int) else value
    return mask(launch, reference)


def _at(launch, reference, address):
    """launch's values where reference holds `address` (records of one structure)."""
    if isinstance(launch, tuple) and isinstance(reference, tuple) and len(launch) == len(reference):
        return [found for value, other in zip(launch, reference) for found in _at(value, other, address)]
    return [launch] if reference == address and isinstance(reference, int) else []


def _with_output(launch, out):
    """A stand-in launch record with out's address written as OUT (each launch has its own output)."""
    gpu, arguments = launch
    address = out.data_ptr()

    def mark(value):
        if isinstance(value, tuple):
            return tuple(mark(v) for v in value)
        return "OUT" if value == address and isinstance(value, int) else value
    return gpu, mark(arguments)


class Gpu:
    """This machine's GPUs; the reference is bitsandbytes' dequantize_4bit."""

    def __init__(self, gpus):
        self.gpus = gpus
        self.kernel = load_kernel_cells()
        self.device = torch.device("cuda", 0)
        self.graphs, self.tables = [], []  # (no table watched: a launch on freed memory shows in the bits)

    def to_gpu(self, tensor, gpu):
        """A copy of tensor on GPU `gpu` (-1: the CPU, where a change moved a field)."""
        return tensor.to(f"cuda:{gpu}" if gpu >= 0 else "cpu", copy=True)

    def made_anew(self, tensor):
        """(On a GPU, a launch on freed memory shows in the bits: nothing to watch.)"""

    def forget(self):
        """(Nothing watched.)"""

    def watch_tables(self):
        """(Nothing watched.)"""

    def watch_table(self, table):
        """(Nothing watched.)"""
        return table

    def freed_reads(self, launches, ours, validated):
        """(A launch on freed memory shows in the bits.)"""
        return []

    def gpu_of(self, tensor):
        return tensor.get_device()

    def current_gpu(self):
        return torch.cuda.current_device()

    def set_current_gpu(self, gpu):
        torch.cuda.set_device(gpu)

    @contextlib.contextmanager
    def other_stream(self, gpu):
        """A new stream current on `gpu`, the current GPU left as it was."""
        current = torch.cuda.current_device()
        stream = torch.cuda.Stream(device=gpu)
        stream.wait_stream(torch.cuda.current_stream(gpu))
        with torch.cuda.stream(stream):  # (makes `gpu` current too)
            torch.cuda.set_device(current)
            yield
        torch.cuda.current_stream(gpu).wait_stream(stream)

    def call(self, W, q):
        try:
            return self.kernel.dequantize_nf4(W, q), []
        except Exception as error:
            return error, []

    def check(self, W, q, validated, ours, launches):
        try:
            bnb = bnbf.dequantize_4bit(W, q)
        except Exception as error:
            raise Finding(f"ours returned, bitsandbytes raised {type(error).__name__}: {error}")
        _same_layout(ours, bnb)
        if not torch.equal(ours, bnb):
            differ = (ours != bnb).sum().item()
            raise Finding(f"{differ} of {bnb.numel()} values differ from bitsandbytes'")


def _same_layout(ours, reference):
    if (ours.shape, ours.stride(), ours.dtype) != (reference.shape, reference.stride(), reference.dtype):
        raise Finding(f"ours {tuple(ours.shape)} {ours.stride()} {ours.dtype}, bitsandbytes "
                      f"{tuple(reference.shape)} {reference.stride()} {reference.dtype}")


# ---------------------------------------------------------------------------------------------- weights
class Weight:
    """A weight the machine made: W (a Params4bit), its quant state, and what they were made with, to put
    them back: the fields' objects (state2 first) and their storages, W's bytes (a copy on the CPU: W
    itself may be freed)."""

    def __init__(self, W, q, gpu, label):
        self.W, self.q, self.gpu, self.label = W, q, gpu, label
        self.pristine_W = (W.data.cpu().clone(), W.get_device())
        self.fields = {name: _get(q, name) for name in ("state2",) + TENSOR_FIELDS + OTHER_FIELDS}
        self.field_data = {name: value.data for name, value in self.fields.items()
                           if isinstance(value, torch.Tensor)}

    def __repr__(self):
        return self.label


def _owner(q, name):
    if name.startswith("state2."):
        return getattr(q, "state2", None), name[len("state2."):]
    return q, name


def _get(q, name):
    owner, attribute = _owner(q, name)
    return getattr(owner, attribute, None)


def _set(q, name, value):
    owner, attribute = _owner(q, name)
    if owner is not None:
        setattr(owner, attribute, value)


def _delete(q, name):
    owner, attribute = _owner(q, name)
    if owner is not None and hasattr(owner, attribute):
        delattr(owner, attribute)


# how a tensor field changes: (name, change(tensor) -> replacement or None for an in-place change)
def _tensor_changes(backend):
    def other_gpu(t):
        return backend.to_gpu(t, 1 - backend.gpu_of(t)) if backend.gpus > 1 else t.cpu()

    def same_size_dtype(t):
        return t.view(SAME_SIZE_DTYPE[t.dtype])

    return {
        "replaced by an equal copy": lambda t: t.clone(),
        "t.data = an equal copy": lambda t: _swap(t, t.data.clone()),
        "t.data = other values": lambda t: _swap(t, _other_values(t)),
        "other values in place": lambda t: _in_place(t, _other_values(t)),
        "the same values in place": lambda t: _in_place(t, t.clone()),
        "same address, another dtype": same_size_dtype,
        "t.data = same address, another dtype": lambda t: _swap(t, same_size_dtype(t.data)),
        "same address, fewer values": lambda t: _fewer(t),
        "t.data = same address, fewer values": lambda t: _swap(t, _fewer(t.data)),
        "same address, stride 0": lambda t: _stride_0(t),
        "t.data = same address, stride 0": lambda t: _swap(t, _stride_0(t.data)),
        "on another device": other_gpu,
        "a copy whose storage is freed": _freed_copy,
        "a lazily negated view at its address": torch._neg_view,
        "t.data = a lazily negated view at its address": lambda t: _swap(t, torch._neg_view(t.data)),
        "its storage shrunk at its address": _shrunk,
        "a sparse copy": lambda t: t.to_sparse(),
    }


def _holds_its_bytes(t):
    """Whether t is a dense tensor of its own values (not sparse, nor a lazily negated or conjugated view) and its
    storage holds the bytes t spans (not freed, nor shrunk): only then may a change read or write them."""
    if t.layout != torch.strided or t.is_neg() or t.is_conj() or t.data_ptr() == 0:
        return False
    return t.untyped_storage().nbytes() >= (t.storage_offset() + t.numel()) * t.element_size()


def _shrunk(t):
    """t's storage shrunk in place by resize_, twice, one byte then two: the second often gets the first's address
    back (the allocator hands the freed block out again), with t now spanning past its storage's end."""
    if _holds_its_bytes(t) and t.nbytes > 2:
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        storage.resize_(nbytes - 1)
        storage.resize_(nbytes - 2)
    return None


def _freed_copy(t):
    """A copy of t whose storage is then freed, as FSDP frees one (resize_(0))."""
    copied = t.clone()
    copied.untyped_storage().resize_(0)
    return copied


def _fewer(t):
    """A view of t at its address with one value fewer (none, where it holds one)."""
    flat = t.reshape(-1)
    return flat[:max(flat.numel() - 1, 0)]


def _stride_0(t):
    """A view of t at its address holding as many values, all its first (stride 0)."""
    return t.reshape(-1)[:1].expand(t.numel())


def _swap(t, data):
    t.data = data
    return None  # (the same object, changed)


def _in_place(t, values):
    if t.is_contiguous():  # (a stride-0 view has one value to write)
        with torch.no_grad():
            t.copy_(values)
    return None


def _other_values(t):
    """Values of t's kind, drawn anew: codes for uint8, positive scales for fp32, a table otherwise."""
    generator = torch.Generator().manual_seed(t.numel() * 7 + 1)
    if t.dtype == torch.uint8:
        values = torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=generator)
    else:
        values = (torch.rand(t.shape, generator=generator) + 0.5).to(t.dtype)
    return values.to(t.device)


def _other_values_of(name):
    """Values people set a field that is not a tensor to: valid ones and refused ones."""
    return {
        "quant_type": ["nf4", "fp4", "int4", None],
        "dtype": [torch.float16, torch.bfloat16, torch.float32, torch.int8],
        "shape": ["list", "list, changed in place", "tuple", "floats", "rows doubled", "(1, n)",
                  "holding a tensor", "its tensor changed in place", "numpy int16 sizes"],
        "blocksize": [64, 128, 4096, 48, 16, 64.0, True],
        "nested": [True, False, "a tensor", "its tensor changed in place"],
        "state2": [None, "another weight's"],
        "state2.blocksize": [256, 128, 8, 4, 3, 256.0, 2**31],
        "state2.dtype": [torch.float32, torch.float16],
        "state2.nested": [False, True, "a tensor", "its tensor changed in place"],
    }[name]


class _EqualToAnything(str):
    """A str subclass that compares equal to everything (bitsandbytes picks its table by ==)."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class _SizeEqualToAnything(int):
    """An int subclass that compares equal to everything and hashes as another size: a torch.Size keeps it as
    it is, so a shape holding one hashes and compares as the shape it stands in for."""

    def __new__(cls, value, hashed_as):
        size = super().__new__(cls, value)
        size.hashed_as = hashed_as
        return size

    def __eq__(self, other):
        return True

    def __hash__(self):
        return hash(self.hashed_as)


class _CopiedWhenDetached(torch.Tensor):
    """A tensor subclass whose detach() makes a copy (a lazily made tensor's may): its other operations a plain
    tensor's, with plain results."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
            return result.clone() if func is torch.Tensor.detach else result


class _ReadingAsAnotherDtype(torch.Tensor):
    """A tensor subclass whose dtype reads as the other dtype of its size (int32 bytes as float32, uint8 as int8):
    its other operations a plain tensor's, detach() keeping the subclass."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            if getattr(func, "__self__", None) is torch.Tensor.dtype:  # (the dtype property's getter)
                return SAME_SIZE_DTYPE[args[0].dtype]
            result = func(*args, **(kwargs or {}))
        return result.as_subclass(cls) if func is torch.Tensor.detach else result


# how a field becomes a tensor subclass, sharing its bytes
SUBCLASSES = {
    "copied when detached": lambda t: t.as_subclass(_CopiedWhenDetached),
    "reading as another dtype": lambda t: t.view(SAME_SIZE_DTYPE[t.dtype]).as_subclass(_ReadingAsAnotherDtype),
}


def _as_plain(q):
    """q, or where a field is one of SUBCLASSES, a copy of it (and of its state2) with that field as a plain tensor
    of its bytes."""
    fields = [name for name in TENSOR_FIELDS
              if isinstance(_get(q, name), (_CopiedWhenDetached, _ReadingAsAnotherDtype))]
    if not fields:
        return q
    q = copy.copy(q)
    if getattr(q, "state2", None) is not None:
        q.state2 = copy.copy(q.state2)
    for name in fields:
        with torch._C.DisableTorchFunctionSubclass():
            _set(q, name, _get(q, name).as_subclass(torch.Tensor))
    return q


class _Proxy:
    """An object standing in for W that forwards every attribute to it: not a tensor."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)


# ---------------------------------------------------------------------------------------------- the machine
def make_machine(backend):
    kernel = backend.kernel
    validations = _Counted(kernel.validate)
    kernel.validate = validations  # (counted: a call answered by a plan validates nothing)
    jit = kernel._dequantize_4bit_kernel
    triton_launches = _Counted(jit.run)
    jit.run = triton_launches  # (counted: kernel[grid](...) calls the JITFunction's run)
    capability = (7, 5) if BACKEND == "stand-in" else torch.cuda.get_device_capability(0)
    launch_configs, plans_kept, blocksizes = dict(kernel.LAUNCH_CONFIGS), kernel.PLANS_KEPT, kernel.BLOCKSIZES
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    tensor_changes = _tensor_changes(backend)

    class LaunchPath(RuleBasedStateMachine):
        weights = Bundle("weights")

        def __init__(self):
            super().__init__()
            Stats.examples += 1
            for state in (kernel._plans, kernel._kinds, kernel._TABLES):  # each example from a fresh process's
                state.clear()
            backend.forget()
            self.made, self.made_weights = 0, []
            self.triton_state, self.replaced_hooks = set(), {}
            self.graphs, self.wrapper_edited = [], False

        def teardown(self):
            for state in list(self.triton_state):
                self._clear(state)
            if self.wrapper_edited:
                self._run_the_wrapper_cell(WRAPPER_CELL_CODE)
            kernel.BLOCKSIZES = blocksizes
            kernel.CONFIG_OVERRIDE = None
            kernel.LAUNCH_CONFIGS.clear()
            kernel.LAUNCH_CONFIGS.update(launch_configs)
            kernel.PLANS_KEPT = plans_kept
            backend.set_current_gpu(0)
            self.graphs.clear()

        # ------------------------------------------------------------------ making weights
        @rule(target=weights, rows=st.sampled_from(ROWS), columns=st.sampled_from(COLUMNS),
              dtype=st.sampled_from(DTYPES), quant_type=st.sampled_from(["nf4", "fp4"]), nested=st.booleans(),
              blocksize=st.sampled_from(BLOCKSIZES), storage=st.sampled_from([torch.uint8, torch.bfloat16]),
              gpu=st.integers(0, 1), seed=st.integers(0, 2**16))
        def new_weight(self, rows, columns, dtype, quant_type, nested, blocksize, storage, gpu, seed):
            gpu = min(gpu, backend.gpus - 1)
            if rows * columns % 4:  # (a 16-bit storage holds whole pairs of bytes)
                storage = torch.uint8
            generator = torch.Generator().manual_seed(seed)
            values = torch.randn(rows, columns, generator=generator) * 10.0 ** (seed % 5 - 2)
            W, q = bnbf.quantize_4bit(backend.to_gpu(values, gpu), blocksize=blocksize, quant_type=quant_type,
                                      compress_statistics=nested, quant_storage=storage)
            if BACKEND == "stand-in":  # quantized on the CPU: every tensor onto its stand-in GPU
                W = backend.to_gpu(W, gpu)
                for name in TENSOR_FIELDS:
                    if _get(q, name) is not None:
                        _set(q, name, backend.to_gpu(_get(q, name), gpu))
            q.dtype = dtype
            W = bnb.nn.Params4bit(data=W, requires_grad=False, quant_state=q, blocksize=blocksize,
                                  quant_type=quant_type, bnb_quantized=True)
            self.made_weights.append(Weight(W, q, gpu, ""))
            self.made += 1
            label = f"w{self.made}({rows}x{columns} {str(dtype)[6:]} {quant_type} {'nested' if nested else 'plain'} " \
                    f"bs{blocksize} {str(storage)[6:]} gpu{gpu})"
            self.made_weights[-1].label = label
            self._observe(self.made_weights[-1])  # (its plan made: a later change meets it)
            return self.made_weights[-1]

        # ------------------------------------------------------------------ calls
        @rule(weight=weights, form=st.sampled_from(["W", "W.t()", "a proxy of W"]), other_stream=st.booleans(),
              thread=st.booleans())
        def call(self, weight, form, other_stream, thread):
            W = weight.W
            if form == "W.t()" and W.dim() <= 2 and _holds_its_bytes(W):  # (torch views no freed storage)
                W = W.t()
            gpu = backend.gpu_of(W) if isinstance(W, torch.Tensor) else 0
            if form == "a proxy of W":
                W = _Proxy(W)
            stream = backend.other_stream(max(gpu, 0)) if other_stream else contextlib.nullcontext()
            with stream:
                if thread:
                    self._in_a_thread(lambda: self._checked_call(W, weight.q))
                else:
                    self._checked_call(W, weight.q)

        def _observe(self, *weights):
            """Each weight called as it is now, and checked (every change is followed by this)."""
            for weight in weights or self.made_weights:
                if weight.W is not None:
                    self._checked_call(weight.W, weight.q)

        def _drop_the_plan(self, W, q):
            """The plan for W and q as they read now forgotten (their next call is a first call); a key no dict
            can hold is a Finding (every call looks its key up)."""
            key = kernel.key_of(W, q)[0]
            try:
                kernel._plans.pop(key, None)
            except TypeError as error:
                raise Finding(f"key_of gave a key no dict can hold: {error}") from error

        def _in_a_thread(self, work):
            outcome = []

            def run():
                try:
                    work()
                    outcome.append(None)
                except BaseException as error:
                    outcome.append(error)
            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
            if outcome[0] is not None:
                raise outcome[0]

        @_recording_errors
        def _checked_call(self, W, q):
            ours, launches, planned = self._call(W, q)
            q = _as_plain(q)  # (the reference reads a field of a tensor subclass by its bytes, as the kernel does)
            validated, refusal = fresh_validation(kernel, W, q)
            self._judge(W, q, ours, launches, validated, refusal)
            Stats.count("refused" if isinstance(ours, Exception) else
                        "bits through a plan" if planned else "bits, validated")

        def _call(self, W, q):
            """Our call: its result (or error), its stand-in launches, whether it validated nothing; the
            current GPU as before it, and Triton's launch taken while a per-launch state is set."""
            Stats.calls += 1
            before, plans_before = backend.current_gpu(), len(kernel._plans)
            validations.count, triton_launches.count = 0, 0
            ours, launches = backend.call(W, q)  # first: a process's first call makes the kept table
            if plans_before < len(kernel._plans) > max(kernel.PLANS_KEPT, 1):  # (a lowered bound: the next keep)
                raise Finding(f"a call kept a plan beyond PLANS_KEPT ({kernel.PLANS_KEPT}): {len(kernel._plans)}")
            if backend.current_gpu() != before:
                raise Finding(f"the call left GPU {backend.current_gpu()} current, not {before}")
            if self.triton_state and not isinstance(ours, Exception) and triton_launches.count == 0:
                raise Finding(f"a call while {sorted(self.triton_state)} was set skipped Triton's launch")
            return ours, launches, validations.count == 0

        def _judge(self, W, q, ours, launches, validated, refusal):
            """ours against a fresh validation of W and q (and, where it accepts them, the reference)."""
            if isinstance(ours, Exception):
                if not str(ours).startswith(NAMED):
                    raise Finding(f"ours raised {type(ours).__name__}: {ours}") from ours
                if refusal is None:
                    raise Finding(f"ours refused a state a fresh validation accepts: {ours}") from ours
                if (type(ours), str(ours)) != (type(refusal), str(refusal)):
                    raise Finding(f"ours refused with {ours!r}, a fresh validation with {refusal!r}")
                return
            if refusal is not None:
                raise Finding(f"ours returned where a fresh validation refuses: {refusal}")
            if any(isinstance(t, torch.Tensor) and t.data_ptr() == 0 for t in validated):
                raise Finding("ours returned, launched on a tensor without memory (a fake or zero tensor)")
            backend.check(W, q, validated, ours, launches)

        # ------------------------------------------------------------------ changing the quant state
        @rule(weight=weights, field=st.sampled_from(TENSOR_FIELDS), how=st.sampled_from(sorted(tensor_changes)))
        def change_a_tensor(self, weight, field, how):
            tensor = _get(weight.q, field)
            if isinstance(tensor, torch.Tensor) and _holds_its_bytes(tensor):  # (a freed one is only put back)
                replacement = tensor_changes[how](tensor)
                if replacement is not None:
                    _set(weight.q, field, replacement)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(TENSOR_FIELDS + OTHER_FIELDS),
              how=st.sampled_from(["deleted", "set to None"]))
        def remove_a_field(self, weight, field, how):
            if how == "deleted":
                _delete(weight.q, field)
            else:
                _set(weight.q, field, None)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(OTHER_FIELDS), data=st.data())
        def change_a_field(self, weight, field, data):
            choice = data.draw(st.sampled_from(_other_values_of(field)))
            held = _get(weight.q, field)
            if choice == "its tensor changed in place":  # the tensor the field holds (a shape's first size)
                inner = held[0] if isinstance(held, (tuple, list)) and held else held
                if isinstance(inner, torch.Tensor):
                    inner.copy_(inner.logical_not() if inner.dtype == torch.bool else inner * 2)
            elif choice == "a tensor":
                _set(weight.q, field, torch.tensor(bool(held)))
            elif field == "shape" and choice == "list, changed in place":
                if isinstance(held, list) and held:
                    held[0] = held[0] + 1  # the list the quant state holds
            elif field == "shape" and isinstance(choice, str):
                shape = weight.fields["shape"]
                _set(weight.q, field, {"list": list(shape), "tuple": tuple(shape), "(1, n)": (1, shape.numel()),
                                       "floats": tuple(float(size) for size in shape),
                                       "holding a tensor": (torch.tensor(shape[0]), *shape[1:]),
                                       "numpy int16 sizes": torch.Size([numpy.int16(size) for size in shape]),
                                       "rows doubled": torch.Size([shape[0] * 2, *shape[1:]])}[choice])
            elif field == "state2" and choice == "another weight's":
                others = [w for w in self.made_weights if w is not weight and _get(w.q, "state2") is not None]
                _set(weight.q, field, _get(others[0].q, "state2") if others else None)
            else:
                _set(weight.q, field, choice)
            self._observe(weight)

        @rule(weight=weights, blocksize2=st.sampled_from([4, 8, 16]))
        def a_state2_blocksize_with_a_state2_absmax_to_match(self, weight, blocksize2):
            # another state2.blocksize than bitsandbytes' 256, with as many state2.absmax values as it takes (with the
            # old count, such a state is refused for the count): from 8, bitsandbytes' bits; below, a named refusal
            # (bitsandbytes' CUDA kernel scales 8 absmax codes at once)
            absmax = _get(weight.q, "absmax")
            if _get(weight.q, "state2") is not None and isinstance(absmax, torch.Tensor):
                count = -(-absmax.numel() // blocksize2)
                values = torch.rand(count, generator=torch.Generator().manual_seed(count)) + 0.5
                _set(weight.q, "state2.absmax", backend.to_gpu(values, backend.gpu_of(absmax)))
                _set(weight.q, "state2.blocksize", blocksize2)
            self._observe(weight)

        @rule(weight=weights)
        def quant_type_a_str_subclass(self, weight):
            # one equal to anything (bitsandbytes picks its table by ==), its first call in a fresh process
            self.forget_the_kept_tables()
            held = _get(weight.q, "quant_type")
            _set(weight.q, "quant_type", _EqualToAnything("fp4" if held == "nf4" else "nf4"))
            self._observe(weight)

        @rule(weight=weights)
        def shape_holding_a_size_equal_to_anything(self, weight):
            # twice the rows, equal to any size and hashed as the rows: a torch.Size keeps such an int as it is
            shape = weight.fields["shape"]
            _set(weight.q, "shape", torch.Size([_SizeEqualToAnything(shape[0] * 2, shape[0]), *shape[1:]]))
            self._observe(weight)

        @rule(weight=weights, dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]),
              dims=st.integers(0, 1))
        def offset_of_another_dtype(self, weight, dtype, dims):
            offset = _get(weight.q, "offset")
            if (isinstance(offset, torch.Tensor) and offset.numel() == 1 and offset.is_floating_point()
                    and _holds_its_bytes(offset)):
                _set(weight.q, "offset", (offset.double() + 0.01).to(dtype).reshape([1] * dims))
            self._observe(weight)

        @rule(weight=weights, dims=st.integers(1, 3))
        def offset_of_more_dimensions(self, weight, dims):
            # its one value in `dims` dimensions, at its address: more than absmax's (one, as bitsandbytes makes
            # it), and bitsandbytes' `absmax += offset` cannot broadcast it
            offset = _get(weight.q, "offset")
            if isinstance(offset, torch.Tensor) and offset.numel() == 1 and _holds_its_bytes(offset):
                offset.data = offset.data.reshape([1] * dims)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(FLICKERING_FIELDS), read=st.integers(1, 3),
              first_call=st.booleans())
        def read_a_field_differently_once(self, weight, field, read, first_call):
            # one call during which the field reads another value on its `read`-th read (a property, another
            # thread setting it and back): that call must answer one of the two states, and no later call
            # may launch on the other value under this state's key. first_call: on a copy of the quant state
            # with its own tensors (the first call of a weight, which validates and plans)
            if first_call and weight.W is not None and _holds_its_bytes(weight.W):
                weight = self._with_own_tensors(weight)
            owner, name = _owner(weight.q, field)
            steady = getattr(owner, name, None) if owner is not None else None
            if steady is not None and weight.W is not None:
                other = _flicker_value(steady, name)
                with _reading_once(owner, name, other, read):
                    ours, launches, _ = self._call(weight.W, weight.q)
                self._judge_either(weight, [_put(owner, name, steady), _put(owner, name, other)], ours, launches)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(("W",) + TENSOR_FIELDS))
        def swapped_and_back_during_a_first_call(self, weight, field):
            # another thread swaps a tensor's storage (`t.data = ...`; W: t_()) as validation starts and back
            # once the launch is made (sys.setprofile stands in for the thread switches): that call answers the
            # state before or during the swap, and no plan may keep what the swap showed
            if weight.W is None or not _holds_its_bytes(weight.W):
                return
            weight = self._with_own_tensors(weight)
            swap = _swap_and_back(weight, field)
            if swap is not None:
                def switch(frame, event, argument):
                    if event == "call" and frame.f_code.co_name == "validate":
                        swap.there()
                    elif event == "return" and frame.f_code.co_name == "plan_and_launch":
                        swap.back()
                sys.setprofile(switch)
                try:
                    ours, launches, _ = self._call(weight.W, weight.q)
                finally:
                    sys.setprofile(None)
                    swap.back()
                self._judge_either(weight, [_as_it_is, swap.entered], ours, launches)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(("W",) + TENSOR_FIELDS))
        def swapped_during_a_later_call(self, weight, field):
            # another thread swaps a tensor's storage (`t.data = ...`, as module.cpu() does) between a planned call's
            # key and its launch, and drops the old one: the launch may read the state before or after the swap, but
            # never memory freed (the stand-in watches the old storage)
            if weight.W is None or not _holds_its_bytes(weight.W):
                return
            weight = self._with_own_tensors(weight)
            self._observe(weight)  # (its plan made)
            held = weight.W if field == "W" else _get(weight.q, field)
            if not isinstance(held, torch.Tensor) or not _holds_its_bytes(held):
                return
            backend.made_anew(held.data)
            replacement = [backend.to_gpu(held.data, backend.gpu_of(held))]  # (an equal copy, on its GPU)

            def switch(frame, event, argument):
                if event == "return" and frame.f_code.co_name == "key_of" and replacement:
                    held.data = replacement.pop()
            sys.setprofile(switch)
            try:
                ours, launches, _ = self._call(weight.W, weight.q)
            finally:
                sys.setprofile(None)
            validated, refusal = fresh_validation(kernel, weight.W, weight.q)
            freed = backend.freed_reads(launches, ours, validated)
            if freed:
                raise Finding(f"a call read {freed}, freed by a swap after its key was read")
            if isinstance(ours, Exception) or BACKEND == "gpu":  # (an equal copy: either state gives these bits)
                self._judge(weight.W, weight.q, ours, launches, validated, refusal)
            self._observe(weight)

        def _with_own_tensors(self, weight):
            """A weight sharing W, its quant state copied with each tensor field a copy of its own."""
            q = copy.copy(weight.q)
            if getattr(q, "state2", None) is not None:
                q.state2 = copy.copy(q.state2)
            for name in TENSOR_FIELDS:
                tensor = _get(q, name)
                if isinstance(tensor, torch.Tensor) and _holds_its_bytes(tensor):
                    _set(q, name, backend.to_gpu(tensor, backend.gpu_of(tensor)))  # (a copy on its GPU)
            copied = Weight(weight.W, q, weight.gpu, weight.label + "'")
            self.made_weights.append(copied)
            return copied

        def _judge_either(self, weight, states, ours, launches):
            """ours is what one of `states` gives: each puts the weight in its state, returning what puts it back."""
            findings = []
            for enter in states:
                leave = enter()
                try:
                    self._judge(weight.W, weight.q, ours, launches, *fresh_validation(kernel, weight.W, weight.q))
                    break
                except Finding:  # (the other state may be the one answered: no finding yet)
                    findings.append(Stats.findings.pop())
                finally:
                    leave()
            else:
                raise Finding("a call that read two states answered neither:\n" + "\n".join(findings))

        @rule(weight=weights)
        def put_the_quant_state_back(self, weight):
            for name, value in weight.fields.items():
                _set(weight.q, name, value)
                if name in weight.field_data:
                    value.data = weight.field_data[name]
            self._observe(weight)

        # ------------------------------------------------------------------ changing W
        @rule(weight=weights, how=st.sampled_from(["t_()", "unsqueeze_(0)", "W.data = a (1, n) view",
                                                    "W.data = a stride-0 view", "W.data = a 0-dim view",
                                                    "W.data = a lazily negated view",
                                                    "as complex, called, then its conjugate",
                                                    "its storage shrunk",
                                                    "its storage freed",
                                                    "freed, another in its place", "put back"]))
        def change_w(self, weight, how):
            W = weight.W
            if how not in ("put back", "freed, another in its place") and not _holds_its_bytes(W):
                pass  # (torch refuses to view a freed storage anew: only putting it back changes it)
            elif how == "put back":
                weight.W = self._params(backend.to_gpu(*weight.pristine_W), weight.q)
            elif how == "t_()" and W.dim() <= 2:
                W.t_()
            elif how == "unsqueeze_(0)":
                W.unsqueeze_(0)
            elif how == "W.data = a (1, n) view":
                W.data = W.data.reshape(-1).view(1, -1)
            elif how == "W.data = a stride-0 view":
                W.data = W.data.as_strided(W.shape, (0,) * W.dim())
            elif how == "W.data = a 0-dim view":
                W.data = W.data.reshape(-1)[0]
            elif how == "W.data = a lazily negated view":
                W.data = torch._neg_view(W.data)
            elif how == "as complex, called, then its conjugate":  # (a lazy view of the bytes called)
                if W.is_contiguous() and W.nbytes % 8 == 0 and W.dim() > 0:
                    W.data = W.data.reshape(-1).view(torch.uint8).view(torch.complex64).view(-1, 1)
                    self._observe(weight)
                    W.data = W.data.conj()
            elif how == "its storage shrunk":
                _shrunk(W)
            elif how == "its storage freed":
                if _holds_its_bytes(W):  # (a copy's: the views of W taken earlier keep theirs)
                    W.data = W.data.clone()
                    W.untyped_storage().resize_(0)
            else:  # freed first, so that the new bytes may well land where the old ones were
                shape, dtype, gpu = W.shape, W.dtype, backend.gpu_of(W)
                weight.W = None
                del W
                fresh = torch.randint(0, 256, (torch.Size(shape).numel() * dtype.itemsize,), dtype=torch.uint8)
                weight.W = self._params(backend.to_gpu(fresh.view(dtype).view(shape), gpu), weight.q)
            self._observe(weight)

        def _params(self, data, q):
            return bnb.nn.Params4bit(data=data, requires_grad=False, quant_state=q, bnb_quantized=True)

        # ------------------------------------------------------------------ the environment
        @precondition(lambda self: backend.gpus > 1)
        @rule(gpu=st.integers(0, 1))
        def switch_the_current_gpu(self, gpu):
            backend.set_current_gpu(gpu)
            self._observe()

        @rule(state=st.sampled_from(["launch enter hook", "launch exit hook", "launch enter hook reading as False",
                                     "debug", "instrumentation", "stages inspection hook", "compile hook",
                                     "pre-run hook", "the kernel's own debug flag"]))
        def toggle_triton_state(self, state):
            if state in self.triton_state:
                self._clear(state)
            else:
                for other in EXCLUSIVE.get(state, ()):  # (one enter hook at a time: each replaces the other)
                    if other in self.triton_state:
                        self._clear(other)
                self._set(state)
            self._observe()

        def _set(self, state):
            if state == "launch enter hook reading as False":
                owner, which = self._hook(state)
                self.replaced_hooks[state] = getattr(owner, which)
                setattr(owner, which, _FalsyHook())
            elif state == "stages inspection hook":
                if not hasattr(runtime, "add_stages_inspection_hook"):  # (3.7+)
                    return
                runtime.add_stages_inspection_hook = _stages_hook
            elif state == "compile hook":  # (3.4+ a knob; 3.2, 3.3 the JITFunction class's)
                setattr(*_compile_hook_owner(runtime, jit), _counting_hook)
            elif state.startswith("launch"):
                owner, which = self._hook(state)
                current = getattr(owner, which)
                if hasattr(current, "add"):  # Triton 3.5+: a HookChain
                    current.add(_counting_hook)
                else:
                    setattr(owner, which, _counting_hook)
            elif state == "debug" and kernel.TRITON_VERSION < (3, 4):
                os.environ["TRITON_DEBUG"] = "1"
            elif state == "debug":
                runtime.debug = True
            elif state == "instrumentation":
                if not hasattr(getattr(knobs, "compilation", None), "instrumentation_mode"):
                    return
                knobs.compilation.instrumentation_mode = "nf4-fuzz"  # (compiles as plain, another key)
            elif state == "pre-run hook":
                jit.pre_run_hooks.append(_counting_hook)
            else:
                jit.debug = True
            self.triton_state.add(state)

        def _clear(self, state):
            if state == "launch enter hook reading as False":
                owner, which = self._hook(state)
                setattr(owner, which, self.replaced_hooks.pop(state))
            elif state == "stages inspection hook":
                runtime.add_stages_inspection_hook = None
            elif state == "compile hook":
                setattr(*_compile_hook_owner(runtime, jit), None)
            elif state.startswith("launch"):
                owner, which = self._hook(state)
                current = getattr(owner, which)
                if hasattr(current, "remove"):
                    current.remove(_counting_hook)
                else:
                    setattr(owner, which, None)
            elif state == "debug" and kernel.TRITON_VERSION < (3, 4):
                os.environ.pop("TRITON_DEBUG", None)
            elif state == "debug":
                runtime.debug = False
            elif state == "instrumentation":
                knobs.compilation.instrumentation_mode = ""
            elif state == "pre-run hook":
                jit.pre_run_hooks.remove(_counting_hook)
            else:
                jit.debug = None
            self.triton_state.discard(state)

        def _hook(self, state):
            owner = runtime if runtime is not None else triton.compiler.CompiledKernel
            return owner, "launch_enter_hook" if "enter" in state else "launch_exit_hook"

        @rule(override=st.booleans())
        def set_config_override(self, override):
            kernel.CONFIG_OVERRIDE = kernel.DEFAULT_CONFIG._replace(num_warps=8) if override else None
            self._observe()

        @rule(num_warps=st.sampled_from([2, None]))
        def change_a_launch_configs_entry_in_place(self, num_warps):
            held = launch_configs.get(capability, kernel.DEFAULT_CONFIG)
            kernel.LAUNCH_CONFIGS[capability] = held if num_warps is None else held._replace(num_warps=num_warps)
            self._observe()

        @rule(kept=st.sampled_from([0, 1, 2, plans_kept]))
        def keep_at_most(self, kept):
            kernel.PLANS_KEPT = kept
            self._observe()

        @rule(override_again=st.booleans(), blocksizes=st.sampled_from(["as they were", "without 4096"]))
        def run_the_wrapper_cell_again(self, override_again, blocksizes):
            # as a notebook's user does: the wrapper's globals anew (or its blocksize check edited), then (or not) their
            # own CONFIG_OVERRIDE set again, the same object: a plan made by the cell before must not answer a
            # weight its checks now refuse (an edited cell; with 4096 dropped, CONFIG_OVERRIDE is always set again)
            edited = blocksizes == "without 4096"
            if edited and kernel.CONFIG_OVERRIDE is None:
                self.set_config_override(True)
            held = kernel.CONFIG_OVERRIDE
            self._run_the_wrapper_cell(WRAPPER_CELL_WITHOUT_4096 if edited else WRAPPER_CELL_CODE)
            self.wrapper_edited = edited
            if override_again or edited:
                kernel.CONFIG_OVERRIDE = held
            self._observe()

        @rule(assigned=st.sampled_from(["as they were", "without 4096", "as a list", "4096 removed in place",
                                        "holding a list"]))
        def assign_blocksizes(self, assigned):
            # as a notebook's user does from another cell, the wrapper cell not run again: validation took its
            # BLOCKSIZES as the cell ran, so no call's outcome may change, plans' included (a list changed in
            # place, a list in it)
            if assigned == "as they were":
                kernel.BLOCKSIZES = blocksizes
            elif assigned == "without 4096":
                kernel.BLOCKSIZES = tuple(size for size in blocksizes if size != 4096)
            elif assigned == "as a list":
                kernel.BLOCKSIZES = list(blocksizes)
            elif assigned == "holding a list":
                kernel.BLOCKSIZES = (*blocksizes, [8192])
            elif isinstance(kernel.BLOCKSIZES, list) and 4096 in kernel.BLOCKSIZES:  # removed in place
                kernel.BLOCKSIZES.remove(4096)
            self._observe()

        def _run_the_wrapper_cell(self, code):
            nonlocal validations
            exec(code, vars(kernel))
            validations = _Counted(kernel.validate)  # (counted anew: a plan holds the validate it was made by)
            kernel.validate = validations
            backend.watch_tables()
            if BACKEND == "stand-in":
                kernel.device_capability = lambda device: (7, 5)

        @rule(weight=weights)
        def two_first_calls_race_for_the_table(self, weight):
            # two threads' first calls with no table kept, on the weight and on a copy of its quant state (one
            # table for both: the same quant type and GPU): each makes its table (a GPU releases the GIL while it
            # does), and the second thread's is done after the first thread's call has returned
            if weight.W is None or not _holds_its_bytes(weight.W):
                return
            first, second = weight, self._with_own_tensors(weight)
            accepted = all(fresh_validation(kernel, each.W, each.q)[1] is None for each in (first, second))
            self.forget_the_kept_tables()
            if not accepted:
                return  # (a refused state makes no table: there is no race)
            for weight in (first, second):
                self._drop_the_plan(weight.W, weight.q)
            both_making, first_returned = threading.Barrier(2, timeout=5), threading.Event()
            codebooks = kernel._CODEBOOKS

            class Racing(dict):
                """The codebooks, each thread's read of one a table of its own (as two copies to a GPU are)."""
                def __getitem__(self, quant_type):
                    both_making.wait()
                    table = backend.watch_table(codebooks[quant_type].clone())
                    if threading.current_thread().name == "second":
                        first_returned.wait(timeout=2)
                    return table

            errors = []

            def work(weight):
                try:
                    kernel.dequantize_nf4(weight.W, weight.q)
                except Exception as error:
                    errors.append(error)
                finally:
                    if threading.current_thread().name == "first":
                        first_returned.set()

            threads = [threading.Thread(target=work, name=name, args=(weight,))
                       for name, weight in (("first", first), ("second", second))]
            kernel._CODEBOOKS = Racing(codebooks)
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            finally:
                kernel._CODEBOOKS = codebooks
            for error in errors:
                if not str(error).startswith(NAMED):
                    raise Finding(f"a racing first call raised {type(error).__name__}: {error}") from error
            self._observe(first, second)

        @rule()
        def forget_the_kept_tables(self):
            # a fresh process's state: the kept tables dropped (freed, unless something else holds one: a plan must),
            # and the next call of each quant type keeps a new one
            kernel._TABLES.clear()

        # ------------------------------------------------------------------ fields read in other ways
        @rule(weight=weights, field=st.sampled_from(TENSOR_FIELDS))
        def a_field_made_anew_on_each_read(self, weight, field):
            # a property that makes a new tensor at each read (a copy, a cache rebuilt): a call may launch only on
            # tensors alive at its launch, and three calls give a plan its chance
            owner, name = _owner(weight.q, field)
            held = getattr(owner, name, None) if owner is not None else None
            if weight.W is not None and isinstance(held, torch.Tensor) and _holds_its_bytes(held):
                with _read_anew(owner, name, backend.made_anew):
                    for _ in range(3):
                        self._observe(weight)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(TENSOR_FIELDS), subclass=st.sampled_from(sorted(SUBCLASSES)))
        def a_field_of_a_tensor_subclass(self, weight, field, subclass):
            # its __torch_function__ runs on Python's reads of it, but the kernel reads its bytes: the reference reads
            # it as a plain tensor (_as_plain); two calls give a plan its chance, then the field is put back
            held = _get(weight.q, field)
            if weight.W is not None and type(held) is torch.Tensor and _holds_its_bytes(held):
                _set(weight.q, field, SUBCLASSES[subclass](held))
                self._observe(weight)
                self._observe(weight)
                _set(weight.q, field, held)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(TENSOR_FIELDS))
        def a_field_set_to_the_tensor_class(self, weight, field):
            # torch.Tensor itself, not a tensor: its methods are unbound, and reading one raises TypeError
            _set(weight.q, field, torch.Tensor)
            self._observe(weight)

        @rule(weight=weights, field=st.sampled_from(("W",) + TENSOR_FIELDS))
        def a_tensor_without_memory(self, weight, field):
            # a zero tensor of its size (torch._efficientzerotensor: data_ptr() 0, as a fake tensor's), put in the field
            # or in W's .data: the kernel would read address 0
            held = weight.W if field == "W" else _get(weight.q, field)
            if isinstance(held, torch.Tensor) and _holds_its_bytes(held):
                zeros = torch._efficientzerotensor(held.shape, dtype=held.dtype, device=held.device)
                if field == "W":
                    held.data = zeros
                else:
                    _set(weight.q, field, zeros)
            self._observe(weight)

        @rule(weight=weights, default=st.sampled_from([torch.bfloat16, torch.float16, torch.float64]),
              cell_run_under_it=st.booleans())
        def calls_under_another_default_dtype(self, weight, default, cell_run_under_it):
            # model code often sets torch's default dtype to bfloat16, and bitsandbytes' get_4bit_type makes its
            # table in it. Under it: the wrapper cell, run, decodes its codebooks; a traced first call (no table
            # kept) decodes its own table; an eager first call copies the cell's. Each answers as bitsandbytes does
            # (on a GPU, bit for bit), and every table made or kept is fp32; the call after them, checked as every
            # call is, launches the kept one
            if weight.W is None:
                return
            accepted = fresh_validation(kernel, weight.W, weight.q)[1] is None
            self.forget_the_kept_tables()
            Stats.calls += 2
            made_before = len(backend.tables)
            torch.set_default_dtype(default)
            try:
                if cell_run_under_it:
                    self._run_the_wrapper_cell(WRAPPER_CELL_CODE)
                with FlopCounterMode(display=False):
                    traced, _ = backend.call(weight.W, weight.q)
                ours, _ = backend.call(weight.W, weight.q)
            finally:
                torch.set_default_dtype(torch.float32)
            for result in (traced, ours):
                if isinstance(result, Exception) and (accepted or not str(result).startswith(NAMED)):
                    raise Finding(f"a call under torch's default dtype {default} raised {result!r}")
            made = [reference() for reference in backend.tables[made_before:]]
            rounded = [table.dtype for table in [*made, *kernel._TABLES.values(), *kernel._CODEBOOKS.values()]
                       if table is not None and table.dtype != torch.float32]
            if rounded:
                raise Finding(f"under torch's default dtype {default} the cells made tables of {rounded}")
            if BACKEND == "gpu" and accepted:
                reference = bits(bnbf.dequantize_4bit(weight.W, _as_plain(weight.q)))
                if not all(torch.equal(bits(result), reference) for result in (traced, ours)):
                    raise Finding(f"a call under torch's default dtype {default} is not bitsandbytes' bits")
            self._observe(weight)

        @rule(weight=weights, patched=st.sampled_from(["empty", "empty_strided"]), its_first_call=st.booleans())
        def a_call_while_torch_makes_meta_tensors(self, weight, patched, its_first_call):
            # accelerate's init_empty_weights(include_buffers=True) before 0.22, and helpers copied from it, replace
            # torch.empty (zeros, ones, full) with one making meta tensors whatever device it is given; a tracker may
            # wrap torch.empty_strided so. A call then gives bitsandbytes' bits on W's device, and a plan made then
            # keeps no patched function: the calls after it, the patch gone, are checked as every call is
            if weight.W is None:
                return
            if its_first_call:
                kernel._plans.clear()
            make = getattr(torch, patched)

            def make_on_meta(*args, **kwargs):
                return make(*args, **{**kwargs, "device": "meta"})
            setattr(torch, patched, make_on_meta)
            try:
                ours, launches, _ = self._call(weight.W, weight.q)
            finally:
                setattr(torch, patched, make)
            q = _as_plain(weight.q)
            validated, refusal = fresh_validation(kernel, weight.W, q)
            self._judge(weight.W, q, ours, launches, validated, refusal)
            self._observe(weight)

        @rule(weight=weights, first_call=st.booleans())
        def call_under_a_fake_tensor_mode(self, weight, first_call):
            # as shape propagation calls it: W read under the mode is fake (or, a Parameter on a GPU, not read: torch's
            # own error), so the call must launch nothing, raise, and leave nothing a later call reads (a table made
            # under it would be fake)
            if weight.W is None or _a_value_held_as_a_tensor(weight.q):
                return
            if first_call:
                self.forget_the_kept_tables()
            Stats.calls += 1
            with FakeTensorMode(allow_non_fake_inputs=True):
                ours, launches = backend.call(weight.W, weight.q)
            if launches or not isinstance(ours, Exception):
                raise Finding(f"a call under a FakeTensorMode answered {ours!r}, with {len(launches)} launches")
            self._observe(weight)

        @rule(weight=weights, mode=st.sampled_from(["FlopCounterMode", "make_fx"]))
        def call_under_a_dispatch_mode(self, weight, mode):
            # a mode that sees every op: counting FLOPs, the call gives the same bits; tracing a graph (make_fx, real
            # tensors), the graph must hold the kernel, as bitsandbytes' holds its op
            if weight.W is None or _a_value_held_as_a_tensor(weight.q):
                return
            if mode == "FlopCounterMode":
                with FlopCounterMode(display=False):
                    self._checked_call(weight.W, weight.q)
            elif fresh_validation(kernel, weight.W, weight.q)[1] is None:
                Stats.calls += 1
                graph = make_fx(functools.partial(kernel.dequantize_nf4, quant_state=weight.q))(weight.W)
                called = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
                if "nf4_triton.dequantize_4bit.default" not in called:
                    raise Finding(f"a graph make_fx traced holds no kernel: {sorted(called)}")
            self._observe(weight)

        @rule(weight=weights, transform=st.sampled_from(["grad", "vmap", "vmap of grad"]))
        def call_under_a_torch_func_transform(self, weight, transform):
            # torch.func wraps what a call reads or makes in tensors without storage of their own: the call answers
            # as bitsandbytes' does under the same transform, or refuses as a fresh validation does (on the
            # stand-in, where no kernel runs, the answers are compared by shape)
            if weight.W is None or _a_value_held_as_a_tensor(weight.q):
                return
            refusal = fresh_validation(kernel, weight.W, weight.q)[1]
            Stats.calls += 1
            try:
                ours = _under_torch_func(transform, kernel.dequantize_nf4, weight.W, weight.q)
            except Exception as error:
                if refusal is None or (type(error), str(error)) != (type(refusal), str(refusal)):
                    raise Finding(f"under torch.func's {transform} ours raised {error!r}; a fresh validation: "
                                  f"{refusal!r}") from error
                return
            if refusal is not None:
                raise Finding(f"under torch.func's {transform} ours answered what a fresh validation refuses: {refusal}")
            theirs = _under_torch_func(transform, bnbf.dequantize_4bit, weight.W, _as_plain(weight.q))
            if ours.shape != theirs.shape or (BACKEND == "gpu" and not torch.equal(bits(ours), bits(theirs))):
                raise Finding(f"under torch.func's {transform} ours is not bitsandbytes' ({ours.shape}, {theirs.shape})")
            self._observe(weight)

        # ------------------------------------------------------------------ CUDA graphs (a GPU)
        @precondition(lambda self: BACKEND == "gpu")
        @rule(weight=weights, as_a_first_call=st.booleans(), replayed=st.booleans(), freed_after=st.booleans())
        @_recording_errors
        def capture_a_call(self, weight, as_a_first_call, replayed, freed_after):
            # then eager calls: after a replay or before any (what the capture copied holds nothing yet),
            # and after the graph is freed and its memory reused
            W, q = weight.W, weight.q
            if as_a_first_call:  # as in a fresh process, or once its plan was dropped: no table kept, no plan
                self.forget_the_kept_tables()
                self._drop_the_plan(W, q)
            kept = dict(kernel._TABLES)
            validated, refusal = fresh_validation(kernel, W, q)
            for key in set(kernel._TABLES) - set(kept):  # (so that a first call is the captured one)
                del kernel._TABLES[key]
            if refusal is not None:
                return  # a refused state raises before any GPU work: nothing to capture
            reference = bnbf.dequantize_4bit(W, q)
            gpu = backend.gpu_of(W)  # (captured on W's GPU, whichever is current: the graph makes it current)
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device=gpu)
            torch.cuda.synchronize(gpu)
            # no collection during the capture: an earlier graph freed then (one an old exception's frames kept
            # in a cycle) would end it ("operation not permitted when stream is capturing", then every launch fails)
            gc.collect()
            gc.disable()
            try:
                with torch.cuda.graph(graph, stream=stream):
                    out = kernel.dequantize_nf4(W, q)
            finally:
                gc.enable()
            if replayed:
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize(gpu)
                Stats.calls += 1
                _same_layout(out, reference)
                if not torch.equal(out, reference):
                    raise Finding("a captured call replayed other bits than bitsandbytes'")
            self.graphs.append((graph, out))
            if freed_after:
                self.drop_graphs_and_reuse_their_memory()
            else:
                self._observe(weight)

        @precondition(lambda self: BACKEND == "gpu")
        @rule()
        @_recording_errors
        def drop_graphs_and_reuse_their_memory(self):
            self.graphs.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.garbage = [torch.full((n,), float("nan"), device=f"cuda:{gpu}") for gpu in range(backend.gpus)
                            for n in (1, 16, 256, 4096) * 8]
            self._observe()

    return LaunchPath


def _a_value_held_as_a_tensor(q):
    """Whether a field bitsandbytes holds as a value (nested, shape...) holds a tensor: under a tracing mode, reading
    it is data-dependent, for bitsandbytes too (torch's error, not a refusal of ours)."""
    for name in OTHER_FIELDS:
        value = _get(q, name)
        if isinstance(value, torch.Tensor):
            return True
        if isinstance(value, (tuple, list)) and any(isinstance(inner, torch.Tensor) for inner in value):
            return True
    return False


def _recording_errors(function):
    """function, recording each exception other than a Finding that it raises: a launch on freed memory can first
    show as the GPU's error in the fuzzer's own comparison or graph work, and hypothesis' replays of a fault that
    depends on the GPU's memory may not raise it again."""
    @functools.wraps(function)
    def recorded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Finding:
            raise
        except Exception as error:
            Stats.errors.append(f"{type(error).__name__}: {error}")
            raise
    return recorded


class _Counted:
    """A function that counts its calls (thread-local counts are not needed: one call at a time)."""

    def __init__(self, function):
        self.function, self.count = function, 0

    def __call__(self, *args, **kwargs):
        self.count += 1
        return self.function(*args, **kwargs)


def _under_torch_func(transform, dequantize, W, q):
    """What torch.func's transform makes of x * dequantize(W, q), as a plain tensor: vmap over two values of x, grad
    (its sum's, in fp32) at x = 1, or vmap of that grad."""
    def scaled_sum(x):
        return (x * dequantize(W, q).float()).sum()
    x = torch.ones((), device=W.device if isinstance(W, torch.Tensor) else None)
    if transform == "grad":
        return torch.func.grad(scaled_sum)(x)
    if transform == "vmap of grad":
        return torch.func.vmap(torch.func.grad(scaled_sum))(torch.stack([x, x]))
    return torch.func.vmap(lambda each: each * dequantize(W, q))(torch.stack([x, x]))


def fresh_validation(kernel, W, q):
    """What a fresh call's validation says of W and q: (its Nf4Layout, None) or (None, the error)."""
    try:
        return kernel.validate(W, q), None
    except (TypeError, ValueError) as error:
        return None, error


def _counting_hook(*args, **kwargs):
    _counting_hook.calls += 1


_counting_hook.calls = 0


class _FalsyHook(list):
    """A launch hook that reads as False (an empty list): Triton calls any hook that is not None."""

    def __call__(self, *args, **kwargs):
        _counting_hook.calls += 1


def _stages_hook(*args):
    """Triton 3.7+'s add_stages_inspection_hook: called bare at each launch (a key and hash it compiles by),
    and with the compiler's stages while it compiles (left as they are)."""
    _counting_hook.calls += 1
    return ("nf4-fuzz", "nf4-fuzz") if not args else None


def _compile_hook_owner(runtime, jit):
    """Where this Triton keeps the hook it calls before compiling: (owner, name)."""
    if runtime is not None and hasattr(runtime, "jit_cache_hook"):
        return runtime, "jit_cache_hook"
    return type(jit), "cache_hook"


def _flicker_value(steady, name):
    """The other value a field reads once: a tensor's copy holding other values (another address), the other
    quant type, another output dtype."""
    if isinstance(steady, torch.Tensor):
        return _other_values(steady)
    if name == "quant_type":
        return "fp4" if steady == "nf4" else "nf4"
    return torch.float16 if steady != torch.float16 else torch.bfloat16


def _as_it_is():
    """The state as it is, for _judge_either: nothing to put back."""
    return lambda: None


def _put(owner, name, value):
    """A state for _judge_either: owner.name set to value; it returns what sets it back."""
    def enter():
        held = getattr(owner, name)
        setattr(owner, name, value)
        return lambda: setattr(owner, name, held)
    return enter


class _Swap:
    """A tensor swapped once and back (`t.data = ...`, or W.t_() twice): there() and back() each act once."""

    def __init__(self, there, back):
        self._there, self._back, self.swapped = there, back, False

    def there(self):
        if not self.swapped:
            self._there()
            self.swapped = True

    def back(self):
        if self.swapped:
            self._back()
            self.swapped = False

    def entered(self):
        """The swapped state, as a state for _judge_either."""
        self.there()
        return self.back


def _swap_and_back(weight, field):
    """A _Swap of W (t_()) or of a quant-state tensor (its data for other values), or None where there is none."""
    if field == "W":
        W = weight.W
        return _Swap(W.t_, W.t_) if W.dim() == 2 else None
    tensor = _get(weight.q, field)
    if not isinstance(tensor, torch.Tensor) or not _holds_its_bytes(tensor):
        return None
    held, other = tensor.data, _other_values(tensor)

    def there():
        tensor.data = other

    def back():
        tensor.data = held
    return _Swap(there, back)


@contextlib.contextmanager
def _read_as(owner, name, get):
    """owner.name read as get(its own value) at every read: a property of a subclass owner takes on meanwhile (setting
    it sets its own value)."""
    cls = owner.__class__

    def read(instance):
        return get(instance.__dict__[name])

    def put(instance, value):
        instance.__dict__[name] = value

    owner.__class__ = type(cls.__name__, (cls,), {name: property(read, put)})
    try:
        yield
    finally:
        owner.__class__ = cls


def _reading_once(owner, name, other, read):
    """owner.name reads `other` on its `read`-th read, its own value on every other."""
    reads = [0]

    def get(value):
        reads[0] += 1
        return other if reads[0] == read else value
    return _read_as(owner, name, get)


def _read_anew(owner, name, watch):
    """owner.name read as a new copy of its tensor at every read; watch(copy) is told of each."""
    def get(value):
        copied = value.clone()
        watch(copied)
        return copied
    return _read_as(owner, name, get)


def _failures(error):
    """Each failure hypothesis found (several come as an ExceptionGroup): its type, message and shortest steps."""
    if isinstance(error, BaseExceptionGroup):
        return [line for inner in error.exceptions for line in _failures(inner)]
    return ["".join(traceback.format_exception_only(type(error), error)).strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["stand-in", "gpu"], default="stand-in")
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--fixed-seed", action="store_true", help="the same examples every run")
    parser.add_argument("--no-shrink", action="store_true", help="report the first failure as found, unshortened")
    args = parser.parse_args(argv)
    if args.backend == "gpu":
        backend = Gpu(args.gpus or torch.cuda.device_count())
    else:
        backend = StandIn()
    machine = make_machine(backend)
    started = time.time()
    failure = None
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=args.examples, stateful_step_count=args.steps, deadline=None, database=None,
            derandomize=args.fixed_seed, suppress_health_check=list(HealthCheck), print_blob=True,
            phases=[phase for phase in Phase if not (args.no_shrink and phase == Phase.shrink)]))
    except BaseException as error:  # each failure carries its shortest steps as notes
        failure = "\n".join(_failures(error))
        print("".join(traceback.format_exception(error)), file=sys.stderr)
    print(json.dumps({"backend": args.backend, "gpus": backend.gpus, "triton": triton.__version__,
                      "fixed_seed": args.fixed_seed, "examples": Stats.examples, "calls": Stats.calls,
                      "outcomes": Stats.outcomes, "seconds": round(time.time() - started, 1),
                      "failure": failure, "first_finding": Stats.findings[0] if Stats.findings else None,
                      "first_error": Stats.errors[0] if Stats.errors else None}))


if __name__ == "__main__":
    main()

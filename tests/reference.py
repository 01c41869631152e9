"""bitsandbytes' own dequantization, the reference every test compares with torch.equal."""
import copy

import torch
import bitsandbytes.functional as bnbf


def flat_dequantize_4bit(W, quant_state):
    """bitsandbytes' generic implementation (backends/default): blocks of `blocksize` over the
    flattened weight, as its CUDA kernel does. Its CPU kernel instead walks the weight row by
    row and disagrees with both when a row is not a whole number of blocks (seen with 0.50.2)."""
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    compute = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)
    qs = quant_state
    absmax = qs.absmax
    if qs.nested:
        absmax = bnbf.dequantize_blockwise(qs.absmax, qs.state2)
        absmax += qs.offset  # in place, as dequantize_4bit: the sum stays fp32
    code = bnbf.get_4bit_type(qs.quant_type, W.device)  # (as bitsandbytes: never qs.code)
    out = compute(W.view(torch.uint8).reshape(-1), absmax, code, qs.blocksize, qs.shape, qs.dtype)
    return out.t() if W.shape[0] == 1 else out  # as dequantize_4bit returns a (1, n) packed weight


def references(W, quant_state):
    """Every bitsandbytes result that applies: dequantize_4bit, and on the CPU the flat
    generic implementation (dequantize_4bit's CPU kernel only where rows are whole blocks)."""
    refs = {}
    shape = quant_state.shape
    if W.is_cuda or shape[-1] % quant_state.blocksize == 0:
        refs["dequantize_4bit"] = bnbf.dequantize_4bit(W, quant_state)
    if not W.is_cuda:
        refs["flat"] = flat_dequantize_4bit(W, quant_state)
    return refs


def bits(t):
    """A tensor's bits as integers of its width: equal bits compare equal, NaNs included."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(out, ref, what=""):
    """Bit for bit the same tensor: shape, strides, dtype and every bit (NaN payloads too)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, (what, out.dtype, ref.dtype, out.shape, ref.shape)
    assert out.stride() == ref.stride(), (what, out.stride(), ref.stride())
    differ = (bits(out) != bits(ref)).sum().item()
    assert differ == 0, f"{what}: {differ} of {ref.numel()} values differ"


def changed_value(value):
    """Another value of a QuantState field's kind, what a plan must see: another output or state2 dtype, blocksize,
    quant type or shape; a state2 whose absmax is another tensor; a tensor with equal values at another address.
    None for None (a plain layout's offset and state2) and bools."""
    if isinstance(value, torch.dtype):
        return torch.float32 if value != torch.float32 else torch.float16
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value * 2
    if isinstance(value, str):
        return {"nf4": "fp4", "fp4": "nf4"}[value]
    if isinstance(value, torch.Size):
        return torch.Size([value[0] * 2, *value[1:]])
    if type(value).__name__ == "QuantState":
        other = copy.copy(value)
        other.absmax = value.absmax.clone()
        return other
    return value.clone()

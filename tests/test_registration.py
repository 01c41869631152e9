"""The torch.compile op: registered, and exact eagerly on the CPU; traced and compiled on a GPU."""
import pytest
import torch
import bitsandbytes.functional as bnbf

import helpers
from conftest import DEVICE
from reference import references


def test_op_is_registered(kernel):
    op = torch.ops.nf4_triton.dequantize_4bit
    assert "nf4_triton::dequantize_4bit" in str(op.default._schema)


def test_op_matches_bitsandbytes(kernel):
    layer = helpers.make_layer(48, 256, torch.bfloat16, device=DEVICE)
    W, qs = layer.weight, layer.weight.quant_state
    out = torch.ops.nf4_triton.dequantize_4bit(
        W.view(torch.uint8), qs.absmax, qs.state2.absmax, qs.state2.code, qs.offset, qs.code,
        list(qs.shape), qs.blocksize, qs.state2.blocksize, qs.dtype)
    assert all(torch.equal(out, ref) for ref in references(W, qs).values())


def test_traced_path_matches(kernel, monkeypatch):
    # what dequantize_nf4 does while torch.compile traces it: the op, on the same layout
    layer = helpers.make_layer(48, 256, torch.float16, device=DEVICE)
    W, qs = layer.weight, layer.weight.quant_state
    monkeypatch.setattr(kernel, "_is_compiling", lambda: True)
    monkeypatch.setattr(kernel, "FAST_LAUNCH", False)
    out = kernel.dequantize_nf4(W, qs)
    assert all(torch.equal(out, ref) for ref in references(W, qs).values())


@pytest.mark.gpu  # (torch.compile traces the triton_op on a GPU; the interpreter runs the op eagerly only)
@pytest.mark.parametrize("cache", ["table kept", "table not made yet"])
def test_eager_and_compiled_calls_decode_with_one_codebook(kernel, monkeypatch, cache):
    # bitsandbytes' dequantize_4bit never reads quant_state.code: a replaced codebook changes nothing, eager
    # or under torch.compile (traced before the table is kept too); the other quant type's table does
    torch._dynamo.reset()
    if cache == "table not made yet":
        monkeypatch.setattr(kernel, "_TABLES", {})
    layer = helpers.make_layer(48, 256, torch.bfloat16, device=DEVICE, seed=3)
    W, qs = layer.weight, layer.weight.quant_state
    plain = kernel.dequantize_nf4(W, qs) if cache == "table kept" else None
    qs.code = qs.code.flip(0)
    compiled = torch.compile(kernel.dequantize_nf4, fullgraph=True)
    traced, eager = compiled(W, qs), kernel.dequantize_nf4(W, qs)
    assert torch.equal(traced, eager)
    assert torch.equal(eager, bnbf.dequantize_4bit(W, qs))  # (the flat reference reads quant_state.code)
    if plain is not None:
        assert torch.equal(eager, plain)

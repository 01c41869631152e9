"""Bad input: an error that names the problem, never a silently wrong tensor."""
import copy
import os

import pytest
import torch

import helpers
from conftest import DEVICE


@pytest.fixture
def layer():
    return helpers.make_layer(64, 256, torch.bfloat16, device=DEVICE)


def _state(layer):
    qs = copy.copy(layer.weight.quant_state)
    qs.__dict__.pop("_triton_dequantize_plan", None)
    return qs


def test_missing_quant_state(kernel, layer):
    with pytest.raises(ValueError, match="quant_state is None"):
        kernel.dequantize_nf4(layer.weight, None)


def test_missing_field(kernel, layer):
    qs = _state(layer)
    qs.absmax = None
    with pytest.raises(ValueError, match=r"quant_state\.absmax is missing"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_unsupported_output_dtype(kernel, layer):
    qs = _state(layer)
    qs.dtype = torch.int8
    with pytest.raises(TypeError, match="output dtype torch.int8"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_mismatched_shape(kernel, layer):
    qs = _state(layer)
    qs.shape = torch.Size([64, 512])
    with pytest.raises(ValueError, match="packs into"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_non_contiguous_weight(kernel, layer):
    W = layer.weight.data.reshape(-1, 2).t()
    with pytest.raises(ValueError, match="not contiguous"):
        kernel.dequantize_nf4(W, _state(layer))


def test_empty_weight(kernel, layer):
    qs = _state(layer)
    qs.shape = torch.Size([0, 256])
    with pytest.raises(ValueError, match="empty"):
        kernel.dequantize_nf4(layer.weight.data[:0], qs)


def test_wrong_absmax_dtype(kernel, layer):
    qs = _state(layer)
    qs.absmax = qs.absmax.float()
    with pytest.raises(TypeError, match="double-quantized absmax must be uint8"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_wrong_absmax_count(kernel, layer):
    qs = _state(layer)
    qs.absmax = qs.absmax[:-1]
    with pytest.raises(ValueError, match="absmax values for"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_wrong_codebook(kernel, layer):
    qs = _state(layer)
    qs.code = qs.code.half()
    with pytest.raises(TypeError, match="codebook"):
        kernel.dequantize_nf4(layer.weight, qs)


def test_non_power_of_two_blocksize(kernel, layer):
    qs = _state(layer)
    qs.blocksize = 48
    with pytest.raises(ValueError, match="blocksize 48 is not a power of two"):
        kernel.dequantize_nf4(layer.weight, qs)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs CPU tensors")
def test_cpu_tensor_outside_the_interpreter(kernel):
    cpu_layer = helpers.make_layer(64, 256, torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="runs on CUDA"):
        kernel.triton_dequantize_nf4(cpu_layer)

"""What the T4 (sm_75) and Hopper (sm_90) will run, checked without a GPU: the kernel built by the
installed Triton's JIT for each configuration that GPU can pick, for fp16, bf16 and fp32 outputs."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def report():
    script = Path(__file__).with_name("compile_targets.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def builds(report):
    return report["builds"]


def test_every_target_and_dtype_compiled(report, builds):
    # MIN_CAPABILITY, the oldest GPU the wrapper accepts, must build too
    assert {(b["capability"], b["out"]) for b in builds} == {
        (c, o) for c in (report["min_capability"], 75, 90) for o in ("fp16", "bf16", "fp32")}


def test_output_stores_are_16_byte_vectors(builds):
    for b in builds:
        assert b["stores"], b
        assert all(".v4." in s for s in b["stores"]), (b["capability"], b["out"], b["stores"])


def test_packed_weight_loads_are_one_instruction_a_thread(builds):
    # the streamed packed bytes: each thread loads its weights_per_program / threads / 2 bytes in one
    # instruction (4 bytes: .b32, 8: .v2.b32, 16: .v4.b32), the evict-first load where hints are on
    for b in builds:
        weights_per_program, num_warps, _, evict_first = b["config"][:4]
        width = min(16, weights_per_program // (32 * num_warps) // 2)
        vector = {4: r"\.b32", 8: r"\.v2\.b32", 16: r"\.v4\.b32"}[width]
        loads = [s for s in b["loads"] if "evict_first" in s] if evict_first else b["loads"]
        assert any(re.search(vector + "$", s) for s in loads), (b["capability"], b["out"], b["config"], b["loads"])


def test_ptxas_accepts_the_code_without_spills(builds):
    for b in builds:
        assert b["cubin_bytes"] > 0
        assert b["ptxas"].rstrip().endswith("exit 0"), b["ptxas"]
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", b["ptxas"]), b["ptxas"]
        assert f"sm_{b['capability']}" in b["ptxas"]


def test_scale_uses_the_inline_ptx(builds):
    assert all(b["inline_ptx"] for b in builds)


def test_bf16_before_sm80_is_rounded_by_the_kernel(builds):
    # sm_75 has no cvt to bf16 (Triton 3.2 would emit one that ptxas refuses): the kernel rounds
    for b in builds:
        if b["capability"] < 80:
            assert not b["native_bf16_cvt"], (b["out"], b["config"])


def test_stream_hints_where_configured(builds):
    for b in builds:
        evict_first = any("evict_first" in s for s in b["stores"] + b["loads"])
        assert evict_first == bool(b["config"][3]), (b["capability"], b["config"])
        assert any("evict_last" in s for s in b["loads"]), "tables must be evict_last"


def test_no_fma_without_inline_ptx_and_int64_offsets_with_wide(report):
    # the scale is exact only with two roundings: built without inline PTX, no fma.rn.f32 may appear; and past
    # 2**31 weights (WIDE) the program id must be widened to int64 before it multiplies into offsets
    builds = report["exactness"]
    assert builds["fma_without_ptx"] == 0, builds
    assert builds["int64_extensions"]["True"] > builds["int64_extensions"]["False"], builds

"""What the T4 (sm_75) and Hopper (sm_90) will run, checked without a GPU: the kernel compiled
offline with each shipped launch configuration, for fp16, bf16 and fp32 outputs."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def report():
    script = Path(__file__).with_name("compile_targets.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_target_and_dtype_compiled(report):
    assert {(r["capability"], r["out"]) for r in report} == {
        (c, o) for c in (75, 90) for o in ("fp16", "bf16", "fp32")}


def test_output_stores_are_16_byte_vectors(report):
    for r in report:
        assert r["stores"], r
        assert all(".v4." in s for s in r["stores"]), (r["capability"], r["out"], r["stores"])


def test_packed_weight_loads_are_vectorized(report):
    for r in report:
        # the streamed packed bytes: the one global load of 8 or 16 bytes per thread
        wide = [s for s in r["loads"] if re.search(r"\.v[24]\.b32", s)]
        assert wide, (r["capability"], r["out"], r["loads"])


def test_ptxas_accepts_the_code_without_spills(report):
    for r in report:
        assert r["cubin_bytes"] > 0
        assert r["ptxas"].rstrip().endswith("exit 0"), r["ptxas"]
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", r["ptxas"]), r["ptxas"]
        assert f"sm_{r['capability']}" in r["ptxas"]


def test_scale_uses_the_inline_ptx(report):
    assert all(r["inline_ptx"] for r in report)


def test_stream_hints_where_configured(report):
    for r in report:
        evict_first = any("evict_first" in s for s in r["stores"] + r["loads"])
        assert evict_first == bool(r["config"][3]), (r["capability"], r["config"])
        assert any("evict_last" in s for s in r["loads"]), "tables must be evict_last"

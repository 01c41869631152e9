"""The static T4 analysis (tests/t4_static.py), checked on the CPU: it builds real sm_75 code,
counts it consistently, sees 16-byte stores, and its verdicts and recommendation follow from its own
numbers. Also: the committed results/t4-static/sass_mix.json is consistent with itself, covers
T4_CANDIDATES (t4_code.py) and was built from the kernel's current sm_75 code; the T4's
LAUNCH_CONFIGS entry is one of T4_CANDIDATES."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import t4_code

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "t4-static" / "sass_mix.json"


@pytest.fixture(scope="module")
def report():
    # its own process: the script replaces Triton's driver, and must not run interpreted
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "t4_static.py"), "--quick", "--json"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _dram_bytes_per_output_byte(out_size):
    # packed nibbles, one uint8 absmax code per 64 weights, one fp32 absmax2 per 256 codes, the output
    return (0.5 + 1 / 64 + 4 / (64 * 256) + out_size) / out_size


def test_builds_are_sm75_and_every_instruction_is_counted(report):
    builds = report["builds"]
    assert {b["out"] for b in builds} == {"fp16", "bf16"} and len(builds) >= 4
    for b in builds:
        assert b["target"] == 75 and b["ptx_target_sm_75"], b["config"]
        assert b["instructions_per_thread"] > 0
        assert b["unclassified_opcodes"] == [], b["unclassified_opcodes"]
        assert sum(b["by_class"].values()) == b["instructions_per_thread"]
        assert sum(b["opcodes"].values()) == b["instructions_per_thread"]
        for name in ("fp32", "int_logic", "load", "store"):
            assert b["by_class"].get(name, 0) > 0, (b["config"], b["out"], name)
        # one FMUL per weight at least: the scale is applied to every decoded nibble
        assert b["opcodes"]["FMUL"] * 32 * b["num_warps"] >= b["weights_per_program"]


def test_bf16_is_rounded_with_integer_ops_and_fp16_converted(report):
    # sm_75 has no cvt to bf16: Triton's own fp32 -> bf16 cast, which the kernel uses there, is an
    # integer round-to-nearest-even sequence with no conversion instruction at all, while fp16
    # converts each value (F2F)
    for b in report["builds"]:
        conversions = b["by_class"].get("conversion", 0)
        if b["out"] == "bf16":
            assert conversions == 0, b["opcodes"]
        else:
            assert conversions * 32 * b["num_warps"] >= b["weights_per_program"], b["opcodes"]


def test_output_stores_are_16_bytes(report):
    for b in report["builds"]:
        assert b["stores"] and all(".128" in s for s in b["stores"]), b["stores"]
        assert b["store_bytes_per_lane"] == 16
        assert b["ptx_stores"] and all(".v4." in s for s in b["ptx_stores"]), b["ptx_stores"]


def test_verdicts_follow_from_their_own_numbers(report):
    t4 = report["assumptions"]["t4"]
    rates = report["assumptions"]["pipe_rates_warp_instructions_per_clock_per_sm"]
    margin_needed = report["assumptions"]["margin_needed"]
    for b in report["builds"]:
        warps, out_size = b["num_warps"], {"fp16": 2, "bf16": 2, "fp32": 4}[b["out"]]
        cycles = b["cycles_per_program"]
        assert cycles["issue"] == pytest.approx(b["instructions_per_thread"] * warps / t4["schedulers_per_sm"])
        for pipe, count in b["pipe_warp_instructions_per_program"].items():
            assert cycles[pipe] == pytest.approx(count / rates[pipe], abs=0.05)
        assert cycles["lsu"] == pytest.approx(b["lsu_bytes_per_program"] / report["assumptions"][
            "lsu_bytes_per_clock_per_sm"], abs=0.05)
        assert b["bound_by"] == max(cycles, key=cycles.get)
        out_bytes = b["weights_per_program"] * out_size
        compute = cycles[b["bound_by"]] / (t4["sms"] * t4["boost_mhz"] * 1e6) / out_bytes * 1e12
        memory = _dram_bytes_per_output_byte(out_size) / (t4["dram_gbs"] * 1e9) * 1e12
        assert b["compute_ps_per_output_byte_boost"] == pytest.approx(compute, rel=1e-3)
        assert b["memory_ps_per_output_byte"] == pytest.approx(memory, rel=1e-3)
        assert b["margin_boost"] == pytest.approx(memory / compute, rel=2e-3)
        assert b["margin_base"] == pytest.approx(b["margin_boost"] * t4["base_mhz"] / t4["boost_mhz"], rel=2e-3)
        expected = ("memory-bound with margin" if b["margin_boost"] >= margin_needed
                    else "memory-bound, thin margin" if b["margin_boost"] >= 1 else "issue-bound")
        assert b["verdict"] == expected


def _check_recommendation(report):
    """The recommendation applies its stated eligibility rule to the report's own builds."""
    t4 = report["assumptions"]["t4"]
    margin_needed = report["assumptions"]["margin_needed"]
    rec = report["recommendation"]
    builds = {}
    for b in report["builds"]:
        builds.setdefault(str(b["config"]), []).append(b)
    for config, summary in rec["per_config"].items():
        mine = builds[config]
        ok = all(b["store_bytes_per_lane"] >= 16 and not b["local_bytes"] and not b["stack_bytes"]
                 and b["resident_warps_per_sm"] >= t4["max_warps_per_sm"] and b["margin_boost"] >= margin_needed
                 for b in mine)
        assert ok == (summary["rejected"] == []), (config, summary)
    assert rec["recommended"], "nothing recommended"
    for config in rec["recommended"]:
        assert rec["per_config"][str(config)]["rejected"] == []
    assert [r["config"] for r in rec["reasons"]] == rec["recommended"]


def test_recommendation_follows_its_rule(report):
    _check_recommendation(report)


def _committed():
    if not RESULTS.exists():
        pytest.fail(f"{RESULTS.relative_to(ROOT)} is missing: run python tests/t4_static.py")
    return json.loads(RESULTS.read_text())


def test_committed_results_are_consistent_and_cover_t4_candidates(kernel):
    committed = _committed()
    _check_recommendation(committed)
    assert {b["out"] for b in committed["builds"]} == {"fp16", "bf16"}
    built = {tuple(b["config"]) for b in committed["builds"]}
    missing = [tuple(c) for c in t4_code.t4_configs(kernel) if tuple(c) not in built]
    assert not missing, f"T4_CANDIDATES changed since the analysis: re-run python tests/t4_static.py ({missing})"
    assert [list(c) for c in t4_code.t4_configs(kernel)] == committed["recommendation"]["current"]


def test_committed_results_come_from_the_current_sm75_code(report):
    # the builds made now (--quick) and the committed ones of the same configuration must be the same
    # instructions: a change to the kernel's sm_75 code needs python tests/t4_static.py again
    committed = {(tuple(b["config"]), b["out"]): b for b in _committed()["builds"]}
    for b in report["builds"]:
        old = committed.get((tuple(b["config"]), b["out"]))
        assert old is not None, f"{b['config']} {b['out']} is not in {RESULTS.relative_to(ROOT)}"
        assert old["opcodes"] == b["opcodes"], (
            f"{b['config']} {b['out']}: the kernel's sm_75 code changed since the analysis: re-run "
            f"python tests/t4_static.py")


def test_the_t4_entry_is_a_timed_candidate(kernel):
    """LAUNCH_CONFIGS[(7, 5)] is one of T4_CANDIDATES: a configuration whose sm_75 build t4_code.py
    times and checks bit for bit, and this analysis counts."""
    entry = kernel.LAUNCH_CONFIGS.get(t4_code.T4)
    assert entry, "LAUNCH_CONFIGS has no (7, 5) entry (python t4_code.py --recommend proposes one)"
    assert entry in t4_code.t4_configs(kernel), f"{entry} is not in T4_CANDIDATES"

"""What a T4 would execute, counted instead of timed: the kernel built for sm_75 offline, its SASS
instruction mix per output byte, set against Turing's issue rates and the T4's 320 GB/s.

Nobody on this project can time a T4. What can be known without one is what the T4 will run:
Triton's own JIT builds the kernel for sm_75 over the stand-in GPU of tests/offline_gpu.py (same
specialization as on a T4), Triton's bundled nvdisasm / cuobjdump read the cubin, and every SASS
instruction is put in a class and on the pipe that executes it. The kernel has no loops, so each
warp issues each instruction once: the static count per thread is the dynamic count per warp.
From that, per candidate launch configuration and output dtype:

  compute time per output byte = max over {issue, each pipe} of instructions / rate, per SM
  memory time per output byte  = DRAM bytes moved / 320 GB/s
  margin                       = memory time / compute time  (> 1: memory-bound)

The rates, the T4's figures and where each comes from are in ASSUMPTIONS (and in the JSON). The
margin says which candidates cannot be limited by instruction issue on a T4; it cannot rank the
ones that are memory-bound (latency, DRAM scheduling and clocks decide those), which is why
benchmarks/t4_code.py times the sm_75 builds of T4_CANDIDATES (on another GPU, through the driver's
JIT). Every T4_CANDIDATES entry is built here, beside a grid of others; the recommendation at the
end keeps candidates the static evidence cannot separate, and drops the ones it can.

The kernel is built with the T4's constexprs as the kernel cells give them for capability 7.5:
the fp32 -> bf16 conversion is Triton's own, which sm_75 (no bf16 instructions) gets as an
integer round-to-nearest-even sequence.

    python tests/t4_static.py                   # the full grid (~1 min): rewrites results/t4-static/sass_mix.json
    python tests/t4_static.py --quick --json    # two candidates as one JSON line (tests/test_t4_static.py)

Runs in its own process: it replaces Triton's driver with the stand-in GPU.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import re
import subprocess
import tempfile
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's modules
import offline_gpu  # noqa: E402  (before torch and triton are used: it stands in for the GPU)
import torch  # noqa: E402
import triton  # noqa: E402

import helpers  # noqa: E402
from benchmarks import t4_code  # noqa: E402
from benchmarks.cells import load_kernel_cells  # noqa: E402

OUT_PATH = helpers.ROOT / "results" / "t4-static" / "sass_mix.json"

# The T4 (TU104, compute capability 7.5).
T4 = {
    "sms": 40,                 # NVIDIA T4 datasheet: 2,560 CUDA cores = 40 SMs x 64
    "boost_mhz": 1590,         # T4 datasheet: boost clock
    "base_mhz": 585,           # T4 datasheet: base clock (what a power-capped 70 W card can fall to)
    "dram_gbs": 320,           # T4 datasheet: 320 GB/s GDDR6 (peak; achieved is lower)
    "schedulers_per_sm": 4,    # Turing whitepaper: 4 processing blocks per SM, one warp scheduler and
                               # one dispatch unit each: 4 warp instructions issued per clock per SM
    "max_warps_per_sm": 32,    # CUDA C++ Programming Guide, technical specifications, cc 7.5
    "max_blocks_per_sm": 16,   # same table
    "registers_per_sm": 65536,  # same table
    "shared_bytes_per_sm": 65536,  # same table (64 KB at most for shared memory on 7.5)
}

# Warp instructions per clock per SM, per pipe: the CUDA C++ Programming Guide's throughput table
# ("Arithmetic Instructions", results per clock per SM, column 7.x, which covers 7.5) divided by 32.
PIPE_RATES = {
    "fma": 64 / 32,      # 32-bit fp add/mul/fma: 64; 32-bit integer multiply / multiply-add: 64
    "alu": 64 / 32,      # 32-bit integer add, shift, compare/min/max, bitwise: 64
    "fp16": 128 / 32,    # 16-bit fp add/mul/fma: 128 results (a half2 instruction gives 2 a lane)
    "xu": 16 / 32,       # "all other type conversions": 16; also reciprocal/sqrt/..., popc, clz: 16
    "shuffle": 32 / 32,  # warp shuffle: 32
}
# The guide gives no rate for loads and stores. Assumed, not measured and not from a document: the
# L1 / shared-memory data path moves 64 bytes per clock per SM (half the 128 commonly given for
# Volta's L1: the cautious side), every global, local and shared access counted at 32 lanes x its
# width (broadcasts move less: an upper bound). Where the LSU bounds a build, the margin scales
# with this number.
LSU_BYTES_PER_CLOCK = 64
# "Memory-bound with margin": memory time at least twice the compute time at the boost clock.
MARGIN = 2.0

ASSUMPTIONS = {
    "t4": T4,
    "pipe_rates_warp_instructions_per_clock_per_sm": PIPE_RATES,
    "lsu_bytes_per_clock_per_sm": LSU_BYTES_PER_CLOCK,
    "margin_needed": MARGIN,
    "sources": {
        "pipe rates": "CUDA C++ Programming Guide, 'Arithmetic Instructions', table 'Throughput of Native "
                      "Arithmetic Instructions' (results per clock per multiprocessor), column 7.x (covers 7.5)",
        "pipe assignment": "Volta/Turing SM partitions have separate FMA (FP32, IMAD) and ALU (integer, logic, "
                           "compare/select, data movement) pipes of 16 lanes, dispatched on alternate clocks "
                           "(an NVIDIA engineer on the NVIDIA developer forum, https://forums.developer.nvidia.com/"
                           "t/int-32-and-fp64-can-be-used-concurrently-in-the-volta-architecture/108729/4; Turing "
                           "keeps Volta's concurrent FP32/INT32 issue, Turing whitepaper); conversions and special "
                           "functions on the XU pipe (16 results per clock, the guide's table)",
        "issue": "NVIDIA Turing GPU Architecture whitepaper (2018): 4 processing blocks per SM, one warp scheduler "
                 "each, issuing one warp instruction per clock",
        "t4": "NVIDIA T4 datasheet: 2,560 CUDA cores (40 SMs), 1590 MHz boost, 585 MHz base, 320 GB/s GDDR6",
        "occupancy": "CUDA C++ Programming Guide, technical specifications per compute capability (7.5); "
                     "registers allocated per warp in units of 256 (CUDA occupancy calculator, 7.5)",
        "lsu": "assumed (LSU_BYTES_PER_CLOCK in tests/t4_static.py): not in the guide, not measured; where the "
               "LSU bounds a build, its margin scales with this number",
    },
    "model": "cycles per program on one SM = max(warp instructions / 4 (issue), per pipe: its warp instructions / "
             "its rate, L1/shared bytes / 64); compute time = that / (40 SMs x clock); memory time = DRAM bytes "
             "(packed, absmax codes, absmax2, output) / 320 GB/s. The kernel is straight-line (checked): static "
             "count = dynamic count per warp. Predicated-off instructions still issue, so masked tails are "
             "counted in full.",
    "verdict": "margin = memory time / compute time at the boost clock. 'memory-bound with margin' needs "
               f"margin >= {MARGIN}: the issue model ignores dependency stalls and dual-issue limits, and a "
               "power-capped T4 clocks down (at its 585 MHz base clock every margin shrinks 2.7x); "
               "'memory-bound, thin margin' is 1 to that; below 1, 'issue-bound'.",
    "latency_covered_us": "Little's law: packed bytes in flight per SM (resident programs x their packed bytes, "
                          "each thread loading its bytes first) / (320 GB/s / 40 SMs): the DRAM latency those "
                          "reads can hide while the SM streams at its share of the bandwidth",
}

# SASS opcodes (the part before the first '.') by reporting class and by executing pipe.
CLASSES = {
    "fp32": {"FADD", "FMUL", "FFMA", "FADD32I", "FMUL32I", "FFMA32I", "FMNMX", "FSET", "FSETP", "FSEL",
             "FCHK", "FSWZADD"},
    "fp16": {"HADD2", "HMUL2", "HFMA2", "HSET2", "HSETP2", "HMNMX2", "HADD2_32I", "HMUL2_32I", "HFMA2_32I"},
    "int_logic": {"IADD3", "IADD", "IADD32I", "IMAD", "IMUL", "IMAD32I", "IMUL32I", "IMADSP", "LOP3", "LOP",
                  "LOP32I", "SHF", "SHL", "SHR", "LEA", "PRMT", "SGXT", "SEL", "ISETP", "IMNMX", "IABS", "MOV",
                  "MOV32I", "BMSK", "P2R", "R2P", "PLOP3", "PSETP", "IDP", "IDP4A", "ISCADD", "XMAD",
                  "POPC", "FLO", "BREV"},
    "conversion": {"F2F", "F2I", "I2F", "I2I", "FRND", "F2FP", "I2IP"},
    "special": {"MUFU"},
    "load": {"LDG", "LDS", "LD", "LDL", "LDSM", "LDC", "ULDC", "LDGSTS"},
    "store": {"STG", "STS", "ST", "STL"},
    "atomic": {"ATOM", "ATOMS", "ATOMG", "RED"},
    "shuffle": {"SHFL"},
    "other": {"S2R", "S2UR", "CS2R", "UMOV", "UIADD3", "ULOP3", "USHF", "ULEA", "USEL", "UISETP", "UPRMT",
              "USGXT", "UFLO", "UPOPC", "UBREV", "R2UR", "UBMSK", "VOTE", "VOTEU", "BAR", "BRA", "BRX", "JMP",
              "EXIT", "RET", "CALL", "NOP", "BSSY", "BSYNC", "WARPSYNC", "MEMBAR", "DEPBAR", "YIELD", "ERRBAR",
              "CCTL", "NANOSLEEP", "MATCH", "BPT", "KILL", "PMTRIG", "B2R", "R2B"},
}
CLASS_OF = {opcode: name for name, opcodes in CLASSES.items() for opcode in opcodes}
# FP32 compare/select/min-max run on the ALU, not the FMA pipe; IMAD/IMUL on the FMA pipe.
FMA_PIPE = {"FADD", "FMUL", "FFMA", "FADD32I", "FMUL32I", "FFMA32I", "FCHK", "FSWZADD", "IMAD", "IMUL",
            "IMAD32I", "IMUL32I", "IMADSP", "IDP", "IDP4A", "XMAD"}
XU_PIPE = CLASSES["conversion"] | CLASSES["special"] | {"POPC", "FLO", "BREV"}
LSU_OPS = {"LDG", "LDS", "LD", "LDL", "LDSM", "STG", "STS", "ST", "STL", "ATOM", "ATOMS", "ATOMG", "RED",
           "LDGSTS"}  # through the L1 / shared data path (LDC and ULDC read the constant cache)

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
BRANCH_TARGET = re.compile(r"`?\(?\.L_x_(\d+)\)?`?")
LABEL = re.compile(r"^\.L_x_(\d+):", re.M)


def tool(name):
    """A binary Triton ships with its NVIDIA backend (bin/nvdisasm, bin/cuobjdump)."""
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path}: this Triton does not ship {name}")
    return str(path)


def disassemble(cubin: bytes) -> tuple[str, str]:
    """nvdisasm's SASS of the cubin, and cuobjdump's resource usage (registers, stack, shared)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([tool("nvdisasm"), "-c", str(path)], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True,
                               check=True).stdout
    return sass, usage


def access_bytes(opcode: str, modifiers: str) -> int:
    """Bytes one lane moves in a load or store: .U8/.S8 1, .U16/.S16 2, .64 8, .128 16, else 4;
    LDSM (ldmatrix) .x2/.x4 8/16."""
    mods = modifiers.split(".")
    if opcode == "LDSM":
        return {"2": 8, "4": 16}.get(mods[-1], 4)
    for mod, size in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if mod in mods:
            return size
    return 4


def instructions(sass: str) -> list[dict]:
    """The kernel's instructions in order, without the padding after its last EXIT (the self-branch
    and NOPs that fill the section). Raises if the code loops: then static counts would not be
    dynamic counts."""
    labels = {}
    found = []
    for line in sass.splitlines():
        label = LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(found)
        match = INSTRUCTION.search(line)
        if match:
            address, opcode, modifiers, operands = match.groups()
            found.append({"address": int(address, 16), "opcode": opcode, "modifiers": modifiers,
                          "operands": operands})
    last_exit = max(i for i, ins in enumerate(found) if ins["opcode"] == "EXIT")
    body = found[:last_exit + 1]
    for i, ins in enumerate(body):
        if ins["opcode"] in ("BRA", "JMP", "BRX"):
            target = BRANCH_TARGET.search(ins["operands"])
            if target is None or labels.get(target.group(1), len(found)) <= i:
                raise ValueError(f"the kernel branches backwards (a loop) at {ins['address']:#x}: "
                                 "static instruction counts would not be dynamic counts")
    return body


def resources(usage: str) -> dict:
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {"registers": int(fields["REG"]), "stack_bytes": int(fields["STACK"]),
            "local_bytes": int(fields["LOCAL"]), "static_shared_bytes": int(fields["SHARED"])}


def dram_bytes_per_weight(out_size: int, blocksize: int = 64, blocksize2: int = 256) -> float:
    """Bytes a nested NF4 dequantization moves per weight: half a packed byte, one absmax code per
    block, one fp32 absmax2 per blocksize2 blocks, and the output."""
    return 0.5 + 1 / blocksize + 4 / (blocksize * blocksize2) + out_size


def analyse(body: list[dict], config, out_size: int, shared_bytes: int, registers: int) -> dict:
    """Class counts, per-output-byte costs, the issue-bound and memory-bound times and the margin
    for one build. Everything per program (one tile of config.weights_per_program weights)."""
    warps, weights = config.num_warps, config.weights_per_program
    classes = collections.Counter(CLASS_OF.get(ins["opcode"], "unclassified") for ins in body)
    unclassified = sorted({ins["opcode"] for ins in body if ins["opcode"] not in CLASS_OF})
    pipes = collections.Counter()
    lsu_bytes = 0
    for ins in body:
        op = ins["opcode"]
        if op in FMA_PIPE:
            pipes["fma"] += 1
        elif op in XU_PIPE:
            pipes["xu"] += 1
        elif op in CLASSES["fp16"]:
            pipes["fp16"] += 1
        elif op == "SHFL":
            pipes["shuffle"] += 1
        elif CLASS_OF.get(op) in ("fp32", "int_logic"):
            pipes["alu"] += 1
        if op in LSU_OPS:
            lsu_bytes += 32 * access_bytes(op, ins["modifiers"])
    stores = [ins["opcode"] + ins["modifiers"] for ins in body if ins["opcode"] == "STG"]
    out_bytes = weights * out_size
    # cycles one SM spends on one program, by what would bound it
    cycles = {"issue": len(body) * warps / T4["schedulers_per_sm"]}
    cycles.update({pipe: count * warps / PIPE_RATES[pipe] for pipe, count in pipes.items()})
    cycles["lsu"] = lsu_bytes * warps / LSU_BYTES_PER_CLOCK
    bound = max(cycles, key=cycles.get)

    def compute_ps_per_byte(mhz):
        return cycles[bound] / (T4["sms"] * mhz * 1e6) / out_bytes * 1e12

    memory_ps_per_byte = dram_bytes_per_weight(out_size) / out_size / (T4["dram_gbs"] * 1e9) * 1e12
    # occupancy: registers are allocated per warp in units of 256
    warp_registers = math.ceil(registers * 32 / 256) * 256
    programs = min(T4["max_blocks_per_sm"], T4["max_warps_per_sm"] // warps,
                   T4["registers_per_sm"] // (warp_registers * warps),
                   T4["shared_bytes_per_sm"] // shared_bytes if shared_bytes else T4["max_blocks_per_sm"])
    packed_in_flight = programs * weights // 2  # each thread issues its packed-byte load first
    per_sm_bandwidth = T4["dram_gbs"] * 1e9 / T4["sms"]
    margin = memory_ps_per_byte / compute_ps_per_byte(T4["boost_mhz"])
    return {
        "instructions_per_thread": len(body),
        "by_class": dict(sorted(classes.items())),
        "unclassified_opcodes": unclassified,
        "thread_instructions_per_output_byte": {
            name: round(count * 32 * warps / out_bytes, 4) for name, count in sorted(classes.items())},
        "thread_instructions_per_output_byte_total": round(len(body) * 32 * warps / out_bytes, 4),
        "pipe_warp_instructions_per_program": dict(sorted((p, c * warps) for p, c in pipes.items())),
        "lsu_bytes_per_program": lsu_bytes * warps,
        "cycles_per_program": {k: round(v, 1) for k, v in cycles.items()},
        "bound_by": bound,
        "compute_ps_per_output_byte_boost": round(compute_ps_per_byte(T4["boost_mhz"]), 4),
        "compute_ps_per_output_byte_base": round(compute_ps_per_byte(T4["base_mhz"]), 4),
        "memory_ps_per_output_byte": round(memory_ps_per_byte, 4),
        "margin_boost": round(margin, 3),
        "margin_base": round(memory_ps_per_byte / compute_ps_per_byte(T4["base_mhz"]), 3),
        "verdict": verdict(margin),
        "stores": sorted(set(stores)),
        "store_bytes_per_lane": min((access_bytes("STG", s[3:]) for s in stores), default=0),
        "resident_programs_per_sm": programs,
        "resident_warps_per_sm": programs * warps,
        "packed_bytes_in_flight_per_sm": packed_in_flight,
        # Little's law: the latency these reads in flight can cover at 320 GB/s / 40 SMs
        "latency_covered_us": round(packed_in_flight / per_sm_bandwidth * 1e6, 3),
    }


def verdict(margin: float) -> str:
    if margin >= MARGIN:
        return "memory-bound with margin"
    if margin >= 1:
        return "memory-bound, thin margin"
    return "issue-bound"


def candidate_grid(kernel, quick=False):
    """LOOKUP 0/1 x weights per program 1024..8192 x warps 2/4/8, at least 8 weights a thread
    (fewer gives 8-byte stores), plus every T4_CANDIDATES entry (t4_code.py) and unsloth's T4
    shape (1024 weights, 8 warps: 4 a thread) for reference. quick: two candidates."""
    LaunchConfig = kernel.LaunchConfig
    if quick:
        return [LaunchConfig(2048, 4, 0, True), LaunchConfig(2048, 4, 1, True)]
    grid = [LaunchConfig(w, warps, lookup, True) for lookup in (0, 1) for w in (1024, 2048, 4096, 8192)
            for warps in (2, 4, 8) if w // (32 * warps) >= 8]
    extra = [c for c in (*t4_code.t4_configs(kernel),
                         *(LaunchConfig(1024, 8, lookup, True) for lookup in (0, 1))) if c not in grid]
    return grid + extra


def build(kernel, config, dtype, shape=(64, 8192)):
    """The kernel as the JIT builds it for sm_75, on a nested NF4 weight whose size is a whole
    number of tiles for every candidate (the large-weight case: no masks)."""
    import bitsandbytes.functional as bnbf
    W, qs = bnbf.quantize_4bit(torch.randn(shape, generator=torch.Generator().manual_seed(0)), blocksize=64,
                               quant_type="nf4", compress_statistics=True)
    qs.dtype = dtype
    layout = kernel.validate(W, qs)
    out = torch.empty(layout.shape, dtype=dtype)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, t4_code.T4)
    return kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)


def measure(kernel, config, dtype) -> dict:
    compiled = build(kernel, config, dtype)
    sass, usage = disassemble(compiled.asm["cubin"])
    body = instructions(sass)
    res = resources(usage)
    row = {"config": list(config), "weights_per_program": config.weights_per_program,
           "num_warps": config.num_warps, "lookup": config.lookup, "evict_first": config.evict_first,
           "weights_per_thread": config.weights_per_program // (32 * config.num_warps),
           "out": {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype],
           "target": compiled.metadata.target.arch, **res, "shared_bytes": compiled.metadata.shared,
           "ptx_target_sm_75": ".target sm_75" in compiled.asm["ptx"],
           "ptx_stores": sorted(set(re.findall(r"st\.global\S*", compiled.asm["ptx"]))),
           "opcodes": dict(sorted(collections.Counter(ins["opcode"] for ins in body).items()))}
    row.update(analyse(body, config, torch.empty(0, dtype=dtype).element_size(), compiled.metadata.shared,
                       res["registers"]))
    return row


RULE = (
    "Eligible: for fp16 and bf16 alike, 16-byte stores, no spills, a full SM (32 resident warps) and a margin "
    f"of at least {MARGIN} at the boost clock. The statics cannot rank the eligible candidates (all are "
    "memory-bound); what they leave open is the work per thread: more weights a thread means fewer "
    "instructions per byte and more DRAM latency covered by the reads in flight, while unsloth's T4 "
    "measurement found less work per thread, on 8 warps, faster for its kernel. So: for each lookup that has "
    "eligible candidates, the fewest and the most weights a thread among them, each on 8 warps where that is "
    "eligible, else the best margin. Timing the sm_75 builds (t4_code.py, T4_CANDIDATES) decides between them.")


def recommend(rows, current) -> dict:
    """RULE applied to the builds: the configurations it recommends timing, why each configuration was
    rejected, and what the rule says of the current set (T4_CANDIDATES)."""
    by_config = collections.defaultdict(list)
    for row in rows:
        by_config[tuple(row["config"])].append(row)
    summary, eligible = {}, []
    for config, builds in by_config.items():
        reasons = []
        if any(b["store_bytes_per_lane"] < 16 for b in builds):
            reasons.append("stores narrower than 16 bytes")
        if any(b["local_bytes"] or b["stack_bytes"] for b in builds):
            reasons.append("spills")
        if any(b["resident_warps_per_sm"] < T4["max_warps_per_sm"] for b in builds):
            reasons.append("fewer than 32 resident warps per SM")
        if any(b["margin_boost"] < MARGIN for b in builds):
            reasons.append(f"margin below {MARGIN} at the boost clock")
        summary[config] = {"min_margin_boost": min(b["margin_boost"] for b in builds),
                           "weights_per_thread": builds[0]["weights_per_thread"],
                           "latency_covered_us": min(b["latency_covered_us"] for b in builds),
                           "rejected": reasons}
        if not reasons:
            eligible.append(config)
    chosen, reasons = [], []
    for lookup in sorted({c[2] for c in eligible}):
        mine = [c for c in eligible if c[2] == lookup]
        levels = sorted({summary[c]["weights_per_thread"] for c in mine})
        for level, end in ((levels[0], "fewest"), (levels[-1], "most")):
            options = [c for c in mine if summary[c]["weights_per_thread"] == level]
            pick = next((c for c in options if c[1] == 8), None) or max(
                options, key=lambda c: summary[c]["min_margin_boost"])
            if pick not in chosen:
                chosen.append(pick)
                reasons.append({"config": list(pick), "why": (
                    f"LOOKUP {lookup}, the {end} weights a thread among the eligible ({level}); margin "
                    f"{summary[pick]['min_margin_boost']:.2f}, reads in flight cover "
                    f"{summary[pick]['latency_covered_us']:.2f} us of latency")})
    return {
        "rule": RULE,
        "recommended": [list(c) for c in chosen],
        "reasons": reasons,
        "current": [list(c) for c in current],
        # per current candidate: why the rule rejects it ([] if eligible; None if not built here)
        "current_rejections": [{"config": list(c), "rejected": summary[tuple(c)]["rejected"]
                                if tuple(c) in summary else None} for c in current],
        "per_config": {str(list(c)): s for c, s in summary.items()},
    }


def unsloth_reading(rows, recommendation) -> str:
    """unsloth's public T4 measurement, and what this analysis says about each part of it."""
    per_config = recommendation["per_config"]
    lookup0 = [c for c in recommendation["recommended"] if c[2] == 0]
    gather_rows = [r for r in rows if r["lookup"] == 1]
    through_shared = gather_rows and all(
        r["shared_bytes"] > 0 and r["opcodes"].get("BAR", 0) > 0
        and r["opcodes"].get("LDS", 0) >= r["weights_per_thread"] for r in gather_rows)
    theirs = [per_config.get(str([1024, 8, lookup, True, True])) for lookup in (0, 1)]
    least = min((per_config[str(c)]["weights_per_thread"] for c in recommendation["recommended"]), default=None)
    parts = [
        "unsloth 2026.10.9 (kernels/nf4.py) on a T4: with Triton >= 3.7, 512 packed bytes a program (1024 "
        "weights) on 8 warps with int32 loads and evict-first was 5-7% faster than its default (an L1 table "
        "lookup, 256-2048 bytes a program on 2-4 warps, kept on Triton 3.6); its register-table gather is used "
        "on B200 only. Against this analysis:",
        f"(a) the L1 table (LOOKUP 0) is {'in' if lookup0 else 'NOT in'} the recommended set"
        + (f" ({', '.join(str(tuple(c)) for c in lookup0)})." if lookup0 else "."),
        "(b) on sm_75, Triton " + triton.__version__ + (
            " lowers tl.gather (LOOKUP 1) through shared memory in every build here (STS and BAR.SYNC, then "
            "an LDS per weight): on a T4 it is a shared-memory table, not a register table"
            if through_shared else " does not lower every LOOKUP 1 build through shared memory (see opcodes)")
        + (f"; its margins run {min(r['margin_boost'] for r in gather_rows):.2f}-"
           f"{max(r['margin_boost'] for r in gather_rows):.2f} against "
           f"{min(r['margin_boost'] for r in rows if r['lookup'] == 0):.2f}-"
           f"{max(r['margin_boost'] for r in rows if r['lookup'] == 0):.2f} for the L1 table." if gather_rows else "."),
    ]
    if all(theirs):
        parts.append(
            "(c) their faster shape in this kernel, 1024 weights on 8 warps (4 a thread): "
            + "; ".join(f"LOOKUP {lookup}: margin {t['min_margin_boost']:.2f}, "
                        + ("eligible" if not t["rejected"] else "rejected (" + ", ".join(t["rejected"]) + ")")
                        for lookup, t in zip((0, 1), theirs))
            + ". Nearest in the recommended set (the least work a thread it keeps): "
            + ", ".join(str(tuple(c)) for c in recommendation["recommended"]
                        if per_config[str(c)]["weights_per_thread"] == least) + ".")
    parts.append("Their figure is for their kernel on Triton 3.7; Colab's T4 runtime has Triton 3.6, so it "
                 "weighs as a direction, not a number.")
    return " ".join(parts)


def print_table(rows):
    print(f"{'(weights, warps, lookup, evict, ptx)':<38} {'out':>4} {'w/thr':>5} {'regs':>4} {'smem':>5} "
          f"{'ins':>5} {'ins/B':>6} {'fp32':>5} {'int':>5} {'cvt':>5} {'ld':>5} {'st':>5} {'other':>5} "
          f"{'bound':>6} {'margin':>6} {'@base':>6} {'lat us':>6}  verdict")
    for r in rows:
        per = r["thread_instructions_per_output_byte"]
        print(f"{str(tuple(r['config'])):<38} {r['out']:>4} {r['weights_per_thread']:>5} {r['registers']:>4} "
              f"{r['shared_bytes']:>5} {r['instructions_per_thread']:>5} "
              f"{r['thread_instructions_per_output_byte_total']:>6.2f} {per.get('fp32', 0):>5.2f} "
              f"{per.get('int_logic', 0):>5.2f} {per.get('conversion', 0):>5.2f} {per.get('load', 0):>5.2f} "
              f"{per.get('store', 0):>5.2f} {per.get('other', 0) + per.get('shuffle', 0):>5.2f} "
              f"{r['bound_by']:>6} {r['margin_boost']:>6.2f} {r['margin_base']:>6.2f} "
              f"{r['latency_covered_us']:>6.2f}  {r['verdict']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two candidates, fp16 and bf16; write nothing")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line (for tests)")
    parser.add_argument("--out", type=Path, default=OUT_PATH)
    args = parser.parse_args(argv)

    offline_gpu.install(75)
    kernel = load_kernel_cells()
    rows = [measure(kernel, config, dtype) for config in candidate_grid(kernel, args.quick)
            for dtype in (torch.float16, torch.bfloat16)]
    report = {
        "what": "SASS instruction mix of the NF4 kernel built for sm_75 (T4) per candidate launch "
                "configuration, against Turing's issue rates and the T4's DRAM bandwidth",
        "environment": {**helpers.environment(vars(kernel), gpu=False),
                        "gpu": "none: built for sm_75 over tests/offline_gpu.py's stand-in GPU"},
        "method": "Triton's JIT over tests/offline_gpu.py's stand-in sm_75 GPU (the specialization a T4 gets) "
                  "builds the kernel on a 64x8192 nested NF4 weight (no masked tail); nvdisasm -c and cuobjdump "
                  "-res-usage (bundled with Triton) read the cubin; opcodes are classed and assigned to pipes "
                  "as in tests/t4_static.py",
        "assumptions": ASSUMPTIONS,
        "builds": rows,
    }
    report["recommendation"] = recommend(rows, t4_code.t4_configs(kernel))
    report["unsloth_t4_finding"] = unsloth_reading(rows, report["recommendation"])
    if args.json:
        print(json.dumps(report))
        return report
    print_table(rows)
    rec = report["recommendation"]
    print("\n" + RULE)
    print("\nrecommended for timing (t4_code.py):")
    for entry in rec["reasons"]:
        print(f"  {tuple(entry['config'])}: {entry['why']}")
    print("current T4_CANDIDATES (t4_code.py):")
    for entry in rec["current_rejections"]:
        rejected = entry["rejected"]
        print(f"  {tuple(entry['config'])}: " + ("not built in this run" if rejected is None else
                                                "eligible" if not rejected else "rejected: " + ", ".join(rejected)))
    print("\n" + report["unsloth_t4_finding"])
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print("\nwrote", args.out)
    return report


if __name__ == "__main__":
    main()

"""Synthetic results for the tooling tests: kernel_table rows and a procedure result
(helpers.procedure_result) shaped as the GPU makes them, with numbers as wide as the real ones."""
METHODS = ["ours", "unsloth_fused", "unsloth_classic", "bnb"]
SHAPES = (("8192x2048", "float16"), ("4096x1024", "bfloat16"), ("28672x8192", "bfloat16"))


OURS_US = (13.0, 4.0, 145.0)  # per shape, near the H200's
TIMES_OURS = (1.0, 1.08, 1.9, 1.92)  # per method, near the H200's: a ratio just under the 1.15x line


def kernel_rows():
    rows = []
    for i, (shape, dtype) in enumerate(SHAPES):
        out_features, in_features = map(int, shape.split("x"))
        row = {"shape": shape, "dtype": dtype, "bytes": out_features * in_features * (2.5 + 1 / 64),
               "ceiling_config": [4096, 8]}
        for j, name in enumerate([*METHODS, "ceiling"]):
            us = OURS_US[i] * TIMES_OURS[j] if name != "ceiling" else OURS_US[i] * 0.93
            row.update({f"{name}_us": us, f"{name}_p20_us": us * 0.98, f"{name}_p80_us": us * 1.02,
                        f"{name}_gbs": row["bytes"] / us / 1e3, f"{name}_kernels": 1 if j < 2 else 3,
                        f"{name}_samples": 150, f"{name}_graph_us": us + 1.0 if j != 2 else None})
        rows.append(row)
    return rows


ROUND_NOISE = (1.0, 0.97, 1.05, 0.99, 1.02)  # per round, times each method's own factor below


def procedure():
    """Per method two cases and five rounds whose times vary, so that each round's ratio differs. Each case
    carries the split as timing.add_call_split stores it: wall = issue + wait, GPU time beside (for the
    three-kernel paths above the wait: their first kernels run while the host still issues the last)."""
    result = {}
    for j, name in enumerate(METHODS):
        cases = []
        for k, (weight, dtype) in enumerate(SHAPES[:2]):
            issue = 9.0 + 9 * j + 2 * k
            wait = 20.0 + 3 * k - j
            gpu = wait - 4.0 if j < 2 else wait + 3.0
            cases.append({"case": f"case {k}", "weight": weight, "dtype": dtype, "calls": 3000,
                          "median_s": (issue + wait) * 3000 / 1e6, "procedure_us": (issue + wait) * 1.02,
                          "issue_us": issue, "wait_us": wait, "wall_us": issue + wait, "gpu_us": gpu,
                          "gpu_kernels": 1.0 if j < 2 else 3.0, "split_calls": 150, "split_rounds": 5})
        total = sum(c["median_s"] for c in cases)
        runs = [total * noise ** (1 + j) for noise in ROUND_NOISE]
        result[name] = {"median_s": sorted(runs)[2], "min_s": min(runs), "max_s": max(runs), "runs_s": runs,
                        "cases": cases}
    return result

"""What `model_patch.use_triton_dequantize(dequantize_nf4)` buys in a real model: QLoRA training
steps and prefill of a 4-bit Llama (random weights from a config, loaded through BitsAndBytesConfig:
NF4, double quantization, bf16 compute), with and without the patch, side by side in one process.
Prints the table and writes results/<gpu>/model.json.

    python -m benchmarks.model            # a small Llama and a Llama-3.2-1B-shaped one (1.24B)
    python -m benchmarks.model --quick    # the small one only, fewer repeats

Clocks: each step is timed on the wall clock with the GPU synchronized before and after (median of
interleaved repeats: bitsandbytes, ours, bitsandbytes, ...). The dequantization share comes from one
profiled step per variant: the GPU time of the dequantizing kernels (CUPTI through torch.profiler)
over the step's median wall time.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import statistics
import sys
import tempfile
import time

import torch

import helpers
import timing
import model_patch  # use_triton_dequantize, handed the kernel cells' dequantize_nf4
from benchmarks.cells import load_kernel_cells

# Random weights from a config: the shapes decide the speed, the values do not.
MODELS = {
    # ~110M parameters: many small weights, where launch costs weigh most
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
    # Llama-3.2-1B's shape (1.24B parameters)
    "1.2B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=4096),
}
TRAIN_SHAPE = (4, 1024)  # (batch, sequence) of a training step: 4096 tokens
PREFILL_SHAPES = ((1, 512), (1, 2048), (4, 2048))
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0)  # on every linear layer (model_patch.with_lora)
OURS_KERNEL = "_dequantize_4bit_kernel"
BNB_KERNEL = "kDequantizeBlockwise"  # bitsandbytes' absmax-code and 4-bit dequantize kernels
BNB_RANGE = "bitsandbytes dequantize"  # marks bitsandbytes' dequantize calls in the profiled step


def parameter_count(model) -> int:
    """The model's parameters as before quantizing: a 4-bit weight counts its quant state's shape."""
    return sum(math.prod(p.quant_state.shape) if hasattr(p, "quant_state") else p.numel()
               for p in model.parameters())


def set_checkpointing(model, on: bool):
    """Gradient checkpointing of the decoder layers (non-reentrant: the inputs need no grad)."""
    # newer transformers (5.23 here) call it activation checkpointing and warn on the old names;
    # older ones have only the old names
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def train_step(model, input_ids):
    """Forward and backward of one QLoRA step (no optimizer: it never touches a 4-bit weight)."""
    model.train()
    model.zero_grad(set_to_none=True)
    output = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    output.loss.backward()
    return output.loss.detach()


def prefill(model, input_ids):
    """The prompt pass of generation: every layer on every token, the cache filled, the last
    token's logits (as generate computes them)."""
    model.eval()
    with torch.inference_mode():
        return model(input_ids=input_ids, use_cache=True, logits_to_keep=1).logits


def interleaved_ms(variants: dict, kernel, repeats: int, warmup: int = 2) -> dict:
    """Wall time (ms) of each variant's `work()`, the patch switched as the variant says before the
    clock starts, the GPU synchronized before and after; variants alternate within each repeat."""
    times = {name: [] for name in variants}
    for round_ in range(warmup + repeats):
        for name, (patched, work) in variants.items():
            model_patch.use_triton_dequantize(kernel.dequantize_nf4, patched)
            timing.synchronize()
            start = time.perf_counter()
            work()
            timing.synchronize()
            if round_ >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    model_patch.use_triton_dequantize(enable=False)
    return times


@contextlib.contextmanager
def _marked_bitsandbytes_dequantize():
    """bitsandbytes' dequantize entry points inside a profiler range, so that the offset addition
    they launch through torch (between its two kernels) can be told apart from the rest."""
    targets = [("bitsandbytes.functional", "dequantize_4bit"),
               ("bitsandbytes.backends.cuda.ops", "_dequant_linear_fallback")]
    saved = []
    for module_name, attribute in targets:
        module = sys.modules.get(module_name)
        original = getattr(module, attribute, None)
        if original is None:
            continue

        def marked(*args, _original=original, **kwargs):
            with torch.profiler.record_function(BNB_RANGE):
                return _original(*args, **kwargs)
        saved.append((module, attribute, original))
        setattr(module, attribute, marked)
    try:
        yield
    finally:
        for module, attribute, original in saved:
            setattr(module, attribute, original)


def _inside(event, name):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def dequantize_gpu_us(work, patched: bool, kernel) -> dict:
    """GPU time (µs) of the dequantization in one profiled `work()`: our kernel's, and bitsandbytes'
    (its two kDequantizeBlockwise kernels plus the `absmax + offset` torch launches between them),
    and the GPU time of every kernel of the step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    model_patch.use_triton_dequantize(kernel.dequantize_nf4, patched)
    timing.synchronize()
    with _marked_bitsandbytes_dequantize(), \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
        timing.synchronize()
    model_patch.use_triton_dequantize(enable=False)
    events = prof.events()
    device = [e for e in events if e.device_type == DeviceType.CUDA and e.name != BNB_RANGE]
    if torch.cuda.is_available() and not device:
        raise RuntimeError("the profiler recorded no GPU activity (is CUPTI available?)")
    ours = sum(e.time_range.elapsed_us() for e in device if OURS_KERNEL in e.name)
    bnb = sum(e.time_range.elapsed_us() for e in device if BNB_KERNEL in e.name)
    offset_adds = sum(sum(k.duration for k in e.kernels) for e in events
                      if e.device_type == DeviceType.CPU and e.name in ("aten::add", "aten::add_")
                      and _inside(e, BNB_RANGE))
    return {"triton_us": ours, "bitsandbytes_us": bnb + offset_adds,
            "all_kernels_us": sum(e.time_range.elapsed_us() for e in device)}


def calls_of(work, kernel) -> dict:
    """Where one patched `work()` sends its 4-bit calls: PATCH_CALLS counted over one run.
    "matmul_4bit": every 4-bit matmul; of those, "dequantize+linear" are the ones bitsandbytes
    answers by dequantizing (the rest run its fused kernel); "dequantize_4bit": the backward's."""
    model_patch.use_triton_dequantize(kernel.dequantize_nf4)
    before = dict(model_patch.PATCH_CALLS)
    work()
    timing.synchronize()
    model_patch.use_triton_dequantize(enable=False)
    return {f"{path} -> {who}": count - before.get((path, who), 0)
            for (path, who), count in model_patch.PATCH_CALLS.items() if count != before.get((path, who), 0)}


def measure(name: str, work, kernel, repeats: int, tokens: int, same_output) -> dict:
    """One row: both variants timed interleaved, then profiled once each."""
    times = interleaved_ms({"bitsandbytes": (False, work), "triton": (True, work)}, kernel, repeats)
    bnb_ms, ours_ms = statistics.median(times["bitsandbytes"]), statistics.median(times["triton"])
    bnb_profile = dequantize_gpu_us(work, False, kernel)
    ours_profile = dequantize_gpu_us(work, True, kernel)
    bnb_dequant = bnb_profile["bitsandbytes_us"]
    ours_dequant = ours_profile["triton_us"] + ours_profile["bitsandbytes_us"]
    row = {
        "workload": name, "tokens": tokens,
        "bitsandbytes_ms": round(bnb_ms, 3), "triton_ms": round(ours_ms, 3),
        "saved_ms": round(bnb_ms - ours_ms, 3), "speedup": round(bnb_ms / ours_ms, 4),
        "bitsandbytes_ms_all": [round(t, 3) for t in times["bitsandbytes"]],
        "triton_ms_all": [round(t, 3) for t in times["triton"]],
        "dequantize_gpu_us": {"bitsandbytes": round(bnb_dequant, 1), "triton": round(ours_dequant, 1),
                              "triton_variant_left_to_bitsandbytes": round(ours_profile["bitsandbytes_us"], 1)},
        "dequantize_share": {"bitsandbytes": round(bnb_dequant / (bnb_ms * 1e3), 4),
                             "triton": round(ours_dequant / (ours_ms * 1e3), 4)},
        "all_kernels_gpu_us": {"bitsandbytes": round(bnb_profile["all_kernels_us"], 1),
                               "triton": round(ours_profile["all_kernels_us"], 1)},
        "patched_calls_per_step": calls_of(work, kernel),
        "same_output": same_output(),
    }
    return row


def same_result(work, kernel):
    """Whether `work()` returns the same bits with and without the patch (a check, not a test)."""
    def check():
        with model_patch.use_triton_dequantize(enable=False):
            reference = work()
        with model_patch.use_triton_dequantize(kernel.dequantize_nf4):
            ours = work()
        return bool(torch.equal(reference, ours))
    return check


def model_rows(name: str, kernel, repeats: int, device: str = "cuda", train_shape=TRAIN_SHAPE,
               prefill_shapes=PREFILL_SHAPES) -> tuple[dict, list[dict]]:
    """Prefill rows on the 4-bit model, then LoRA on it and the training rows."""
    shape = MODELS[name]
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as directory:
        start = time.perf_counter()
        model = model_patch.quantized_llama(shape, torch.bfloat16, device, directory, attn_implementation="sdpa")
        load_s = time.perf_counter() - start
    info = {"config": shape, "parameters": parameter_count(model), "load_s": round(load_s, 1),
            "weights_4bit": sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")}
    generator = torch.Generator().manual_seed(0)
    rows = []
    for batch, sequence in prefill_shapes:
        ids = torch.randint(0, shape["vocab_size"], (batch, sequence), generator=generator).to(device)
        work = lambda ids=ids: prefill(model, ids)
        rows.append(measure(f"prefill {batch}x{sequence}", work, kernel, repeats, batch * sequence,
                            same_result(work, kernel)))
        print_row(name, rows[-1])
    model = model_patch.with_lora(model, **LORA)
    info["lora_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    batch, sequence = train_shape
    ids = torch.randint(0, shape["vocab_size"], (batch, sequence), generator=generator).to(device)
    work = lambda: train_step(model, ids)
    for checkpointing in (False, True):
        set_checkpointing(model, checkpointing)
        label = f"QLoRA step {batch}x{sequence}" + (" + gradient checkpointing" if checkpointing else "")
        rows.append(measure(label, work, kernel, repeats, batch * sequence, same_result(work, kernel)))
        print_row(name, rows[-1])
    del model, work
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return info, rows


HEADER = (f"{'model':>6} {'workload':<44} {'bnb ms':>9} {'ours ms':>9} {'saved':>7} "
          f"{'dequant share bnb -> ours':>26} {'dequant GPU us bnb -> ours':>27} {'ours/fused':>11} {'same':>5}")


def print_row(model, r):
    d, s, calls = r["dequantize_gpu_us"], r["dequantize_share"], r["patched_calls_per_step"]
    ours = calls.get("dequantize_4bit -> triton", 0) + calls.get("dequantize+linear -> triton", 0)
    fused = calls.get("matmul_4bit -> bitsandbytes", 0) - sum(
        calls.get(f"dequantize+linear -> {who}", 0) for who in ("triton", "bitsandbytes"))
    print(f"{model:>6} {r['workload']:<44} {r['bitsandbytes_ms']:>9.2f} {r['triton_ms']:>9.2f} "
          f"{1 - r['triton_ms'] / r['bitsandbytes_ms']:>7.1%} "
          f"{s['bitsandbytes']:>12.1%} -> {s['triton']:<11.1%} {d['bitsandbytes']:>12.0f} -> {d['triton']:<12.0f} "
          f"{f'{ours}/{fused}':>11} {str(r['same_output']):>5}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small model only, 5 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per variant (default 10, quick 5)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.model times a GPU; the CPU checks are tests/test_model.py")
    repeats = args.repeats or (5 if args.quick else 10)
    kernel = load_kernel_cells()
    env = helpers.environment(vars(kernel))
    env.update({package: helpers.package_version(package) for package in ("transformers", "peft", "accelerate")})
    print(", ".join(f"{k} {env[k]}" for k in ("gpu", "driver", "torch", "triton", "bitsandbytes",
                                              "transformers", "peft", "accelerate")))
    print(HEADER)
    models, rows = {}, []
    for name in (["small"] if args.quick else list(MODELS)):
        info, model_rows_ = model_rows(name, kernel, repeats)
        models[name] = info
        rows += [{"model": name, **row} for row in model_rows_]
    path = helpers.results_dir(env) / ("model-quick.json" if args.quick else "model.json")
    method = {
        "step": "wall clock (time.perf_counter) of one call, GPU synchronized before and after; "
                f"median of {repeats} repeats, bitsandbytes and ours interleaved, after 2 warm-up rounds each",
        "dequantize_gpu_us": f"one profiled call per variant (CUPTI via torch.profiler): kernels named "
                             f"{OURS_KERNEL} (ours) or {BNB_KERNEL} (bitsandbytes), plus bitsandbytes' "
                             "absmax + offset additions (aten::add inside its dequantize calls)",
        "dequantize_share": "dequantize GPU time / median step time",
        "same_output": "prefill: last-token logits; training: loss; torch.equal with and without the patch",
        "model": "random weights from a LlamaConfig, saved and loaded with BitsAndBytesConfig (NF4, double "
                 "quantization, bf16 compute, bf16 weights); peft LoRA on all linear layers for training; "
                 "sdpa attention",
        "train": f"forward + backward (labels = inputs), batch x sequence {TRAIN_SHAPE}, no optimizer step",
        "prefill": "torch.inference_mode, use_cache=True, logits_to_keep=1, adapters not yet added"}
    print("wrote", helpers.write_results(path, env, method, models=models, rows=rows))

if __name__ == "__main__":
    main()

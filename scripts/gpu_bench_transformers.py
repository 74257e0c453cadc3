#!/usr/bin/env python3
"""Prefill and decode speed of Hugging Face transformers on a checkpoint directory, measured the way
`torchpatch bench` measures itself, so that scripts/gpu-check.sh can set the two side by side.

- Prompt: --prompt-len random token ids (seeded), batch 1, greedy decoding.
- Prefill tokens/s: one forward pass of the prompt into a fresh key/value cache, computing the
  language-model head for the last position only (what generation needs, and what torchpatch's
  prefill does); best of --repeats after a warm-up.
- Decode tokens/s: `generate` of --decode-tokens + 1 new tokens (min_new_tokens the same, so it never
  stops early) minus `generate` of 1 new token (the prefill, with generate's own overheads), for
  --decode-tokens decoding steps: torchpatch's count (its first new token comes from the prefill).
  Best of --repeats for each of the two, after a warm-up.
- Variants: the default dynamic cache, and the static cache without torch.compile (transformers
  compiles the forward pass of a static cache on its own unless told not to; compilation would take
  minutes and measure something else). A variant that cannot run is listed under "skipped" with why.

Prints one JSON object on stdout; progress goes to stderr.
"""
import argparse
import inspect
import json
import os
import platform
import sys
import time

# Offline machines: transformers must not wait on the hub for files a local checkpoint can do without.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig


def log(message):
    print(f"gpu_bench_transformers: {message}", file=sys.stderr, flush=True)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn, device):
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def load(path, dtype, device, attn):
    """The model on `device`. transformers renamed from_pretrained's torch_dtype to dtype in 4.56."""
    kwargs = {"attn_implementation": attn}
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in transformers.__version__.split(".")[:2])
    kwargs["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = dtype
    try:
        # Straight onto the device: a 16 GB model need not pass through host memory first.
        model = AutoModelForCausalLM.from_pretrained(path, device_map=str(device), **kwargs)
    except (ImportError, ValueError) as e:  # device_map wants accelerate in some releases
        log(f"device_map={device} refused ({e}); loading on the CPU, then moving")
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    return model.eval()


def weight_bytes_per_token(model):
    """Bytes a decoding step reads, as torchpatch counts them: every parameter except the embedding
    table (one row per token), which still counts when the head shares it; each tensor once."""
    seen, total = set(), 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if "embed_tokens" in name or p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attn", default="sdpa", help="attn_implementation (default sdpa)")
    parser.add_argument("--no-static-cache", action="store_true", help="measure the dynamic cache only")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = f"none ({platform.machine()} CPU, {torch.get_num_threads()} threads)"

    start = time.perf_counter()
    model = load(args.model, dtype, device, args.attn)
    load_seconds = time.perf_counter() - start
    log(f"loaded {args.model} in {load_seconds:.1f} s")

    generator = torch.Generator().manual_seed(args.seed)
    # From 3 up, as torchpatch's bench draws them: clear of the usual special ids at the bottom.
    ids = torch.randint(3, model.config.vocab_size, (1, args.prompt_len), generator=generator).to(device)
    mask = torch.ones_like(ids)
    forward_takes_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    eos = model.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, list) and eos else eos if eos is not None else 0

    def prefill():
        extra = {"logits_to_keep": 1} if forward_takes_keep else {}
        model(input_ids=ids, attention_mask=mask, use_cache=True, **extra)

    def generate(new_tokens, cache):
        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  num_beams=1, pad_token_id=pad, eos_token_id=eos)
        if cache:
            config.cache_implementation = cache
            if hasattr(config, "disable_compile"):
                config.disable_compile = True
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        if out.shape[1] != args.prompt_len + new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - args.prompt_len} new tokens, not {new_tokens}")

    results, skipped = [], []
    with torch.inference_mode():
        prefill()  # warm-up: kernels, cuBLAS handles, the caching allocator
        prefill_s = min(seconds(prefill, device) for _ in range(args.repeats))
        variants = [("dynamic cache", None)]
        if not args.no_static_cache:
            variants.append(("static cache, no torch.compile", "static"))
        for name, cache in variants:
            try:
                generate(args.decode_tokens + 1, cache)  # warm-up
                one = min(seconds(lambda: generate(1, cache), device) for _ in range(args.repeats))
                full = min(seconds(lambda: generate(args.decode_tokens + 1, cache), device) for _ in range(args.repeats))
            except Exception as e:  # a cache this release cannot run here: said, not fatal
                skipped.append({"variant": name, "reason": f"{type(e).__name__}: {e}"[:500]})
                log(f"{name}: skipped: {skipped[-1]['reason']}")
                continue
            decode_s = full - one
            results.append({
                "variant": name,
                "prefill_tokens_per_second": args.prompt_len / prefill_s,
                "decode_tokens_per_second": args.decode_tokens / decode_s if decode_s > 0 else None,
                "prefill_seconds": prefill_s,
                "generate_1_seconds": one,
                "generate_seconds": full,
            })
            log(f"{name}: prefill {results[-1]['prefill_tokens_per_second']:.0f} tokens/s, "
                f"decode {results[-1]['decode_tokens_per_second'] or 0:.1f} tokens/s")

    print(json.dumps({
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "gpu": gpu,
        "device": str(device),
        "dtype": args.dtype,
        "attn_implementation": args.attn,
        "model": args.model,
        "prompt_len": args.prompt_len,
        "decode_tokens": args.decode_tokens,
        "repeats": args.repeats,
        "load_seconds": load_seconds,
        "weight_bytes_per_token": weight_bytes_per_token(model),
        "results": results,
        "skipped": skipped,
    }, indent=2))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Sets `torchpatch bench --json` beside scripts/gpu_bench_transformers.py's JSON, both run on the same
checkpoint and GPU, as a markdown table (scripts/gpu-check.sh writes it to $OUT/gpu-bench.md).

Decode speed is also given as a fraction of the GPU's memory bandwidth: decoding one token reads every
weight once, so tokens/s x weight bytes per token / bandwidth is how close decoding comes to the limit
the memory sets. The stated bandwidth is 4.8 TB/s (an H200's HBM3e) unless told otherwise; where the
GPU's name says it has another, a second column gives the fraction of that one too.

Either input may be missing or unreadable, and any variant may be absent: what is missing reads
"not measured" and the rest is still written.
"""
import argparse
import datetime
import json
import sys

# Torchpatch's variants on CUDA, in the order the table shows them.
BF16_GRAPH = "built-in"
BF16_NO_GRAPH = "built-in, no CUDA graph"
QUANTIZED = ["quantized q8_0", "quantized q4_0"]
TRANSFORMERS_REFERENCE = "dynamic cache"  # transformers' default: what the ratios divide by

# Memory bandwidth of the data-centre GPUs by (a part of) the name nvidia-smi gives, in TB/s. The
# more specific names come first.
KNOWN_BANDWIDTH_TBS = [
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM5, "NVIDIA H100 80GB HBM3"
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
    ("A100", 1.555),
]

NOT_MEASURED = "not measured"


def read_json(path, what, notes):
    if not path:
        notes.append(f"{what}: no file given")
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        notes.append(f"{what}: {path} does not exist")
    except (OSError, ValueError) as e:
        notes.append(f"{what}: {path} is not readable JSON ({e})")
    return None


def by_variant(report):
    rows = {}
    for row in (report or {}).get("results", []) or []:
        if isinstance(row, dict) and "variant" in row:
            rows[row["variant"]] = row
    return rows


def number(row, key):
    value = (row or {}).get(key)
    return value if isinstance(value, (int, float)) and value > 0 else None


def fmt_rate(value):
    if value is None:
        return NOT_MEASURED
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def fmt_ratio(num, den, suffix="x"):
    if num is None or den is None:
        return NOT_MEASURED
    return f"{num / den:.2f}{suffix}"


def fmt_fraction(tokens_per_s, bytes_per_token, bandwidth):
    if tokens_per_s is None or bytes_per_token is None:
        return NOT_MEASURED
    return f"{tokens_per_s * bytes_per_token / bandwidth:.2f}"


def gpu_bandwidth_tbs(gpu):
    for name, tbs in KNOWN_BANDWIDTH_TBS:
        if name.lower() in (gpu or "").lower():
            return tbs
    return None


def build_table(tp, hf, gpu, date, bandwidth_tbs, notes):
    tp_rows, hf_rows = by_variant(tp), by_variant(hf)
    gpu = gpu or (hf or {}).get("gpu") or (tp or {}).get("device") or "unknown GPU"
    bandwidth = bandwidth_tbs * 1e12
    own_tbs = gpu_bandwidth_tbs(gpu)
    extra_bandwidth = own_tbs if own_tbs is not None and abs(own_tbs - bandwidth_tbs) > 1e-9 else None

    # Weight bytes a decoded bf16 token reads: torchpatch's count for its bf16 model, else the same
    # rule applied by the transformers script; both read the same checkpoint.
    bf16_bytes = number(tp_rows.get(BF16_GRAPH), "weight_bytes_per_token") or number(tp, "weight_bytes_per_token") \
        or number(hf, "weight_bytes_per_token")

    reference = hf_rows.get(TRANSFORMERS_REFERENCE)
    reference_name = TRANSFORMERS_REFERENCE
    if reference is None and hf_rows:
        reference_name, reference = next(iter(hf_rows.items()))
    ref_prefill, ref_decode = number(reference, "prefill_tokens_per_second"), number(reference, "decode_tokens_per_second")

    lines = []
    model = (tp or {}).get("model") or (hf or {}).get("model") or "unknown model"
    lines.append(f"# torchpatch and transformers on {gpu}")
    lines.append("")
    facts = [f"{date}", f"GPU: {gpu}", f"model: {model}"]
    if number(tp, "parameters"):
        facts.append(f"{tp['parameters'] / 1e9:.2f} B parameters")
    if bf16_bytes:
        facts.append(f"{bf16_bytes / 1e9:.2f} GB of bf16 weights read per decoded token")
    prompt = (tp or {}).get("prompt_len") or (hf or {}).get("prompt_len")
    decode = (tp or {}).get("decode_tokens") or (hf or {}).get("decode_tokens")
    if prompt:
        facts.append(f"prompt {prompt} tokens")
    if decode:
        facts.append(f"{decode} decoded tokens")
    if hf:
        facts.append(f"transformers {hf.get('transformers_version', '?')}, torch {hf.get('torch_version', '?')}, "
                     f"attention {hf.get('attn_implementation', '?')}")
    if number(tp, "copy_bandwidth_bytes_per_second"):
        facts.append(f"device copy bandwidth measured by torchpatch bench: {tp['copy_bandwidth_bytes_per_second'] / 1e12:.2f} TB/s")
    lines.append("; ".join(facts) + ". Batch 1, greedy, best of the repeats.")
    lines.append("")

    bw_header = f"decode x bytes/token / {bandwidth_tbs:g} TB/s"
    header = ["system", "variant", "prefill tokens/s", "decode tokens/s", bw_header]
    if extra_bandwidth:
        header.append(f"decode x bytes/token / {extra_bandwidth:g} TB/s (this GPU's spec)")
    header += [f"prefill vs transformers ({reference_name})", f"decode vs transformers ({reference_name})"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|")

    def row(system, variant, data, bytes_per_token):
        prefill, dec = number(data, "prefill_tokens_per_second"), number(data, "decode_tokens_per_second")
        cells = [system, variant, fmt_rate(prefill), fmt_rate(dec), fmt_fraction(dec, bytes_per_token, bandwidth)]
        if extra_bandwidth:
            cells.append(fmt_fraction(dec, bytes_per_token, extra_bandwidth * 1e12))
        cells += [fmt_ratio(prefill, ref_prefill), fmt_ratio(dec, ref_decode)]
        lines.append("| " + " | ".join(cells) + " |")

    row("torchpatch", "bf16, CUDA graph decode (built-in)", tp_rows.get(BF16_GRAPH), bf16_bytes)
    row("torchpatch", "bf16, no CUDA graph", tp_rows.get(BF16_NO_GRAPH), bf16_bytes)
    hf_names = [TRANSFORMERS_REFERENCE] + [name for name in hf_rows if name != TRANSFORMERS_REFERENCE]
    for name in hf_names:
        row("transformers", f"bf16, {name}", hf_rows.get(name), bf16_bytes)
    for skipped in (hf or {}).get("skipped", []) or []:
        notes.append(f"transformers, {skipped.get('variant')}: not measured: {skipped.get('reason')}")

    lines.append("")
    lines.append("Quantized weights (torchpatch's `quantized` plugin, llama.cpp's block formats):")
    lines.append("")
    bf16_decode = number(tp_rows.get(BF16_GRAPH), "decode_tokens_per_second")
    lines.append(f"| variant | decode tokens/s | x torchpatch bf16 decode | weight bytes/token | {bw_header} | prefill tokens/s |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for name in QUANTIZED:
        data = tp_rows.get(name)
        dec = number(data, "decode_tokens_per_second")
        qbytes = number(data, "weight_bytes_per_token")
        lines.append("| " + " | ".join([
            name, fmt_rate(dec), fmt_ratio(dec, bf16_decode),
            f"{qbytes / 1e9:.2f} GB" if qbytes else NOT_MEASURED,
            fmt_fraction(dec, qbytes, bandwidth), fmt_rate(number(data, "prefill_tokens_per_second"))]) + " |")

    others = [name for name in tp_rows if name not in [BF16_GRAPH, BF16_NO_GRAPH] + QUANTIZED]
    if others:
        lines.append("")
        lines.append("Other torchpatch variants in the same run:")
        lines.append("")
        lines.append(f"| variant | prefill tokens/s | decode tokens/s | {bw_header} |")
        lines.append("|---|---:|---:|---:|")
        for name in others:
            data = tp_rows[name]
            dec = number(data, "decode_tokens_per_second")
            lines.append(f"| {name} | {fmt_rate(number(data, 'prefill_tokens_per_second'))} | {fmt_rate(dec)} | "
                         f"{fmt_fraction(dec, number(data, 'weight_bytes_per_token') or bf16_bytes, bandwidth)} |")

    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchpatch", help="torchpatch bench --json output")
    parser.add_argument("--transformers", help="gpu_bench_transformers.py output")
    parser.add_argument("--output", help="markdown file to write (it is printed either way)")
    parser.add_argument("--gpu", help="the GPU's name (default: the transformers JSON's)")
    parser.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8,
                        help="memory bandwidth the decode fraction is of, TB/s (default 4.8)")
    args = parser.parse_args()

    notes = []
    tp = read_json(args.torchpatch, "torchpatch bench", notes)
    hf = read_json(args.transformers, "transformers bench", notes)
    table = build_table(tp, hf, args.gpu, args.date, args.bandwidth_tbs, notes)
    if args.output:
        with open(args.output, "w") as f:
            f.write(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

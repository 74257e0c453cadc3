#!/usr/bin/env bash
# torchpatch against llama.cpp on the same weights, side by side in one run: the table of
# docs/benchmarks.md ("Presets against llama.cpp"). For each preset, format and thread count:
#   1. the preset's float32 weights saved as GGUF (`torchpatch save --format gguf`), quantized by
#      llama.cpp's own llama-quantize (its default mix: the output layer at Q6_K);
#   2. `llama-bench -o json` on that file, then `torchpatch bench --preset P --quantize F
#      --compare-llama-bench JSON` (torchpatch's own mix: the output layer at Q8_0 under q4_0);
#   3. rounds interleaved, the best of each cell kept (both tools report the best of their runs);
#      decoding timed from a one-token prompt, as llama-bench's tg test decodes from an empty cache.
# Usage: scripts/bench-llama-cpp.sh [avx2|native]   (default native)
#   avx2    torchpatch capped at AVX2 (ATEN_CPU_CAPABILITY=avx2 for LibTorch's kernels and torchpatch's,
#           MKL_ENABLE_INSTRUCTIONS=AVX2 for MKL's) against a llama.cpp built for AVX2 without AVX-512
#           (scripts/build-llama-cpp.sh with TORCHPATCH_LLAMA_CPU=avx2): an AVX2 machine's figures on
#           a machine that also has AVX-512
#   native  the best kernels each has on this machine
# Environment: PRESETS (default "llama-125m qwen2-moe-125m"), FORMATS ("f32 q8_0 q4_0"), THREADS
# ("1 2"), ROUNDS (2), PROMPT (128), DECODE (64), REPEATS (3), WORK (a temporary directory, removed).
# Needs the release build (build/bin/torchpatch) and python3 for the table.
set -euo pipefail
cd "$(dirname "$0")/.."
level=${1:-native}
case $level in
  native) kernel=auto; llama_build=build ;;
  # LibTorch's kernels, MKL's and torchpatch's own all stop at AVX2 (base/cpu_level.h).
  avx2) kernel=avx2; llama_build=build-avx2; export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  *) echo "bench-llama-cpp: '$level' is not a level (avx2 or native)" >&2; exit 2 ;;
esac
presets=${PRESETS:-llama-125m qwen2-moe-125m}
formats=${FORMATS:-f32 q8_0 q4_0}
threads=${THREADS:-1 2}
rounds=${ROUNDS:-2}
prompt=${PROMPT:-128}
decode=${DECODE:-64}
repeats=${REPEATS:-3}
torchpatch=build/bin/torchpatch
[[ -x $torchpatch ]] || { echo "bench-llama-cpp: $torchpatch is missing: build the project first" >&2; exit 1; }
TORCHPATCH_LLAMA_CPU=$level scripts/build-llama-cpp.sh >&2
bin=build/_deps/llama.cpp/$llama_build/bin
work=${WORK:-$(mktemp -d)}
[[ -n ${WORK:-} ]] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"

for preset in $presets; do
  f32=$work/$preset-f32.gguf
  [[ -f $f32 ]] || "$torchpatch" save --preset "$preset" --format gguf --output "$f32" --quiet >&2
  for format in $formats; do
    [[ $format == f32 || -f $work/$preset-$format.gguf ]] ||
      "$bin/llama-quantize" "$f32" "$work/$preset-$format.gguf" "${format^^}" >"$work/quantize.log" 2>&1
  done
done

for round in $(seq "$rounds"); do
  for preset in $presets; do
    for format in $formats; do
      for t in $threads; do
        cell=$work/$preset-$format-t$t-r$round
        "$bin/llama-bench" -m "$work/$preset-$format.gguf" -t "$t" -p "$prompt" -n "$decode" -r "$repeats" -o json \
          >"$cell-llama.json" 2>/dev/null
        quantize=()
        [[ $format == f32 ]] || quantize=(--quantize "$format")
        "$torchpatch" bench --preset "$preset" "${quantize[@]}" --threads "$t" --prompt-len "$prompt" \
          --decode-tokens "$decode" --repeats "$repeats" --no-fused --no-blas --no-eager-attention --no-quantized \
          --quant-kernel "$kernel" --compare-llama-bench "$cell-llama.json" --json >"$cell-torchpatch.json"
        echo "bench-llama-cpp: round $round $preset $format $t thread(s) done" >&2
      done
    done
  done
done

python3 - "$work" "$level" "$rounds" <<'PY'
import glob, json, os, sys
work, level, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
cells = {}
for path in sorted(glob.glob(os.path.join(work, "*-torchpatch.json"))):
    name = os.path.basename(path)[: -len("-torchpatch.json")]
    key = name.rsplit("-r", 1)[0]
    report = json.load(open(path))
    ours, theirs = report["results"][0], report["llama_bench"]
    best = cells.setdefault(key, {"tp": [0, 0], "ll": [0, 0], "kernel": report["quant_kernel"],
                                  "layout": report["quant_layout"], "commit": theirs["build_commit"]})
    best["tp"] = [max(best["tp"][0], ours["prefill_tokens_per_second"]), max(best["tp"][1], ours["decode_tokens_per_second"])]
    best["ll"] = [max(best["ll"][0], theirs["prefill_tokens_per_second"]), max(best["ll"][1], theirs["decode_tokens_per_second"])]
print(f"level {level}, best of {rounds} interleaved rounds per cell")
print("| model | format | threads | prefill tok/s, torchpatch / llama.cpp | ratio | decode tok/s, torchpatch / llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|")
for key, c in cells.items():
    preset, fmt_, t = key.rsplit("-", 2)
    (pp, tg), (lpp, ltg) = c["tp"], c["ll"]
    print(f"| {preset} | {fmt_} | {t[1:]} | {pp:.1f} / {lpp:.1f} | {pp / lpp:.2f} | {tg:.1f} / {ltg:.1f} | {tg / ltg:.2f} |")
first = next(iter(cells.values()))
print(f"(torchpatch kernel {first['kernel']}, layout {first['layout']}; llama.cpp {first['commit']})")
PY

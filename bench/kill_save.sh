#!/usr/bin/env bash
# kill -9 during saves of a large checkpoint: `torchpatch save` of one ~500 MB model over another,
# killed at evenly spread moments; after each kill the directory must load, strictly, as the old model
# or as the new one. Not a timed test (a few minutes); its figures are in docs/hardening.md.
#   bench/kill_save.sh [BUILD_DIR] [KILLS]
set -euo pipefail
build=${1:-build}
kills=${2:-20}
cli=$(realpath "$build/bin/torchpatch")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ckpt=$work/ckpt
old=(--preset qwen2-moe-125m)   # what the directory holds before each save
new=(--preset llama-125m)       # what each save writes over it
shard=(--max-shard-bytes 100000000)

loads_as() {  # prints the model_type the directory loads as, or "broken"
  if "$cli" plan --model "$1" --json >"$work/plan.json" 2>"$work/plan.err"; then
    grep -o '"model_type": *"[^"]*"' "$work/plan.json" | head -1 | sed 's/.*: *"//; s/"//'
  else
    echo broken; sed 's/^/  /' "$work/plan.err" >&2
  fi
}

"$cli" save "${old[@]}" "${shard[@]}" --out "$ckpt" >/dev/null
start=$(date +%s.%N)
"$cli" save "${new[@]}" "${shard[@]}" --out "$ckpt" >/dev/null
whole=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
echo "one whole save: ${whole} s ($(du -sm "$ckpt" | cut -f1) MB)"

declare -A outcomes=()
for ((i = 0; i < kills; i++)); do
  "$cli" save "${old[@]}" "${shard[@]}" --out "$ckpt" >/dev/null
  "$cli" save "${new[@]}" "${shard[@]}" --out "$ckpt" >/dev/null &
  pid=$!
  at=$(awk -v w="$whole" -v i="$i" -v k="$kills" 'BEGIN { printf "%.2f", w * (i + 0.5) / k }')
  sleep "$at"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  type=$(loads_as "$ckpt")
  outcomes[$type]=$(( ${outcomes[$type]:-0} + 1 ))
  leftovers=$(find "$ckpt" -maxdepth 1 -name '.torchpatch-*' | wc -l)  # the load cleans up after the kill
  echo "kill $i at $at s: loads as $type (staging or commit dirs left after the load: $leftovers)"
done
echo "outcomes:"; for t in "${!outcomes[@]}"; do echo "  $t: ${outcomes[$t]}"; done
[[ -z ${outcomes[broken]:-} ]]

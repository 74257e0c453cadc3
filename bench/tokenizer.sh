#!/usr/bin/env bash
# Tokenizer encoding speed against Hugging Face's JavaScript implementation, same text, same run.
# Installs @huggingface/tokenizers from the npm registry into $XDG_CACHE_HOME (or ~/.cache) the first
# time; without node or npm only torchpatch is measured (next to reference.json's JS figure).
#   usage: bench/tokenizer.sh [BUILD_DIR] [MB]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mb=${2:-1}
data=tests/data/tokenizers
ninja -C "$build" bench_tokenizer >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bin/bench_tokenizer" "$data" --mb "$mb" --write-text "$work/text.txt"

js_args=()
package=${XDG_CACHE_HOME:-$HOME/.cache}/torchpatch/tokenizers-js
if command -v node >/dev/null && command -v npm >/dev/null; then
  if [ ! -d "$package/node_modules/@huggingface/tokenizers" ]; then
    mkdir -p "$package"
    npm install --silent --prefix "$package" @huggingface/tokenizers@0.2.0 >/dev/null
  fi
  node bench/tokenizer_js.cjs "$package/node_modules/@huggingface/tokenizers" "$work/text.txt" \
    "$data/llama2" "$data/llama3" "$data/qwen3" > "$work/js.jsonl"
  js_args=(--js "$work/js.jsonl")
fi
"$build/bin/bench_tokenizer" "$data" --mb "$mb" ${js_args[@]+"${js_args[@]}"}

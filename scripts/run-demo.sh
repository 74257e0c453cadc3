#!/usr/bin/env bash
# The main job: build the CLI and the bundled plugins (nothing else), then run the CLI on built-in tiny
# models with them.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHPATCH_TARGETS="torchpatch torchpatch_plugins" scripts/bootstrap.sh -DTORCHPATCH_BUILD_TESTS=OFF
tp=${BUILD_DIR:-build}/bin/torchpatch

run() {
  echo; echo "\$ torchpatch $*"
  "$tp" "$@"
}
run plugins
run plan --preset tiny-llama --patch LlamaAttention=CustomLlamaAttention
run run --preset tiny-llama --prompt-ids 1,2,3,4 --patch LlamaAttention=CustomLlamaAttention
run generate --preset tiny-mistral --prompt-ids 1,2,3,4 --max-new-tokens 16 --patch MistralAttention=FusedQKVAttention
run verify --preset tiny-llama --patch LlamaAttention=FusedQKVAttention
run run --preset tiny-bert --prompt-ids 1,2,3,4
run tokenize --tokenizer tests/data/tokenizers/llama3 --json 'Hello world'

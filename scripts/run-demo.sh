#!/usr/bin/env bash
# The main job: build, then run the CLI on the built-in tiny Llama with the bundled plugin.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh -DTORCHPATCH_BUILD_TESTS=OFF
tp=${BUILD_DIR:-build}/bin/torchpatch

echo; echo "\$ torchpatch plugins"
"$tp" plugins
echo; echo "\$ torchpatch plan --preset tiny-llama --patch LlamaAttention=CustomLlamaAttention"
"$tp" plan --preset tiny-llama --patch LlamaAttention=CustomLlamaAttention
echo; echo "\$ torchpatch run --preset tiny-llama --prompt-ids 1,2,3,4 --patch LlamaAttention=CustomLlamaAttention"
"$tp" run --preset tiny-llama --prompt-ids 1,2,3,4 --patch LlamaAttention=CustomLlamaAttention
echo; echo "\$ torchpatch generate --preset tiny-mistral --prompt-ids 1,2,3,4 --max-new-tokens 16 --patch MistralAttention=FusedQKVAttention"
"$tp" generate --preset tiny-mistral --prompt-ids 1,2,3,4 --max-new-tokens 16 --patch MistralAttention=FusedQKVAttention
echo; echo "\$ torchpatch verify --preset tiny-llama --patch LlamaAttention=FusedQKVAttention"
"$tp" verify --preset tiny-llama --patch LlamaAttention=FusedQKVAttention
echo; echo "\$ torchpatch run --preset tiny-bert --prompt-ids 1,2,3,4"
"$tp" run --preset tiny-bert --prompt-ids 1,2,3,4
echo; echo "\$ torchpatch tokenize --tokenizer tests/data/tokenizers/llama3 --json 'Hello world'"
"$tp" tokenize --tokenizer tests/data/tokenizers/llama3 --json 'Hello world'

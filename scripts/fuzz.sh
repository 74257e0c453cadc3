#!/usr/bin/env bash
# Builds the fuzz targets with clang 14 (ASan, UBSan and libFuzzer over every library they reach) and
# runs each for TORCHPATCH_FUZZ_SECONDS (default 20) over its seed corpus.
exec "$(dirname "$0")/sanitize.sh" fuzz

#!/usr/bin/env bash
# Builds the fuzz targets with clang 14 (ASan, UBSan and libFuzzer over every library they reach) and
# runs each for TORCHPATCH_FUZZ_SECONDS (default 20) over its seed corpus, as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(clang-14 libclang-rt-14-dev)
scripts/install-packages.sh "${packages[@]}"
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
CXX=clang++-14 cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORCHPATCH_BUILD_TESTS=OFF \
  -DTORCHPATCH_BUILD_FUZZERS=ON -DTORCHPATCH_FUZZ_SECONDS="${TORCHPATCH_FUZZ_SECONDS:-20}"
cmake --build "$build_dir" --target torchpatch_fuzzers
ctest --test-dir "$build_dir" -L fuzz --output-on-failure

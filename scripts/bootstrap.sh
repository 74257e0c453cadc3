#!/usr/bin/env bash
# Installs the Debian packages torchpatch needs (only those missing), then configures and builds.
# Used by run-demo.sh and test.sh; BUILD_DIR (default: build) selects the build tree.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ ccache pkg-config
          libtorch-dev libopenblas0-openmp          # LibTorch, and the BLAS it should use (14x the reference BLAS)
          libgloo-dev                              # the Gloo headers c10d's ProcessGroupGloo needs
          libdnnl-dev                              # oneDNN's sgemm for float32 prefill (LibTorch loads the library)
          libsleef-dev                             # Sleef's vector expf for decode attention (LibTorch loads the library)
          libboost-dev libboost-regex-dev          # Boost.DLL (headers), Boost.Regex
          libicu-dev                               # Unicode normalization and properties (tokenizers)
          libcli11-dev                             # the CLI's command-line parser
          catch2 libfmt-dev nlohmann-json3-dev)
scripts/install-packages.sh "${packages[@]}"

build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build_dir"

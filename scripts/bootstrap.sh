#!/usr/bin/env bash
# Installs what torchpatch needs (only what is missing), then configures and builds.
# Used by run-demo.sh, test.sh and sanitize.sh. Arguments go to CMake.
#   BUILD_DIR            the build tree (default: build)
#   TORCHPATCH_LIBTORCH  which LibTorch to build against:
#                          wheel   LibTorch 2.x from PyPI's torch wheel, installed inside the build
#                                  tree by scripts/install-libtorch.sh (the default; what CI tests)
#                          debian  Debian bookworm's libtorch-dev 1.13 (the previous runtime; kept
#                                  for comparisons, not run by CI)
#   CXX                  the compiler (sanitize.sh sets clang++-14)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ ccache pkg-config
          libgloo-dev                              # the Gloo headers c10d's ProcessGroupGloo needs (no wheel ships them)
          libsleef-dev                             # Sleef's vector expf for decode attention
          libboost-dev libboost-regex-dev          # Boost.DLL (headers), Boost.Regex
          libicu-dev                               # Unicode normalization and properties (tokenizers)
          libcli11-dev                             # the CLI's command-line parser
          catch2 libfmt-dev nlohmann-json3-dev)
libtorch=${TORCHPATCH_LIBTORCH:-wheel}
case $libtorch in
  wheel) ;;
  debian) packages+=(libtorch-dev libopenblas0-openmp    # and the BLAS it should use (14x the reference BLAS)
                    libdnnl-dev) ;;                       # oneDNN's sgemm for float32 prefill (nn/gemm.cpp)
  *) echo "bootstrap: TORCHPATCH_LIBTORCH is '$libtorch'; use wheel (LibTorch 2.x from PyPI) or debian (libtorch-dev 1.13)" >&2
     exit 2 ;;
esac
scripts/install-packages.sh "${packages[@]}"

build_dir=${BUILD_DIR:-build}
torch_args=()
if [[ $libtorch == wheel ]]; then
  # One LibTorch for every build tree of the checkout (the sanitizer builds reuse the main one's).
  prefix=$(TORCHPATCH_DEPS_DIR=${TORCHPATCH_DEPS_DIR:-build/_deps} scripts/install-libtorch.sh)
  torch_args=(-DCMAKE_PREFIX_PATH="$prefix")
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${torch_args[@]}" "$@"
cmake --build "$build_dir"

#!/usr/bin/env bash
# Installs what torchpatch needs (only what is missing), then configures and builds, saying which stage
# it is in and how long each took. Used by run-demo.sh and test.sh. Arguments go to CMake.
#   BUILD_DIR            the build tree (default: build)
#   TORCHPATCH_TARGETS   what to build (default: everything the configuration has)
#   TORCHPATCH_LIBTORCH  which LibTorch to build against:
#                          wheel   LibTorch 2.x from PyPI's torch wheel, installed in the user's cache
#                                  by scripts/install-libtorch.sh (the default; what CI tests)
#                          debian  Debian bookworm's libtorch-dev 1.13 (the previous runtime; kept
#                                  for comparisons, not run by CI)
#   CXX                  the compiler
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
stage() { echo "bootstrap: [$1/4] $2 ($((SECONDS - start)) s so far)"; }

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
stage 1 "Debian packages (installing those missing)"
scripts/install-packages.sh "${packages[@]}"

build_dir=${BUILD_DIR:-build}
torch_args=()
if [[ $libtorch == wheel ]]; then
  stage 2 "LibTorch (scripts/install-libtorch.sh; downloaded once per machine)"
  prefix=$(scripts/install-libtorch.sh)
  torch_args=(-DCMAKE_PREFIX_PATH="$prefix")
fi
stage 3 "configuring $build_dir"
mkdir -p "$build_dir"
# Release: -O2 without debug information (CMakeLists.txt), also in a tree an older version configured.
if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${torch_args[@]}" "$@" >"$build_dir/configure.log" 2>&1; then
  cat "$build_dir/configure.log" >&2
  exit 1
fi
grep -E "^-- torchpatch:" "$build_dir/configure.log" || true  # CUDA on or off, and why (the rest: configure.log)
targets=()
[[ -n ${TORCHPATCH_TARGETS:-} ]] && targets=(--target $TORCHPATCH_TARGETS)
stage 4 "building ${TORCHPATCH_TARGETS:-everything} in $build_dir (ninja's [done/total] below)"
cmake --build "$build_dir" "${targets[@]}"
echo "bootstrap: built in $((SECONDS - start)) s"

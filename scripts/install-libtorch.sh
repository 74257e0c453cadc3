#!/usr/bin/env bash
# Installs LibTorch from PyPI's torch wheel into a virtual environment inside the build tree
# (nothing system-wide) and prints the prefix to give CMake as CMAKE_PREFIX_PATH: the wheel's torch/
# directory, the parent of torch.utils.cmake_prefix_path, so that its libraries are found before a
# system LibTorch's (Debian's libtorch-dev) as well as its CMake files.
#
# PyPI's Linux wheel is the CUDA 13 build: its libraries need the CUDA toolkit's runtime, cuBLAS,
# cuDNN and NCCL (from the machine's CUDA 13 toolkit), and three libraries the toolkit lacks, which
# come from their own wheels here. Nothing else of the wheel's Python dependencies is installed:
# torchpatch uses the wheel's C++ libraries and headers only.
#   TORCHPATCH_TORCH_VERSION  the torch release (default: the one CI tests)
#   TORCHPATCH_DEPS_DIR       where the environment goes (default: build/_deps)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${TORCHPATCH_TORCH_VERSION:-2.11.0}
venv=${TORCHPATCH_DEPS_DIR:-build/_deps}/torch-$version
# The libraries libtorch_cuda.so needs that the CUDA 13 toolkit does not carry; the wheel's RUNPATH
# looks for them under site-packages/nvidia/.
extras=(nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)

if [[ ! -f $venv/installed ]]; then
  if ! python3 -m venv --help >/dev/null 2>&1; then
    scripts/install-packages.sh python3 python3-venv >&2
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  echo "installing torch $version's LibTorch from PyPI into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    "torch==$version" "${extras[@]}" >&2
  touch "$venv/installed"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site/torch"

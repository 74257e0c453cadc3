#!/usr/bin/env bash
# Installs LibTorch from PyPI's torch wheel into a virtual environment in a cache directory outside any
# checkout (an installed torchpatch finds LibTorch where it was built against, so it must outlive the
# build tree; and every clone shares one download), then prints the prefix to give CMake as
# CMAKE_PREFIX_PATH: the wheel's torch/ directory.
#
# PyPI's Linux wheel is the CUDA 13 build. Its CPU library, libtorch_cpu, which is all a CPU build of
# torchpatch loads, needs two small CUDA libraries (the runtime and CUPTI, 13 MB); they come from their
# own wheels, so it loads on a machine without the CUDA toolkit. Its CUDA library needs the toolkit's
# cuBLAS, cuDNN and NCCL and three libraries the toolkit lacks: those three are installed only where
# the toolkit is (nvcc found), where torchpatch builds its CUDA code. Nothing else of the wheel's
# Python dependencies is installed: torchpatch uses the wheel's C++ libraries and headers only.
#   TORCHPATCH_TORCH_VERSION  the torch release (default: the one CI tests)
#   TORCHPATCH_LIBTORCH_DIR   where the environments go (default: ~/.cache/torchpatch; as root
#                             /var/cache/torchpatch, which programs run as other users can read too)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${TORCHPATCH_TORCH_VERSION:-2.11.0}
if [[ $(id -u) -eq 0 ]]; then
  cache=/var/cache/torchpatch
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/torchpatch
fi
venv=${TORCHPATCH_LIBTORCH_DIR:-$cache}/torch-$version
# What libtorch_cpu.so loads (its RPATH looks in site-packages/nvidia/cu13/lib), at the versions the
# torch wheel asks for (its cuda-toolkit[cudart,cupti] 13.0.2 requirement).
runtime=("nvidia-cuda-runtime==13.0.96.*" "nvidia-cuda-cupti==13.0.85.*")
# What libtorch_cuda.so needs beside the toolkit; its RPATH looks for them under site-packages/nvidia/.
cuda_extras=(nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)

pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$@" >&2
}

if [[ ! -f $venv/installed ]]; then
  if ! python3 -m venv --help >/dev/null 2>&1; then
    scripts/install-packages.sh python3 python3-venv >&2
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  echo "installing torch $version's LibTorch from PyPI into $venv (a 545 MB download, 1.3 GB installed)" >&2
  pip_install "torch==$version" "${runtime[@]}"
  touch "$venv/installed"
fi
if [[ ! -f $venv/installed-cuda-extras ]] && { nvcc --version &>/dev/null || /usr/local/cuda/bin/nvcc --version &>/dev/null; }; then
  echo "installing the libraries LibTorch's CUDA library needs beside the CUDA toolkit into $venv" >&2
  pip_install "${cuda_extras[@]}"
  touch "$venv/installed-cuda-extras"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site/torch"

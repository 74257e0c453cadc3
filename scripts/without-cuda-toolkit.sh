#!/usr/bin/env bash
# Runs a command as on a machine without the CUDA toolkit: in a mount namespace of its own (as root),
# empty folders over the toolkit's directories (/usr/local/cuda-*, which the toolkit's links in
# /usr/local/{bin,lib,include} and the loader's cache point into) and nothing over its nvcc wrapper.
# The check of the set-up on such a machine, in a fresh clone:
#   scripts/without-cuda-toolkit.sh scripts/run-demo.sh
#   scripts/without-cuda-toolkit.sh scripts/test.sh
set -euo pipefail
if (( $# == 0 )); then
  echo "usage: scripts/without-cuda-toolkit.sh COMMAND [ARGUMENTS...]" >&2
  exit 2
fi
exec unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  empty=$(mktemp -d)
  for dir in /usr/local/cuda-*/ /opt/cuda/; do
    [[ -d $dir ]] && mount --bind "$empty" "$dir"
  done
  for tool in /usr/local/bin/nvcc /usr/bin/nvcc; do
    [[ -e $tool ]] && mount --bind /dev/null "$tool"
  done
  if nvcc --version >/dev/null 2>&1 || [[ -e /usr/local/cuda/lib64/libcudart.so ]]; then
    echo "without-cuda-toolkit: the toolkit is still visible" >&2
    exit 1
  fi
  exec "$@"' bash "$@"

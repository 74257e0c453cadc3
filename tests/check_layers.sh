#!/usr/bin/env bash
# Fails when a lower layer of libtorchpatch_core includes a higher one. The layers, lowest first:
#   0 base        torchpatch/{config,device,error,export,version}.h  src/base
#   1 patching    torchpatch/patching/                      src/patching
#   1 text        torchpatch/text/                          src/text (beside patching: base only)
#   1 dist        torchpatch/dist/                          src/dist (process groups over c10d: base only)
#   2 nn          torchpatch/nn/                            src/nn
#   3 checkpoint  torchpatch/checkpoint/                    src/checkpoint
#   4 models      torchpatch/{models,generation,moe}/       src/{models,generation,moe}
#   5 runtime     torchpatch/runtime/                       src/runtime
# (host/ and the CLI sit above them all.)
set -euo pipefail
core=${1:?usage: check_layers.sh CORE_DIR}

layer_of() {  # a path under include/torchpatch or src, or an include target "torchpatch/..."
  case "$1" in
    *patching/* | *text/* | *dist/*) echo 1 ;;
    *nn/*) echo 2 ;;
    *checkpoint/*) echo 3 ;;
    *models/* | *generation/* | *moe/*) echo 4 ;;
    *runtime/*) echo 5 ;;
    *base/* | torchpatch/config.h | torchpatch/device.h | */torchpatch/device.h | torchpatch/error.h | torchpatch/export.h | torchpatch/version.h | \
      torchpatch/json_file.h | torchpatch/printable.h | */torchpatch/printable.h | */torchpatch/config.h | */torchpatch/error.h | */torchpatch/export.h | \
      */torchpatch/version.h | */torchpatch/json_file.h) echo 0 ;;
    *) echo unknown ;;
  esac
}

status=0
checked=0
while IFS= read -r file; do
  own=$(layer_of "${file#"$core"/}")
  if [[ $own == unknown ]]; then
    echo "check_layers: $file is in no layer (add its directory to tests/check_layers.sh)"
    status=1
    continue
  fi
  while IFS= read -r target; do
    theirs=$(layer_of "$target")
    checked=$((checked + 1))
    if [[ $theirs == unknown || $theirs -gt $own ]]; then
      echo "check_layers: ${file#"$core"/} (layer $own) includes $target (layer $theirs)"
      status=1
    fi
  done < <(sed -n 's/^#include "\(torchpatch\/[^"]*\)".*/\1/p; s/^#include "\([a-z_]*\/[^"]*\)".*/src\/\1/p' "$file" | grep -v '^src/torchpatch')
done < <(find "$core/include" "$core/src" -name '*.h' -o -name '*.cpp' | sort)
echo "check_layers: $checked includes checked"
exit $status

#!/usr/bin/env bash
# A save keeps the checkpoint directory it writes into: as root, over a directory of another owner
# (nobody:nogroup 0750, with a 0700 and a setgid 2770 subdirectory and a 0640 config.json); as that
# owner, where the parent is not writable; and into a mount point (a tmpfs, in a mount namespace of
# its own). Needs root (chown, setpriv, mount): exits 77, which ctest reports as skipped, without it.
# Usage: check_save_in_place.sh CLI
set -euo pipefail
cli=$1
if [[ $(id -u) -ne 0 ]]; then echo "skipped: needs root (chown, setpriv, mount)"; exit 77; fi
passes=0 failures=0
check() {  # check WHAT EXPECTED ACTUAL
  if [[ $2 == "$3" ]]; then
    echo "ok   $1: $3"
    passes=$((passes + 1))
  else
    echo "FAIL $1: expected $2, got $3"
    failures=$((failures + 1))
  fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/torchpatch-save-in-place.XXXXXX")
trap 'umount "$work/mounted" 2>/dev/null || true; rm -rf "$work"' EXIT
chmod 0755 "$work"

# As root, over another user's directory.
ckpt=$work/ckpt
"$cli" save --preset tiny-llama --max-shard-bytes 20000 --out "$ckpt" >/dev/null
mkdir -m 0700 "$ckpt/private" && mkdir "$ckpt/shared" && chmod 2770 "$ckpt/shared"
chown -R nobody:nogroup "$ckpt" && chmod 0750 "$ckpt" && chmod 0640 "$ckpt/config.json"
"$cli" save --preset tiny-mistral --out "$ckpt" >/dev/null
check "directory owner, group, mode" "nobody:nogroup 750" "$(stat -c '%U:%G %a' "$ckpt")"
check "0700 subdirectory" "nobody:nogroup 700" "$(stat -c '%U:%G %a' "$ckpt/private")"
check "setgid subdirectory" "nobody:nogroup 2770" "$(stat -c '%U:%G %a' "$ckpt/shared")"
check "config.json replaced in the old one's place" "nobody:nogroup 640" "$(stat -c '%U:%G %a' "$ckpt/config.json")"
check "files" "config.json model.safetensors private shared" "$(ls "$ckpt" | tr '\n' ' ' | sed 's/ $//')"
check "loads as the new checkpoint" "mistral" \
  "$("$cli" plan --model "$ckpt" --json | sed -n 's/.*"model_type": *"\([a-z0-9_]*\)".*/\1/p' | head -1)"

# As its owner, in a parent only root may write.
setpriv --reuid=nobody --regid=nogroup --clear-groups "$cli" save --preset tiny-llama --out "$ckpt" >/dev/null
check "saved by its owner, parent not writable" "nobody:nogroup 750" "$(stat -c '%U:%G %a' "$ckpt")"
check "nothing left beside it" "ckpt" "$(ls -A "$work" | tr '\n' ' ' | sed 's/ $//')"

# Into a mount point (renaming it would be "Device or resource busy").
mkdir "$work/mounted"
unshare -m bash -c "mount -t tmpfs none '$work/mounted' && \
  '$cli' save --preset tiny-llama --out '$work/mounted' >/dev/null && \
  '$cli' save --preset tiny-mistral --max-shard-bytes 20000 --out '$work/mounted' >/dev/null && \
  ls '$work/mounted' | grep -v '^model-000' | tr '\n' ' '" > "$work/mounted.txt" 2>&1 || true
# the sharded save replaced the single file (its shards aside)
check "saved twice into a mount point" "config.json model.safetensors.index.json" "$(sed 's/ $//' "$work/mounted.txt")"

echo "save in place: $passes passed, $failures failed"
((failures == 0))

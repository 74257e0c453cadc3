#!/usr/bin/env bash
# Runs every command line the README and docs/ show, as written, so a documented invocation cannot
# break unnoticed:
#   - in fenced sh/bash blocks, each line that starts with `build/bin/torchpatch ` (with its `\`
#     continuation lines), in document order (a `save --out /tmp/q8` comes before `run --model /tmp/q8`);
#   - inline code spans `torchpatch COMMAND --option ...` that name no placeholder (no all-caps word,
#     `...`, `[`, `|` or `<`), run as `build/bin/torchpatch ...`. A span without options names a command
#     in prose; a span with a placeholder is a synopsis.
# Each runs from a folder that mirrors the source tree with `build` pointing at this build, so relative
# paths resolve as in the docs. Usage: check_doc_commands.sh SOURCE_DIR BINARY_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
[[ -x $bin/bin/torchpatch ]] || { echo "check_doc_commands: no $bin/bin/torchpatch (build the CLI first)"; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/torchpatch-doc-commands.XXXXXX")
trap 'rm -rf "$work"' EXIT
for entry in "$src"/* "$src"/.[!.]*; do
  [[ -e $entry && $(basename "$entry") != build ]] && ln -s "$entry" "$work/$(basename "$entry")"
done
ln -s "$bin" "$work/build"

# One command a line, from the README then docs/*.md in name order.
extract() {
  awk '
    /^```/ { fenced = !fenced; shell = ($0 ~ /^```(sh|bash)/); next }
    fenced && shell {
      if (pending != "") { pending = pending " " $0; if ($0 !~ /\\$/) { print pending; pending = "" } else sub(/\\$/, "", pending); next }
      if ($0 ~ /^build\/bin\/torchpatch /) {
        if ($0 ~ /\\$/) { pending = $0; sub(/\\$/, "", pending) } else print
      }
      next
    }
    !fenced {
      line = $0
      while (match(line, /`torchpatch [a-z][^`]*`/)) {
        span = substr(line, RSTART + 1, RLENGTH - 2)
        line = substr(line, RSTART + RLENGTH)
        if (span !~ / --/) continue
        if (span ~ /\.\.\.|\[|\||</) continue
        if (span ~ /(^| )[A-Z][A-Z0-9_]*( |$)/) continue
        print "build/bin/" span
      }
    }
  ' "$1"
}

commands=()
while IFS= read -r line; do commands+=("$line"); done < <(
  { extract "$src/README.md"; for doc in "$src"/docs/*.md; do extract "$doc"; done; } | awk '!seen[$0]++')

# The files the commands write under /tmp (as the docs show them) are removed at the end, the ones
# that were there before left alone: the GGUF saves alone are hundreds of MB.
made=()
for path in $(printf '%s\n' "${commands[@]}" | grep -o '/tmp/[A-Za-z0-9._-]*' | sort -u); do
  [[ -e $path ]] || made+=("$path")
done
trap 'rm -rf "$work" "${made[@]}"' EXIT

passed=0 failed=0
failures=()
for cmd in "${commands[@]}"; do
  start=$SECONDS
  out=$(cd "$work" && timeout 600 bash -c "$cmd" 2>&1 </dev/null)
  code=$?
  if ((code == 0)); then
    passed=$((passed + 1))
    echo "ok   ($((SECONDS - start)) s) $cmd"
  else
    failed=$((failed + 1))
    failures+=("$cmd")
    echo "FAIL (exit $code, $((SECONDS - start)) s) $cmd"
    echo "$out" | tail -20 | sed 's/^/    /'
  fi
done
((${#commands[@]})) || { echo "check_doc_commands: found no documented command (the extraction broke)"; exit 1; }
for cmd in "${failures[@]}"; do echo "failed: $cmd"; done
echo "documented commands: $passed passed, $failed failed"
((failed == 0))

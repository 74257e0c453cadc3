#!/usr/bin/env bash
# What crash isolation costs: `torchpatch plugins --plugin-dir DIR` over four test plugins, with
# --no-probe (the baseline), probing with an empty cache (first run) and with the outcomes cached.
# Medians of ROUNDS runs each, in one run of this script.   bench/probe_cost.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
build=$(realpath "${1:-build}")
rounds=${2:-7}
cli=$build/bin/torchpatch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/plugins"
for p in good/testplugin_good derived_attention/testplugin_derived_attention toy_family/testplugin_toy_family \
         least_likely_router/testplugin_least_likely_router; do
  cp "$build/test-plugins/$p.so" "$work/plugins/"
done
n=$(ls "$work/plugins" | wc -l)

millis() {  # median wall time in ms of ROUNDS runs of: $1 (a setup command) then the CLI with the rest
  local setup=$1; shift
  for ((i = 0; i < rounds; i++)); do
    eval "$setup"
    local start=$(date +%s%N)
    TORCHPATCH_CACHE_DIR=$work/cache "$cli" plugins --plugin-dir "$work/plugins" "$@" >/dev/null
    echo $(( ($(date +%s%N) - start) / 1000000 ))
  done | sort -n | sed -n "$(( (rounds + 1) / 2 ))p"
}

base=$(millis "rm -rf $work/cache" --no-probe)
first=$(millis "rm -rf $work/cache")
cached=$(millis ":")
echo "plugins: $n; median of $rounds runs each"
echo "  --no-probe:            $base ms"
per() { awk -v a="$1" -v b="$base" -v n="$n" 'BEGIN { printf "%+.1f ms per plugin, %.2fx the baseline", (a - b) / n, a / b }'; }
echo "  probed, empty cache:   $first ms  ($(per "$first"))"
echo "  probed, cached:        $cached ms  ($(per "$cached"))"

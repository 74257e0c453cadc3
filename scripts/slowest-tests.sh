#!/usr/bin/env bash
# The slowest tests of the last ctest run in a build tree, from ctest's own timing data.
#   scripts/slowest-tests.sh BUILD_DIR [COUNT]
set -euo pipefail
costs=${1:?usage: slowest-tests.sh BUILD_DIR [COUNT]}/Testing/Temporary/CTestCostData.txt
count=${2:-10}
[[ -f $costs ]] || exit 0
echo "slowest $count tests of $1 (seconds, ctest's average per run):"
# Lines "NAME RUNS SECONDS" (the name may hold spaces) up to the "---" that starts the list of failures.
awk '/^---/ { exit } NF >= 3 { name = $1; for (i = 2; i <= NF - 2; i++) name = name " " $i; printf "%8.1f  %s\n", $NF, name }' \
  "$costs" | sort -rn | awk -v n="$count" 'NR <= n'

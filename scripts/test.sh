#!/usr/bin/env bash
# Build everything, tests included, and run the whole test suite through ctest; then say what each
# stage took and which tests took longest.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
start=$SECONDS
scripts/bootstrap.sh -DTORCHPATCH_BUILD_TESTS=ON
built=$((SECONDS - start))
scripts/install-test-models.sh
start=$SECONDS
status=0
ctest --test-dir "$build_dir" --output-on-failure -j2 || status=$?
echo "test: build took $built s, the suite $((SECONDS - start)) s"
scripts/slowest-tests.sh "$build_dir"
exit $status

#!/usr/bin/env bash
# Build everything, tests included, and run the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh -DTORCHPATCH_BUILD_TESTS=ON
scripts/install-test-models.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2

#!/usr/bin/env bash
# The sanitizer jobs, with clang 14, as CI runs them after the release suite:
#   asan   every test, and each fuzzer for TORCHPATCH_FUZZ_SECONDS (default 20) over its seed corpus,
#          under ASan and UBSan, in one build that instruments core, host, plugins and tests (the
#          fuzzers' coverage in libtorchpatch_core alone, where their input is read)
#   tsan   the multi-threaded tests ([threads]: registries, scoped patches, plugin hosts, the decode team,
#          a MoE block on two threads) under TSan, building only what they run: the library, the host
#          library, the five test files and the two test plugins they load
#   fuzz   only the fuzzers of the asan build (scripts/fuzz.sh)
#   all    asan, then tsan (the default)
# -O1 and line tables only: these builds are for finding faults, and build time is most of their cost.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
scripts/install-packages.sh clang-14 libclang-rt-14-dev
# The LibTorch the release build uses (scripts/bootstrap.sh): the wheel's, installed once per checkout.
libtorch=(-DCMAKE_PREFIX_PATH="$(scripts/install-libtorch.sh)")
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG" "${libtorch[@]}")
asan_dir=${ASAN_BUILD_DIR:-build-asan}
tsan_dir=${TSAN_BUILD_DIR:-build-tsan}

configure_asan() {
  CXX=clang++-14 cmake -S . -B "$asan_dir" "${common[@]}" -DTORCHPATCH_BUILD_TESTS=ON -DTORCHPATCH_BUILD_FUZZERS=ON \
    -DTORCHPATCH_FUZZ_SECONDS="${TORCHPATCH_FUZZ_SECONDS:-20}"
}

run_asan() {
  configure_asan
  # What the suite runs: the tests, with the CLI and every plugin they load, the host example, the fuzzers.
  cmake --build "$asan_dir" --target torchpatch_tests embed_host torchpatch_fuzzers
  # The crash tests need a plugin's own SIGSEGV to reach the probe, not ASan's report of it.
  # The documented commands (label docs: the 125M benches) are the release suite's.
  local status=0
  ASAN_OPTIONS=handle_segv=0 ctest --test-dir "$asan_dir" --output-on-failure -j2 -LE docs || status=$?
  scripts/slowest-tests.sh "$asan_dir"
  return $status
}

run_fuzz() {
  configure_asan
  cmake --build "$asan_dir" --target torchpatch_fuzzers
  ctest --test-dir "$asan_dir" -L fuzz --output-on-failure
}

run_tsan() {
  CXX=clang++-14 cmake -S . -B "$tsan_dir" "${common[@]}" -DTORCHPATCH_BUILD_TESTS=ON -DTORCHPATCH_TSAN=ON
  cmake --build "$tsan_dir" --target torchpatch_tests
  TORCHPATCH_CACHE_DIR="$PWD/$tsan_dir/test-cache" \
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
    "$tsan_dir/bin/torchpatch_tests" "[threads]"
}

case $mode in
  asan) run_asan ;;
  tsan) run_tsan ;;
  fuzz) run_fuzz ;;
  all) start=$SECONDS; run_asan; echo "sanitize: asan took $((SECONDS - start)) s"
       start=$SECONDS; run_tsan; echo "sanitize: tsan took $((SECONDS - start)) s" ;;
  *) echo "usage: scripts/sanitize.sh [asan|tsan|fuzz|all]" >&2; exit 2 ;;
esac

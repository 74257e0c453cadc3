#!/usr/bin/env bash
# The CUDA check, run on a GPU machine from the repository root: builds torchpatch with CUDA, runs
# the [cuda] tests, and benchmarks an 8B-shaped Llama against Hugging Face transformers on the GPU.
#
# The machine it is written for: Ubuntu 24.04, LibTorch from the torch wheel in a Python venv
# (/opt/torch/.venv, with cmake, ninja and transformers), nvcc, g++; nothing can be downloaded there,
# so the libraries it lacks come prepared by scripts/gpu-deps.sh in build/gpu-deps (carried along
# with the working tree). Every stage is timed and bounded, so that the whole fits in 8 minutes
# (GPU_CHECK_BUDGET_S); a stage that fails stops only the stages that need it, and whatever was
# measured is still written. Results go to $OUT (build-gpu/out when unset):
#   summary.txt          one line per stage: seconds and outcome; the last line is the verdict
#   env.txt              GPU, driver, toolchain and library versions
#   configure.log, build.log (its last lines), cuda-tests.txt
#   bench-torchpatch.json / .log, bench-transformers.json / .log, gpu-bench.md (the two side by side)
# Exit status: 0 when every stage passed.
#
# Settings (environment):
#   TORCH_VENV           the venv holding torch, cmake, ninja, transformers (default /opt/torch/.venv)
#   GPU_CHECK_BUDGET_S   seconds for the whole run (default 470)
#   GPU_CHECK_JOBS       parallel compile jobs (default: the number of cores)
#   GPU_CHECK_ARCHS      TORCHPATCH_CUDA_ARCHITECTURES (default 90-real: H100/H200 only, to compile once)
#   GPU_CHECK_CMAKE_ARGS more CMake arguments (split at spaces), after the script's own
#   GPU_CHECK_PRESET     the model benchmarked (default llama3-8b); GPU_CHECK_CHECKPOINT where it is saved
#   BENCH_PROMPT_LEN, BENCH_DECODE_TOKENS, BENCH_REPEATS   (default 512, 128, 3)
#   ICU_LIB_DIR          where the machine's ICU libraries are (default /usr/lib/x86_64-linux-gnu)
# To rehearse the stages after the build on a machine without a GPU, with a tree built there:
#   GPU_CHECK_BUILD_DIR=build GPU_CHECK_REUSE_BUILD=1 GPU_CHECK_DEVICE=cpu GPU_CHECK_PRESET=tiny-llama \
#   BENCH_PROMPT_LEN=16 BENCH_DECODE_TOKENS=8 TORCH_VENV=<a venv with torch and transformers> scripts/gpu-check.sh
#   GPU_CHECK_BUILD_DIR  the build tree (default build-gpu)
#   GPU_CHECK_REUSE_BUILD=1  skip configure and build: use the build tree as it is
#   GPU_CHECK_DEVICE     the device the benches run on (default cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

out=${OUT:-build-gpu/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${GPU_CHECK_BUILD_DIR:-build-gpu}
[[ $build == /* ]] || build=$root/$build
device=${GPU_CHECK_DEVICE:-cuda}
deps=$root/build/gpu-deps
venv=${TORCH_VENV:-/opt/torch/.venv}
budget=${GPU_CHECK_BUDGET_S:-470}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
archs=${GPU_CHECK_ARCHS:-90-real}
preset=${GPU_CHECK_PRESET:-llama3-8b}
checkpoint=${GPU_CHECK_CHECKPOINT:-/tmp/$preset}
prompt_len=${BENCH_PROMPT_LEN:-512}
decode_tokens=${BENCH_DECODE_TOKENS:-128}
repeats=${BENCH_REPEATS:-3}
icu_lib_dir=${ICU_LIB_DIR:-/usr/lib/x86_64-linux-gnu}
table_reserve=20  # seconds kept back so that the table is written whatever ran out of time

python=$venv/bin/python
cmake=$venv/bin/cmake
ninja=$venv/bin/ninja
[[ -x $cmake ]] || cmake=$(command -v cmake || echo cmake)
[[ -x $ninja ]] || ninja=$(command -v ninja || echo ninja)
nvcc=${CUDACXX:-$(command -v nvcc || true)}
if [[ -z $nvcc ]]; then
  for candidate in /usr/local/cuda/bin/nvcc /usr/local/cuda-13*/bin/nvcc; do
    [[ -x $candidate ]] && { nvcc=$candidate; break; }
  done
fi
# The carried shared libraries ({fmt}, Sleef): the build tree's RUNPATH names them too, this covers
# anything started otherwise.
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ -n $nvcc ]]; then
  PATH=$(dirname "$nvcc"):$PATH
  export PATH
fi
# Nothing outside can be reached: transformers must not wait on the hub for files it can do without.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export root out build device deps venv jobs archs preset checkpoint prompt_len decode_tokens repeats icu_lib_dir \
       python cmake ninja nvcc

start_all=$(date +%s.%N)
deadline=$(awk -v s="$start_all" -v b="$budget" 'BEGIN {printf "%d", s + b}')
summary=()
failed=()
: >"$out/summary.txt"

note() { echo "$*" | tee -a "$out/summary.txt"; }

# stage NAME CAP FUNCTION: runs FUNCTION for at most CAP seconds (less if the budget has less left),
# prints and records its time and outcome. Returns FUNCTION's status (124: out of time).
stage() {
  local name=$1 cap=$2 fn=$3 reserve=$table_reserve
  [[ $name == table ]] && reserve=0
  local left=$(( deadline - reserve - $(date +%s) ))
  if (( left < 5 )); then
    summary+=("$name skipped (out of time)")
    failed+=("$name")
    note "== $name: skipped, out of time"
    return 1
  fi
  local limit=$(( cap < left ? cap : left ))
  echo "== $name (at most ${limit}s)"
  local t0 rc=0
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$limit" bash -euo pipefail -c "$fn" || rc=$?
  local took
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  local outcome=ok
  if (( rc == 124 || rc == 137 )); then
    outcome="FAILED (out of time after ${limit}s)"
  elif (( rc != 0 )); then
    outcome="FAILED (exit $rc)"
  fi
  [[ $outcome == ok ]] || failed+=("$name")
  summary+=("$name ${took}s $outcome")
  note "== $name: ${took}s, $outcome"
  return $rc
}

skip() {  # skip NAME WHY
  summary+=("$1 skipped ($2)")
  note "== $1: skipped, $2"
}

# (a) The machine: GPU, driver, toolchain; and whether what the build needs is there.
info() {
  {
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm,clocks.max.memory --format=csv || true
    echo "nvcc: ${nvcc:-not found}"
    [[ -z $nvcc ]] || "$nvcc" --version | tail -n 2 || true
    echo "cmake: $("$cmake" --version | head -n 1); ninja $("$ninja" --version); $(g++ --version | head -n 1)" || true
    "$python" -c 'import sys, torch, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}), transformers {transformers.__version__}")
print(f"torch sees {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")' || true
    echo "ICU libraries: $(ls "$icu_lib_dir"/libicuuc.so.* "$icu_lib_dir"/libicui18n.so.* 2>/dev/null | tr '\n' ' ')"
    echo "build/gpu-deps:"; sed 's/^/  /' "$deps/MANIFEST" 2>/dev/null || echo "  missing"
  } 2>&1 | tee "$out/env.txt"
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
  if [[ ${GPU_CHECK_REUSE_BUILD:-} != 1 ]]; then
    [[ -f $deps/MANIFEST ]] || { echo "build/gpu-deps is missing: run scripts/gpu-deps.sh where it can download, and carry build/gpu-deps" >&2; return 1; }
    [[ -n $nvcc ]] || { echo "no nvcc found (PATH, /usr/local/cuda*/bin; or set CUDACXX)" >&2; return 1; }
  fi
  [[ $device == cpu ]] || "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no GPU")'
}

# (b) Configure. LibTorch is the venv's torch package; the other packages are the carried ones, each
# named by its CMake package directory so that no copy of the machine's own (Catch2 v3, nlohmann-json)
# is picked instead. ICU: the carried headers of the machine's ICU version, and its libraries, which
# have no unversioned libicuuc.so (no libicu-dev there). Gloo: headers only (-I), LibTorch holds Gloo.
configure() {
  local torch_dir icu_major extra=()
  read -ra extra <<<"${GPU_CHECK_CMAKE_ARGS:-}"
  torch_dir=$("$python" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
  icu_major=$(sed -n 's/^#define U_ICU_VERSION_MAJOR_NUM \([0-9]*\)$/\1/p' "$deps/usr/include/unicode/uvernum.h")
  for lib in libicuuc libicui18n; do
    [[ -f $icu_lib_dir/$lib.so.$icu_major ]] || { echo "$icu_lib_dir/$lib.so.$icu_major is missing: the carried ICU headers are version $icu_major" >&2; return 1; }
  done
  "$cmake" -S "$root" -B "$build" -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
    -DCMAKE_BUILD_TYPE=Release \
    -DTORCHPATCH_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")" \
    -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTORCHPATCH_CUDA_ARCHITECTURES="$archs" \
    -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DTORCHPATCH_BUILD_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$torch_dir;$deps/usr" \
    -Dfmt_DIR="$deps/usr/lib/x86_64-linux-gnu/cmake/fmt" \
    -Dnlohmann_json_DIR="$deps/usr/share/cmake/nlohmann_json" \
    -DCLI11_DIR="$deps/usr/share/cmake/CLI11" \
    -DCatch2_DIR="$deps/usr/lib/cmake/Catch2" \
    -DICU_ROOT="$deps/usr" \
    -DICU_INCLUDE_DIR="$deps/usr/include" \
    -DICU_UC_LIBRARY_RELEASE="$icu_lib_dir/libicuuc.so.$icu_major" \
    -DICU_I18N_LIBRARY_RELEASE="$icu_lib_dir/libicui18n.so.$icu_major" \
    -DSLEEF_LIBRARY="$deps/usr/lib/x86_64-linux-gnu/libsleef.so.3" \
    -DGLOO_INCLUDE_DIR="$deps/gloo/include" \
    "${extra[@]}" 2>&1 | tee "$out/configure.log"
}

# (c) Build what the checks run: the CLI, the test program, the bundled plugins.
build_targets() {
  local rc=0
  "$cmake" --build "$build" --parallel "$jobs" --target torchpatch torchpatch_tests torchpatch_plugins \
    >"$build/build.log" 2>&1 || rc=$?
  tail -n 400 "$build/build.log" >"$out/build.log"
  if (( rc != 0 )); then
    echo "build failed; its errors:" >&2
    grep -E -A3 'error|Error|FAILED' "$build/build.log" | head -n 80 >&2 || tail -n 40 "$build/build.log" >&2
  else
    tail -n 1 "$build/build.log"
  fi
  return $rc
}

# (d) The CUDA tests (Catch2 v2 tag selection).
cuda_tests() {
  TORCHPATCH_CACHE_DIR=$build/test-cache "$build/bin/torchpatch_tests" "[cuda]" --reporter compact 2>&1 |
    tee "$out/cuda-tests.txt"
  ! grep -q "No test cases matched" "$out/cuda-tests.txt"
}

# (e) The bench: a checkpoint of the preset (random weights, saved once per machine), torchpatch's
# bench on it, transformers' on the same files.
save_checkpoint() {
  if [[ -f $checkpoint.complete ]]; then
    echo "reusing $checkpoint (saved by an earlier run on this machine)"
    return 0
  fi
  rm -rf "$checkpoint" "$checkpoint.complete"
  "$build/bin/torchpatch" save --preset "$preset" --dtype bfloat16 --output "$checkpoint" --quiet
  du -sh "$checkpoint"
  touch "$checkpoint.complete"
}

bench_torchpatch() {
  local on=(--device "$device")
  [[ $device != cpu ]] || on=()  # the default, and a CPU-only build may not know --device
  "$build/bin/torchpatch" bench --model "$checkpoint" "${on[@]}" --dtype bfloat16 --no-fused --no-eager-attention --prompt-len "$prompt_len" \
    --decode-tokens "$decode_tokens" --repeats "$repeats" --json >"$out/bench-torchpatch.json" 2>"$out/bench-torchpatch.log" ||
    { tail -n 30 "$out/bench-torchpatch.log" >&2; return 1; }
  tail -n 5 "$out/bench-torchpatch.log"
}

bench_transformers() {
  "$python" "$root/scripts/gpu_bench_transformers.py" --model "$checkpoint" --device "$device" --dtype bfloat16 \
    --prompt-len "$prompt_len" --decode-tokens "$decode_tokens" --repeats "$repeats" \
    >"$out/bench-transformers.json" 2>"$out/bench-transformers.log" ||
    { tail -n 30 "$out/bench-transformers.log" >&2; return 1; }
  grep -v "Loading weights" "$out/bench-transformers.log" | tail -n 5
}

table() {
  local gpu
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  "$python" "$root/scripts/gpu_bench_table.py" --torchpatch "$out/bench-torchpatch.json" \
    --transformers "$out/bench-transformers.json" ${gpu:+--gpu "$gpu"} --output "$out/gpu-bench.md"
}
export -f info configure build_targets cuda_tests save_checkpoint bench_torchpatch bench_transformers table

rm -f "$out"/bench-torchpatch.json "$out"/bench-transformers.json "$out"/gpu-bench.md "$out"/cuda-tests.txt
built=no
if ! stage info 60 info; then
  skip configure "the machine lacks what the build needs"
  skip build "not configured"
elif [[ ${GPU_CHECK_REUSE_BUILD:-} == 1 ]]; then
  skip configure "GPU_CHECK_REUSE_BUILD=1"
  skip build "GPU_CHECK_REUSE_BUILD=1: $build as it is"
  built=yes
elif stage configure 150 configure; then
  stage build 360 build_targets && built=yes
else
  skip build "configure failed"
fi
if [[ $built == yes ]]; then
  stage cuda-tests 150 cuda_tests || true
  if stage save-checkpoint 180 save_checkpoint; then
    stage bench-torchpatch 180 bench_torchpatch || true
    stage bench-transformers 180 bench_transformers || true
  else
    skip bench-torchpatch "no checkpoint"
    skip bench-transformers "no checkpoint"
  fi
else
  for s in cuda-tests save-checkpoint bench-torchpatch bench-transformers; do skip "$s" "not built"; done
fi
stage table 30 table || true

total=$(awk -v a="$start_all" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
tests_line=$(grep -E '^(Passed|Failed|No test cases)' "$out/cuda-tests.txt" 2>/dev/null | tail -n 1 || true)
verdict=ok
if (( ${#failed[@]} > 0 )); then
  verdict="FAILED (${failed[*]})"
fi
{
  printf '%s\n' "${summary[@]}"
  [[ -n $tests_line ]] && echo "cuda tests: $tests_line"
  line=$(printf '%s, ' "${summary[@]}")
  echo "gpu-check: $verdict in ${total}s: ${line%, }; results in $out"
} >"$out/summary.txt"
tail -n 1 "$out/summary.txt"
(( ${#failed[@]} == 0 ))

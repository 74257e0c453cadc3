#!/usr/bin/env bash
# Builds the llama.cpp that benchmarks compare torchpatch with, beside the project in the build tree
# (nothing system-wide): the llama.cpp that PyPI's llama-cpp-python sdist vendors (vendor/llama.cpp),
# pinned to one release and checked against its SHA-256, so every machine builds the same source
# without git or GitHub. Only the CPU backend, tuned for this machine (GGML_NATIVE), static, with
# OpenMP where the compiler has it; only three programs are built:
#   llama-bench       prompt-processing (pp) and generation (tg) throughput
#   llama-completion  runs a prompt non-interactively and prints the continuation (-no-cnv; greedy
#                     with --temp 0 --top-k 1). This llama.cpp's llama-cli is a chat front end over
#                     the server code (a target only with LLAMA_BUILD_SERVER, which stays off here);
#                     llama-completion is the plain prompt runner that llama-cli used to be.
#   llama-quantize    makes GGUF files of other quantization types
# A finished build is stamped with the release; rerunning the script then does nothing.
# Needs cmake, a C/C++ compiler and python3 (Ninja is used if present); the network only for PyPI.
#   TORCHPATCH_DEPS_DIR  where it goes (default: build/_deps): the source in llama.cpp/src, the build
#                        in llama.cpp/build, the programs in llama.cpp/build/bin
#   TORCHPATCH_LLAMA_CPU native (default): tuned for this machine; avx2: for an x86 machine with AVX2,
#                        FMA, F16C and BMI2 but no AVX-512 or AVX-VNNI (in llama.cpp/build-avx2), the
#                        baseline that `torchpatch bench --quant-kernel avx2` is compared with on a
#                        machine that has AVX-512
set -euo pipefail
cd "$(dirname "$0")/.."
deps=${TORCHPATCH_DEPS_DIR:-build/_deps}
mkdir -p "$deps"
deps=$(cd "$deps" && pwd)

# llama-cpp-python 0.3.36, the newest 0.3.x on PyPI when this was pinned; its sdist vendors llama.cpp
# commit 0c1e57098bba (ggml 0.25.3).
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

root=$deps/llama.cpp
src=$root/src
cpu=${TORCHPATCH_LLAMA_CPU:-native}
case $cpu in
  native) build=$root/build; stamp=$root/installed
          cpu_flags=(-DGGML_NATIVE=ON) ;;
  avx2)   build=$root/build-avx2; stamp=$root/installed-avx2
          cpu_flags=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                     -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF
                     -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF) ;;
  *) echo "build-llama-cpp: TORCHPATCH_LLAMA_CPU=$cpu is not a CPU level this script builds for." \
          "Fix: set it to native or avx2." >&2
     exit 2 ;;
esac
targets=(llama-bench llama-completion llama-quantize)

report() {
  local commit ggml
  commit=$(cat "$root/commit" 2>/dev/null || echo unknown)
  ggml=$(sed -nE 's/^set\(GGML_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)\).*/\2/p' "$src/ggml/CMakeLists.txt" |
         paste -sd.)
  echo "llama.cpp from llama-cpp-python $version: commit $commit, ggml $ggml, CPU level $cpu"
  local target
  for target in "${targets[@]}"; do
    echo "  $build/bin/$target"
  done
}

binaries_exist() {
  local target
  for target in "${targets[@]}"; do
    [[ -x $build/bin/$target ]] || return 1
  done
}

if [[ -f $stamp && $(cat "$stamp") == "llama-cpp-python $version $sha256" ]] && binaries_exist; then
  echo "build-llama-cpp: llama.cpp of llama-cpp-python $version is already built; nothing to do"
  report
  exit 0
fi
rm -f "$stamp"

# The source: extracted afresh unless it is this release's (a build cut short resumes where it stopped).
if [[ ! -f $src/.sdist || $(cat "$src/.sdist") != "$sha256" ]]; then
  # pip only downloads here; where the system's Python has none (Debian's python3 without
  # python3-pip), a virtual environment brings it.
  pip=(python3 -m pip)
  if ! python3 -m pip --version >/dev/null 2>&1; then
    [[ -x $deps/pip/bin/python ]] || python3 -m venv "$deps/pip"
    pip=("$deps/pip/bin/python" -m pip)
  fi
  echo "build-llama-cpp: downloading llama-cpp-python $version's sdist from PyPI" >&2
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  "${pip[@]}" download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
    "llama-cpp-python==$version" -d "$download" >&2
  sdist=$download/llama_cpp_python-$version.tar.gz
  got=$(sha256sum "$sdist" | cut -d' ' -f1)
  if [[ $got != "$sha256" ]]; then
    echo "build-llama-cpp: llama_cpp_python-$version.tar.gz has SHA-256 $got, not $sha256: not the" \
         "source this script pins. Fix: pin the version and SHA-256 of the sdist you mean to build." >&2
    exit 1
  fi
  rm -rf "$root" && mkdir -p "$src"
  # vendor/llama.cpp without its .git (a link into the sdist's .git/modules, which is not extracted);
  # the commit it is checked out at is in that module's HEAD.
  python3 - "$sdist" "llama_cpp_python-$version" "$src" "$root/commit" <<'PY'
import sys, tarfile
sdist, top, dest, commit_file = sys.argv[1:]
inside = top + "/vendor/llama.cpp/"
with tarfile.open(sdist) as tar:
    members = []
    for member in tar.getmembers():
        if member.name == top + "/.git/modules/vendor/llama.cpp/HEAD":
            head = tar.extractfile(member).read().decode().strip()
            with open(commit_file, "w") as f:
                f.write(head[:12] + "\n")
        if member.name.startswith(inside) and member.name != inside + ".git":
            member.name = member.name[len(inside):]
            members.append(member)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members, filter="data")
    else:
        tar.extractall(dest, members)
PY
  rm -rf "$download"
  trap - EXIT
  echo "$sha256" >"$src/.sdist"
fi
commit=$(cat "$root/commit" 2>/dev/null || echo unknown)

# The source has no .git: git must not find torchpatch's repository above it and take its commit for
# llama.cpp's (build info is read at configure time, which the build may rerun).
export GIT_CEILING_DIRECTORIES=$root

generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi
if [[ -f $build/CMakeCache.txt ]] &&
   ! grep -qx "CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
# GGML_OPENMP: used if the compiler has OpenMP (ggml falls back to its own threads otherwise, and says
# so); never fetched. LLAMA_OPENSSL off: nothing here downloads models. Examples are not needed.
cmake -S "$src" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  "${cpu_flags[@]}" \
  -DGGML_OPENMP=ON -DGGML_OPENMP_FETCH=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_COMMIT="${commit:0:7}"
echo "build-llama-cpp: OpenMP $(sed -n 's/^GGML_OPENMP_ENABLED:INTERNAL=//p' "$build/CMakeCache.txt")" >&2
cmake --build "$build" --target "${targets[@]}" -j"$(nproc)"

binaries_exist
echo "llama-cpp-python $version $sha256" >"$stamp"
report

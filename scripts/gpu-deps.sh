#!/usr/bin/env bash
# Prepares build/gpu-deps/: the libraries and headers torchpatch needs that the GPU machine lacks,
# for scripts/gpu-check.sh to build against there. That machine (Ubuntu 24.04, LibTorch from its
# Python venv, nothing downloadable) has Boost 1.83's headers, ICU 74's libraries without headers,
# and no CLI11, no Catch2 v2 (Ubuntu's Catch2 is v3), no Gloo headers, no Sleef. Everything it gets
# must travel with the working tree, whose whole size is capped: this keeps only what a build reads
# and refuses to finish above the budget.
#
# What goes in (pinned: each .deb is checked against its SHA-256):
#   ICU 74 headers     Ubuntu noble's libicu-dev 74.2 (the release pocket's, which stays in the
#                      archive for noble's life), the exact headers of the machine's libicu74: the
#                      C API is renamed per version (u_charAge_74, namespace icu_74), so headers of
#                      another ICU would not link. If archive.ubuntu.com cannot be reached, Debian
#                      bookworm's ICU 72 headers are used instead with unicode/uvernum.h rewritten to
#                      74 (torchpatch's ICU calls and Boost.Regex's exist unchanged in 74).
#   Catch2 2.13        headers and CMake package (the tests use catch2/catch.hpp, v2's single header)
#   CLI11 2.1, nlohmann-json 3.11, {fmt} 9.1 (headers, CMake package and libfmt.so.9)
#   Gloo headers       what LibTorch's ProcessGroupGloo.hpp includes; libtorch_cpu holds Gloo itself
#   libsleef.so.3      the library core/CMakeLists.txt links (no Sleef header is needed)
#
# Layout: build/gpu-deps/usr is a CMake prefix (include/, lib/..., share/cmake/); the Gloo headers sit
# apart in build/gpu-deps/gloo/include (given as GLOO_INCLUDE_DIR), so that their folder does not
# bring {fmt} 9 ahead of LibTorch's own {fmt} where torchpatch does not ask for it. No symbolic links (a
# carried tree may not keep them): each shared library is one file named by its soname.
#
# Idempotent: downloads are cached in build/_deps/gpu-debs and build/gpu-deps is rebuilt whole.
#   GPU_DEPS_ICU=debian   use the patched ICU 72 headers even when Ubuntu's archive is reachable
set -euo pipefail
cd "$(dirname "$0")/.."

dest=build/gpu-deps
cache=build/_deps/gpu-debs
limit_bytes=$((22 * 1024 * 1024))
debian=http://deb.debian.org/debian
ubuntu=http://archive.ubuntu.com/ubuntu

# name (the folder it unpacks to)  url  sha256
debs=(
  "catch2 $debian/pool/main/c/catch2/catch2_2.13.10-1_amd64.deb 0b32d3017609fecef1ecb0827729c2f3cda61332dd1f50da73ea9066fb4fc7ca"
  "cli11 $debian/pool/main/c/cli11/libcli11-dev_2.1.2+ds-1_all.deb f1f6ee9ec053e0e0bcec47345e241b6a8ee006321248b4329e9ce88d2b4b64a8"
  "fmt-dev $debian/pool/main/f/fmtlib/libfmt-dev_9.1.0+ds1-2_amd64.deb c8fa00dd0269e6eda9fd06668df3d720de4b5a1f647dcd3c6e0ba63f0cbf2150"
  "fmt $debian/pool/main/f/fmtlib/libfmt9_9.1.0+ds1-2_amd64.deb c3d405b6eabb1a521b60a57509826707f0e6f92b41cdfaae06bf1d7c37da2166"
  "json $debian/pool/main/n/nlohmann-json3/nlohmann-json3-dev_3.11.2-2_all.deb ec57940def6b6186c30be0e0ee81d1e58f86d11a54a145b28686a1e3e4aae801"
  "gloo $debian/pool/main/g/gloo/libgloo-dev_0.0~git20220518.5b14351-3_amd64.deb 80529c9fd8af452faf489e686b94bf87075965c40673803810c4f41634b1e299"
  "sleef $debian/pool/main/s/sleef/libsleef3_3.5.1-3_amd64.deb f919daeab44848eafbddbef1329bda78b2475aaecc641d755a6ff569eff4084d"
)
icu74=("$ubuntu/pool/main/i/icu/libicu-dev_74.2-1ubuntu3_amd64.deb" 18dc7c1730ad8006167f0e25289adc824b11b4cfce1baef0a1c1fb8dc044d945)
icu72=("$debian/pool/main/i/icu/libicu-dev_72.1-3+deb12u1_amd64.deb" 08bd4e3f4bd4fc725cf25e739edf0e7df5ac1826bdac9a7d990eea8f93b2d7a0)

die() { echo "gpu-deps: $*" >&2; exit 1; }
for tool in curl dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || die "needs $tool"
done

# fetch URL SHA256: the cached .deb's path on stdout, downloaded unless cached with that hash.
# Returns 1 when the download fails, 2 when what came is not the pinned file.
fetch() {
  local file
  file=$cache/$(basename "$1")
  if [[ -f $file ]] && echo "$2  $file" | sha256sum --check --status; then
    echo "$file"
    return 0
  fi
  mkdir -p "$cache"
  curl --fail --silent --show-error --location --retry 2 --connect-timeout 20 -o "$file.part" "$1" || return 1
  if ! echo "$2  $file.part" | sha256sum --check --status; then
    rm -f "$file.part"
    echo "gpu-deps: $(basename "$1") does not have the pinned SHA-256 $2" >&2
    return 2
  fi
  mv "$file.part" "$file"
  echo "$file"
}

stage=$dest.tmp
rm -rf "$stage"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/unpacked" "$stage/out/usr/include" "$stage/out/usr/lib/x86_64-linux-gnu/cmake" \
         "$stage/out/usr/lib/cmake" "$stage/out/usr/share/cmake" "$stage/out/gloo/include"
manifest=()
for entry in "${debs[@]}"; do
  read -r name url sha <<<"$entry"
  deb=$(fetch "$url" "$sha") || die "cannot get $url"
  dpkg-deb -x "$deb" "$stage/unpacked/$name"
  manifest+=("$(basename "$deb")")
done

icu_from=ubuntu
if [[ ${GPU_DEPS_ICU:-} == debian ]]; then
  icu_from=debian
elif deb=$(fetch "${icu74[@]}"); then
  :
else
  (( $? == 1 )) || die "refusing ICU headers that are not the pinned ones"
  echo "gpu-deps: Ubuntu's archive is unreachable: using ICU 72's headers rewritten as 74" >&2
  icu_from=debian
fi
if [[ $icu_from == debian ]]; then
  deb=$(fetch "${icu72[@]}") || die "cannot get ICU's headers"
fi
dpkg-deb -x "$deb" "$stage/unpacked/icu"
manifest+=("$(basename "$deb")")

u=$stage/unpacked
o=$stage/out/usr
lib=$o/lib/x86_64-linux-gnu

cp -r "$u/icu/usr/include/unicode" "$o/include/"
if [[ $icu_from == debian ]]; then
  # The version is all that names the symbols: U_ICU_VERSION_SUFFIX gives u_foo_74 and icu_74::,
  # the strings let FindICU report 74.
  sed -i -e 's/^#define U_ICU_VERSION_MAJOR_NUM 72$/#define U_ICU_VERSION_MAJOR_NUM 74/' \
         -e 's/^#define U_ICU_VERSION_MINOR_NUM 1$/#define U_ICU_VERSION_MINOR_NUM 2/' \
         -e 's/^#define U_ICU_VERSION_SUFFIX _72$/#define U_ICU_VERSION_SUFFIX _74/' \
         -e 's/^#define U_ICU_VERSION "72.1"$/#define U_ICU_VERSION "74.2"/' \
         -e 's/^#define U_ICU_VERSION_SHORT "72"$/#define U_ICU_VERSION_SHORT "74"/' \
         -e 's/^#define U_ICU_DATA_VERSION "72.1"$/#define U_ICU_DATA_VERSION "74.2"/' \
         "$o/include/unicode/uvernum.h"
  [[ $(grep -cE '^#define U_ICU_(VERSION_MAJOR_NUM 74|VERSION_SUFFIX _74|VERSION "74.2")' "$o/include/unicode/uvernum.h") == 3 ]] ||
    die "unicode/uvernum.h did not take the version rewrite"
fi

# Catch2: the header-only target only. Catch2WithMain's static library (1.7 MB) is not used, and
# dropping its -none targets file keeps CMake from checking that the library exists.
mkdir -p "$o/include/catch2" "$o/lib/cmake/Catch2"
cp "$u/catch2/usr/include/catch2/catch.hpp" "$o/include/catch2/"
for f in Catch2Config.cmake Catch2ConfigVersion.cmake Catch2Targets.cmake Catch.cmake CatchAddTests.cmake; do
  cp "$u/catch2/usr/lib/cmake/Catch2/$f" "$o/lib/cmake/Catch2/"
done

cp -r "$u/cli11/usr/include/CLI" "$o/include/"
cp -r "$u/cli11/usr/share/cmake/CLI11" "$o/share/cmake/"

cp -r "$u/json/usr/include/nlohmann" "$o/include/"
cp -r "$u/json/usr/share/cmake/nlohmann_json" "$o/share/cmake/"

# {fmt}: the library under its soname (what the loader looks for), and the CMake package told so.
cp -r "$u/fmt-dev/usr/include/fmt" "$o/include/"
cp -r "$u/fmt-dev/usr/lib/x86_64-linux-gnu/cmake/fmt" "$o/lib/x86_64-linux-gnu/cmake/"
cp "$u/fmt/usr/lib/x86_64-linux-gnu/libfmt.so.9.1.0" "$lib/libfmt.so.9"
sed -i 's|/libfmt\.so\.9\.1\.0"|/libfmt.so.9"|' "$lib/cmake/fmt/fmt-targets-none.cmake"
grep -q '/libfmt.so.9"' "$lib/cmake/fmt/fmt-targets-none.cmake" || die "fmt-targets-none.cmake did not take the rename"

cp "$u/sleef/usr/lib/x86_64-linux-gnu/libsleef.so.3.5.1" "$lib/libsleef.so.3"

cp -r "$u/gloo/usr/include/gloo" "$stage/out/gloo/include/"

{
  echo "# build/gpu-deps, made by scripts/gpu-deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "icu_headers=$icu_from"
  printf '%s\n' "${manifest[@]}"
} >"$stage/out/MANIFEST"

links=$(find "$stage/out" -type l | head -3)
[[ -z $links ]] || die "symbolic links left in the tree: $links"
bytes=$(find "$stage/out" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
files=$(find "$stage/out" -type f | wc -l)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
if (( bytes > limit_bytes )); then
  rm -rf "$stage"
  die "the dependencies come to $mib MiB ($files files), over the budget of $((limit_bytes / 1048576)) MiB; $dest left as it was"
fi

rm -rf "$dest"
mv "$stage/out" "$dest"
rm -rf "$stage"
echo "gpu-deps: $dest: $mib MiB in $files files (ICU 74 headers from $icu_from)"

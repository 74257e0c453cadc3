#!/usr/bin/env bash
# The plugin author's and the host author's kits, end to end: install this build into a fresh
# prefix, build examples/first_plugin and examples/embed_host against the installed package as
# outside projects do, run the installed CLI with the plugin, and run the host, which finds the
# installed bundled plugins by itself.
#
# usage: install_examples.sh BUILD_DIR EXAMPLES_SOURCE_DIR LLAMA_CHECKPOINT_DIR CMAKE
set -euo pipefail

build_dir=$1 examples_dir=$2 checkpoint=$3 cmake=$4

work=$(mktemp -d "${TMPDIR:-/tmp}/torchpatch-install-test.XXXXXX")
# `cmake --install` writes install_manifest.txt into the build tree: put back whatever was there.
manifest=$build_dir/install_manifest.txt
if [[ -f $manifest ]]; then cp -p "$manifest" "$work/install_manifest.txt.saved"; fi
cleanup() {
  if [[ -f $work/install_manifest.txt.saved ]]; then mv -f "$work/install_manifest.txt.saved" "$manifest"; else rm -f "$manifest"; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
prefix=$work/prefix plugin_build=$work/first_plugin-build
unset TORCHPATCH_PLUGIN_PATH CMAKE_PREFIX_PATH

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# expect_line TEXT FIXED_STRING [COUNT]: FIXED_STRING occurs on COUNT lines of TEXT (at least one by default).
expect_line() {
  local n
  n=$(grep -cF -- "$2" <<<"$1" || true)
  if [[ -z ${3:-} && $n -lt 1 ]] || [[ -n ${3:-} && $n -ne $3 ]]; then
    printf '%s\n' "$1" >&2
    fail "expected ${3:-some} line(s) with '$2', found $n (output above)"
  fi
}

echo "== cmake --install $build_dir --prefix $prefix"
"$cmake" --install "$build_dir" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install"; }

for f in bin/torchpatch lib/libtorchpatch_core.so lib/libtorchpatch_host.so \
         lib/torchpatch/plugins/fused_qkv_attention.so lib/torchpatch/plugins/custom_llama_attention.so \
         include/torchpatch/plugin_api.h include/torchpatch/plugin_host.h include/torchpatch/models/llama.h \
         lib/cmake/torchpatch/torchpatchConfig.cmake lib/cmake/torchpatch/torchpatchConfigVersion.cmake \
         lib/cmake/torchpatch/torchpatchTargets.cmake lib/cmake/torchpatch/TorchpatchPlugin.cmake \
         lib/cmake/torchpatch/TorchpatchLibTorch.cmake; do
  [[ -f $prefix/$f ]] || fail "not installed: $f"
done
# Nothing else: no tests, test plugins, examples or benchmarks.
stray=$(cd "$prefix" && find . -type f \
  ! -path './bin/torchpatch' ! -path './include/torchpatch/*' ! -path './lib/libtorchpatch_core.so' \
  ! -path './lib/libtorchpatch_host.so' ! -path './lib/libtorchpatch_cuda.so' ! -path './lib/torchpatch/plugins/*.so' ! -path './lib/cmake/torchpatch/*.cmake')
[[ -z $stray ]] || fail "unexpected files installed: $stray"
if find "$prefix" -name 'testplugin_*' | grep -q .; then fail "test plugins installed"; fi

cli=$prefix/bin/torchpatch
# The installed CLI runs on the installed libraries, not on the build tree's.
for lib in libtorchpatch_core.so libtorchpatch_host.so; do
  resolved=$(ldd "$cli" | awk -v lib="$lib" '$1 == lib { print $3 }')
  [[ -n $resolved && $(realpath "$resolved") == $(realpath "$prefix/lib/$lib") ]] \
    || fail "the installed CLI loads $lib from '$resolved'"
done

echo "== configure and build examples/first_plugin against $prefix"
# The examples are compiled as their package was: a sanitized package needs its compiler's runtime.
compiler=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
toolchain=(-DCMAKE_CXX_COMPILER="$compiler")
if command -v ccache >/dev/null; then
  # Paths under $work are made relative, so a rerun of this test hits the cache.
  export CCACHE_BASEDIR=$work
  toolchain+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
"$cmake" -S "$examples_dir/first_plugin" -B "$plugin_build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${toolchain[@]}" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configuring the example"; }
found=$(grep '^torchpatch_DIR:' "$plugin_build/CMakeCache.txt")
[[ $found == "torchpatch_DIR:PATH=$prefix/lib/cmake/torchpatch" ]] || fail "torchpatch found elsewhere: $found"
"$cmake" --build "$plugin_build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building the example"; }
plugin=$plugin_build/first_plugin.so
[[ -f $plugin ]] || fail "no $plugin"
# torchpatch_add_plugin's settings and the definitions the package passes on to plugins.
compile=$(grep -F '"command"' "$plugin_build/compile_commands.json")
# LibTorch's C++ ABI define, where its CMake target carries one (1.13's does; 2.x uses the compiler's
# default ABI and names none): the plugin must be compiled with the host's.
abi=$(grep -o -m1 -- '-D_GLIBCXX_USE_CXX11_ABI=[01]' "$build_dir/build.ninja" || true)
for flag in -fvisibility=hidden -fvisibility-inlines-hidden -DBOOST_DLL_USE_STD_FS ${abi:+"$abi"}; do
  expect_line "$compile" " $flag" 1
done
exported=$(nm -D --defined-only "$plugin")
expect_line "$exported" " torchpatch_plugin_descriptor" 1
expect_line "$exported" " torchpatch_plugin_register" 1

echo "== $cli plugins --plugin-dir $plugin_build"
out=$("$cli" plugins --plugin-dir "$plugin_build")
echo "$out"
expect_line "$out" "loaded    first-plugin 0.1.0  [drop-in]  $plugin" 1
expect_line "$out" "class MyLlamaMLP (role Mlp) for LlamaMLP" 1
# The bundled plugins are the installed ones.
expect_line "$out" "loaded    fused-qkv-attention 1.0.0  [bundled]  $prefix/lib/torchpatch/plugins/fused_qkv_attention.so" 1
expect_line "$out" "loaded    custom-llama-attention 1.0.0  [bundled]  $prefix/lib/torchpatch/plugins/custom_llama_attention.so" 1
if grep -qE '^(refused|duplicate)' <<<"$out"; then fail "a plugin was refused"; fi

echo "== $cli plan --preset tiny-llama --plugin-dir $plugin_build"
out=$("$cli" plan --preset tiny-llama --plugin-dir "$plugin_build" --strict)
echo "$out"
expect_line "$out" "LlamaMLP -> MyLlamaMLP  [exact key; plugin first-plugin 0.1.0 ($plugin)]" 2
expect_line "$out" "2 of 27 patch points replaced" 1  # 12 blocks and 15 projections

echo "== $cli run --preset tiny-llama --prompt-ids 1,2,3 --plugin-dir $plugin_build"
plain=$("$cli" run --preset tiny-llama --prompt-ids 1,2,3)
patched=$("$cli" run --preset tiny-llama --prompt-ids 1,2,3 --plugin-dir "$plugin_build" --strict)
echo "$patched"
expect_line "$patched" "MyLlamaMLP: tokens=6 (2 modules)" 1  # 3 tokens through each of 2 layers
[[ $(grep -v '^MyLlamaMLP: ' <<<"$patched") == "$plain" ]] || { echo "$plain"; fail "the plugin changed the predictions"; }

echo "== $cli run --model llama_basic --inputs reference.safetensors, with and without the plugin"
run=(run --model "$checkpoint" --inputs "$checkpoint/reference.safetensors")
plain=$("$cli" "${run[@]}" --output "$work/plain.safetensors")
patched=$("$cli" "${run[@]}" --output "$work/patched.safetensors" --plugin-dir "$plugin_build" --strict)
echo "$patched"
layers=$(grep -o '"num_hidden_layers": *[0-9]*' "$checkpoint/config.json" | grep -o '[0-9]*$')
[[ $(grep -F 'MyLlamaMLP: ' <<<"$patched") =~ ^MyLlamaMLP:\ tokens=[1-9][0-9]*\ \(([0-9]+)\ modules\)$ ]] \
  || fail "no MyLlamaMLP counter line"
[[ ${BASH_REMATCH[1]} == "$layers" ]] || fail "MyLlamaMLP built ${BASH_REMATCH[1]} times, the model has $layers layers"
# The same logits, bit for bit, and the same printed predictions.
cmp "$work/plain.safetensors" "$work/patched.safetensors" || fail "the plugin changed the logits"
[[ $(grep -v -e '^MyLlamaMLP: ' -e '^wrote ' <<<"$patched") == $(grep -v '^wrote ' <<<"$plain") ]] \
  || { echo "$plain"; fail "the plugin changed the predictions"; }

echo "== $cli verify --model llama_basic --plugin-dir $plugin_build"
out=$("$cli" verify --model "$checkpoint" --inputs "$checkpoint/reference.safetensors" --plugin-dir "$plugin_build" \
  --repeat 1) || { echo "$out"; fail "verify did not pass"; }
echo "$out"
expect_line "$out" "model.layers.0.mlp: LlamaMLP -> MyLlamaMLP" 1
expect_line "$out" "PASS" 1

echo "== configure and build examples/embed_host against $prefix"
host_build=$work/embed_host-build
"$cmake" -S "$examples_dir/embed_host" -B "$host_build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" "${toolchain[@]}" \
  >"$work/host-configure.log" 2>&1 || { cat "$work/host-configure.log"; fail "configuring the host"; }
expect_line "$(cat "$work/host-configure.log")" "bundled plugins in $prefix/lib/torchpatch/plugins" 1
"$cmake" --build "$host_build" >"$work/host-build.log" 2>&1 || { cat "$work/host-build.log"; fail "building the host"; }

echo "== $host_build/embed_host, run from elsewhere with no arguments"
out=$(cd "$work" && "$host_build/embed_host") || { echo "$out"; fail "the host failed"; }
echo "$out"
# It found the installed package's bundled plugins on its own, and replaced attention with one.
expect_line "$out" "loaded $prefix/lib/torchpatch/plugins/custom_llama_attention.so" 1
expect_line "$out" "model.layers.1.self_attn: LlamaAttention -> CustomLlamaAttention (plugin custom-llama-attention 1.0.0" 1

echo "PASS"

# The precompiled header: LibTorch's heavy headers (core/pch/torchpatch_pch.h), made once and reused (REUSE_FROM)
# by every target that includes LibTorch: libtorchpatch_core, the host library, the CLI, the plugins,
# the tests, the benchmarks. Parsing those headers is most of any file's compile time.
#
# A compiler takes a precompiled header only from a compile with the same flags that matter to it, so
# every target compiles with what it was made with (-fPIC and OpenMP everywhere: the top-level
# CMakeLists.txt) and defines nothing it lacks. Two kinds of target get a header of their own:
#   TORCHPATCH_PLUGIN_PCH  plugins, built with hidden visibility: declarations keep the visibility of
#                          the header they were parsed in (GCC takes the common one and the plugin then
#                          exports 90 LibTorch symbols instead of its two entry points; clang refuses it)
#   TORCHPATCH_CORE_PCH    libtorchpatch_core: in the fuzzer build, with the fuzzers' coverage
#
# The header is named in angle brackets, found through its folder (which libtorchpatch_core gives
# every target of the tree): CMake's generated wrapper then names no path of this checkout, and ccache
# serves the header and every file that uses it from one clone to the next.
function(torchpatch_add_pch name)
  add_library(${name} OBJECT ${PROJECT_SOURCE_DIR}/core/pch/torchpatch_pch.cpp)
  target_link_libraries(${name} PRIVATE torchpatch_libtorch nlohmann_json::nlohmann_json torchpatch::fmt)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/core/pch)
  target_compile_features(${name} PRIVATE cxx_std_17)
  target_precompile_headers(${name} PRIVATE <torchpatch_pch.h>)
endfunction()

torchpatch_add_pch(torchpatch_pch)
set(TORCHPATCH_CORE_PCH torchpatch_pch)
torchpatch_add_pch(torchpatch_plugin_pch)
set_target_properties(torchpatch_plugin_pch PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
set(TORCHPATCH_PLUGIN_PCH torchpatch_plugin_pch)
if(TORCHPATCH_BUILD_FUZZERS)
  torchpatch_add_pch(torchpatch_core_pch)
  target_compile_options(torchpatch_core_pch PRIVATE -fsanitize=fuzzer-no-link)
  set(TORCHPATCH_CORE_PCH torchpatch_core_pch)
endif()

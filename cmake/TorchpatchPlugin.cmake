# torchpatch_add_plugin(NAME SOURCES src... [OUTPUT_DIRECTORY dir])
# Builds a plugin: a MODULE library named NAME.so (no "lib" prefix), C++17, with hidden visibility so
# only its two entry points are exported, linked to torchpatch::plugin_api (the plugin API headers and
# libtorchpatch_core, with the compile options that make its descriptor match the host's: LibTorch's
# _GLIBCXX_USE_CXX11_ABI and BOOST_DLL_USE_STD_FS).
#
# The same file serves the source tree (plugins/, tests/plugins/) and the installed CMake package
# (find_package(torchpatch) includes it), so a plugin builds the same way inside and outside.
function(torchpatch_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "torchpatch_add_plugin(${name}): no SOURCES given")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE torchpatch::plugin_api)
  target_compile_features(${name} PRIVATE cxx_std_17)
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(DEFINED TORCHPATCH_PLUGIN_PCH)  # in torchpatch's own tree (cmake/TorchpatchPch.cmake)
    target_precompile_headers(${name} REUSE_FROM ${TORCHPATCH_PLUGIN_PCH})
    # The header holds {fmt}: the system's, as everywhere in the tree (CMakeLists.txt says why).
    target_link_libraries(${name} PRIVATE torchpatch::fmt)
  endif()
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED TORCHPATCH_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TORCHPATCH_PLUGIN_OUTPUT_DIR})
  endif()
endfunction()

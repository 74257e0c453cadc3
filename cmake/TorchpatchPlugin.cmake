# torchpatch_add_plugin(NAME SOURCES src... [OUTPUT_DIRECTORY dir])
# Builds a plugin: a MODULE library with hidden visibility, linked against libtorchpatch_core, named
# NAME.so (no "lib" prefix), so only its entry points are exported.
function(torchpatch_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE torchpatch::plugin_api)
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED TORCHPATCH_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TORCHPATCH_PLUGIN_OUTPUT_DIR})
  endif()
endfunction()

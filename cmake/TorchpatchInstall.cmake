# `cmake --install BUILD --prefix P`: what a user runs the CLI with and what a plugin author builds
# against.
#
#   P/bin/torchpatch                   the CLI (RPATH $ORIGIN/../lib)
#   P/lib/libtorchpatch_{core,host}.so
#   P/lib/libtorchpatch_cuda.so        CUDA builds: what --device cuda loads (core/CMakeLists.txt)
#   P/lib/torchpatch/plugins/*.so      the bundled plugins, where the host library looks for them
#                                      (torchpatch::bundled_plugin_dir(); torchpatch_PLUGIN_DIR in CMake)
#   P/include/torchpatch/...           the public headers (core, plugin API, host)
#   P/lib/cmake/torchpatch/            find_package(torchpatch): torchpatch::core, torchpatch::host,
#                                      torchpatch::plugin_api and torchpatch_add_plugin()
#
# The directories are fixed (not GNUInstallDirs' multiarch libdir) because the CLI finds its libraries
# and plugins relative to itself. Tests, test plugins, examples and benchmarks are not installed.
include(CMakePackageConfigHelpers)

set(TORCHPATCH_INSTALL_CMAKEDIR lib/cmake/torchpatch)

foreach(dir core plugin_api host)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION include)
endforeach()

set_target_properties(torchpatch_core PROPERTIES EXPORT_NAME core)
set_target_properties(torchpatch_host PROPERTIES EXPORT_NAME host)
set_target_properties(torchpatch_plugin_api PROPERTIES EXPORT_NAME plugin_api)
install(TARGETS torchpatch_core torchpatch_host torchpatch_plugin_api
  EXPORT torchpatchTargets
  LIBRARY DESTINATION lib)
install(TARGETS torchpatch RUNTIME DESTINATION bin)
if(TARGET torchpatch_cuda)
  install(TARGETS torchpatch_cuda LIBRARY DESTINATION lib)
endif()

# Every plugin built in plugins/ is a bundled plugin.
get_property(torchpatch_bundled_targets DIRECTORY ${PROJECT_SOURCE_DIR}/plugins PROPERTY BUILDSYSTEM_TARGETS)
foreach(target IN LISTS torchpatch_bundled_targets)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "MODULE_LIBRARY")
    # From lib/torchpatch/plugins, libtorchpatch_core is two levels up.
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../..")
    install(TARGETS ${target} LIBRARY DESTINATION lib/torchpatch/plugins)
  endif()
endforeach()

install(EXPORT torchpatchTargets NAMESPACE torchpatch:: DESTINATION ${TORCHPATCH_INSTALL_CMAKEDIR})

# The config pins the dependencies whose types cross the plugin boundary to the versions this build
# used (LibTorch, nlohmann_json), so a plugin cannot be compiled against other headers than the host's.
set(TORCHPATCH_INSTALL_PLUGINDIR lib/torchpatch/plugins)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/torchpatchConfig.cmake.in
  ${PROJECT_BINARY_DIR}/torchpatchConfig.cmake
  INSTALL_DESTINATION ${TORCHPATCH_INSTALL_CMAKEDIR}
  PATH_VARS TORCHPATCH_INSTALL_PLUGINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/torchpatchConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/torchpatchConfig.cmake
  ${PROJECT_BINARY_DIR}/torchpatchConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/TorchpatchPlugin.cmake
  ${PROJECT_SOURCE_DIR}/cmake/TorchpatchLibTorch.cmake
  DESTINATION ${TORCHPATCH_INSTALL_CMAKEDIR})

# LibTorch's CPU libraries as one target, torchpatch_libtorch: libtorch_cpu and libc10, their headers
# and the definitions their headers need. Torch_VERSION, TORCH_INSTALL_PREFIX and
# TORCHPATCH_LIBTORCH_HAS_CUDA (whether it holds libtorch_cuda) are set for the caller.
#
# Why not LibTorch's own TorchConfig: its `torch` target links every program to libtorch.so, which
# loads libtorch_cuda.so and with it cuBLAS, cuDNN and NCCL (0.9 s and 450 MB on every start, even for
# `--version`), and on a machine without the CUDA toolkit it cannot be configured at all. torchpatch's
# CPU code needs only libtorch_cpu and libc10; its CUDA code, in libtorchpatch_cuda, links the CUDA
# libraries through TorchConfig where the toolkit is present (core/CMakeLists.txt).
#
# The same file serves the installed package (torchpatchConfig.cmake), with TORCHPATCH_LIBTORCH_HINT set
# to the LibTorch this build used.
if(TORCHPATCH_LIBTORCH_HINT)  # the installed package: exactly the LibTorch it was built with
  find_library(TORCHPATCH_TORCH_CPU_LIBRARY torch_cpu PATHS "${TORCHPATCH_LIBTORCH_HINT}" PATH_SUFFIXES lib
               NO_DEFAULT_PATH)
else()
  # Also where LibTorch's own CMake files are named: Torch_DIR, or the wheel's torch/share/cmake.
  set(_torch_hints "")
  foreach(_dir IN LISTS Torch_DIR CMAKE_PREFIX_PATH)
    list(APPEND _torch_hints "${_dir}/../../lib" "${_dir}/../../../lib")
  endforeach()
  find_library(TORCHPATCH_TORCH_CPU_LIBRARY torch_cpu HINTS ${_torch_hints}
               DOC "LibTorch's libtorch_cpu (from CMAKE_PREFIX_PATH: PyPI's torch wheel's torch/ directory)")
endif()
if(NOT TORCHPATCH_TORCH_CPU_LIBRARY)
  message(FATAL_ERROR "LibTorch not found (no libtorch_cpu): give its prefix as CMAKE_PREFIX_PATH; "
                      "scripts/install-libtorch.sh installs LibTorch 2.11 from PyPI and prints that prefix")
endif()
get_filename_component(_torch_lib_dir "${TORCHPATCH_TORCH_CPU_LIBRARY}" DIRECTORY)
get_filename_component(TORCH_INSTALL_PREFIX "${_torch_lib_dir}" DIRECTORY)
if(_torch_lib_dir MATCHES "/lib/[^/]+-linux-gnu$")  # Debian's multiarch directory, /usr/lib/x86_64-linux-gnu
  get_filename_component(TORCH_INSTALL_PREFIX "${TORCH_INSTALL_PREFIX}" DIRECTORY)
endif()
find_library(TORCHPATCH_C10_LIBRARY c10 HINTS "${_torch_lib_dir}" NO_DEFAULT_PATH)
find_library(TORCHPATCH_C10_LIBRARY c10)
find_path(TORCHPATCH_TORCH_INCLUDE_DIR ATen/ATen.h HINTS "${TORCH_INSTALL_PREFIX}/include" NO_DEFAULT_PATH)
find_path(TORCHPATCH_TORCH_INCLUDE_DIR ATen/ATen.h)
find_path(TORCHPATCH_TORCH_API_INCLUDE_DIR torch/nn/module.h
          HINTS "${TORCHPATCH_TORCH_INCLUDE_DIR}/torch/csrc/api/include" NO_DEFAULT_PATH)
if(NOT TORCHPATCH_C10_LIBRARY OR NOT TORCHPATCH_TORCH_INCLUDE_DIR OR NOT TORCHPATCH_TORCH_API_INCLUDE_DIR)
  message(FATAL_ERROR "LibTorch at ${TORCH_INSTALL_PREFIX} is incomplete: libc10 '${TORCHPATCH_C10_LIBRARY}', "
                      "headers '${TORCHPATCH_TORCH_INCLUDE_DIR}', C++ API headers '${TORCHPATCH_TORCH_API_INCLUDE_DIR}'")
endif()

# The version, from the headers (2.x: torch/headeronly/version.h; 1.13: the C++ API's torch/version.h).
foreach(_header torch/headeronly/version.h torch/csrc/api/include/torch/version.h)
  if(EXISTS "${TORCHPATCH_TORCH_INCLUDE_DIR}/${_header}")
    file(STRINGS "${TORCHPATCH_TORCH_INCLUDE_DIR}/${_header}" _lines REGEX "define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" Torch_VERSION "${_lines}")
    break()
  endif()
endforeach()
if(NOT Torch_VERSION MATCHES "^[0-9]+\\.[0-9]+\\.[0-9]+$")
  message(FATAL_ERROR "LibTorch at ${TORCH_INSTALL_PREFIX}: no version found in its headers")
endif()

set(TORCHPATCH_LIBTORCH_HAS_CUDA OFF)
if(EXISTS "${_torch_lib_dir}/libtorch_cuda.so")
  set(TORCHPATCH_LIBTORCH_HAS_CUDA ON)
endif()

if(NOT TARGET torchpatch_libtorch)
  add_library(torchpatch_libtorch INTERFACE)
  target_include_directories(torchpatch_libtorch SYSTEM INTERFACE
    "${TORCHPATCH_TORCH_INCLUDE_DIR}" "${TORCHPATCH_TORCH_API_INCLUDE_DIR}")
  target_link_libraries(torchpatch_libtorch INTERFACE "${TORCHPATCH_TORCH_CPU_LIBRARY}" "${TORCHPATCH_C10_LIBRARY}")
  # What LibTorch's CMake files give libtorch_cpu's users: c10d's Gloo process group and the
  # distributed API are declared only under these.
  target_compile_definitions(torchpatch_libtorch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
endif()

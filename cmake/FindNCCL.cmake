# FindNCCL: NVIDIA's collective library, header and shared library.
#
#   find_package(NCCL [version] [REQUIRED])
#
# Looks in NCCL_ROOT (variable or environment), NCCL_HOME, the CUDA toolkit (the NVIDIA
# installers put nccl.h and libnccl.so beside the toolkit's own, /usr/local/cuda here) and the
# system paths (Debian's libnccl-dev). Sets NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIR and
# NCCL_LIBRARY, and defines the imported target NCCL::nccl (nccl.h includes cuda_runtime.h, so
# the target brings CUDA::cudart along when the CUDA toolkit has been found).
#
# loom's build uses it from CMakeLists.txt, and installs it beside loomConfig.cmake so that a
# program linking an installed loom finds the same library (cmake/loomConfig.cmake.in).

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_nccl_cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_hints ${_nccl_cuda_root})
endif()
list(APPEND _nccl_hints $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part}[ \t]+([0-9]+)" _ "${_nccl_version_lines}")
    set(_nccl_${part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  if(TARGET CUDA::cudart)
    set_property(TARGET NCCL::nccl APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
  endif()
endif()

unset(_nccl_hints)
unset(_nccl_cuda_root)
unset(_nccl_version_lines)

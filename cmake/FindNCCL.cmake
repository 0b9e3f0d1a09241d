# FindNCCL: locates nccl.h and libnccl (NCCL_ROOT, the CUDA toolkit, the
# system, then the nvidia.nccl pip wheel of python3).
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the
# imported target NCCL::nccl.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda
  PATH_SUFFIXES lib lib64)
# Not in the usual places: the pip wheel (nvidia-nccl-cu*) of the python3 on
# PATH, as in a PyTorch venv; it ships libnccl.so.2 without the libnccl.so link.
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_program(_nccl_python3 python3)
  if(_nccl_python3)
    execute_process(
      COMMAND ${_nccl_python3} -c "import nvidia.nccl as m; print(';'.join(m.__path__))"
      OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET TIMEOUT 20)
    if(_nccl_wheel)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_wheel} PATH_SUFFIXES include)
      find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_wheel} PATH_SUFFIXES lib lib64)
    endif()
  endif()
endif()
if(NCCL_INCLUDE_DIR AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_major REGEX "^#define NCCL_MAJOR")
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_minor REGEX "^#define NCCL_MINOR")
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_patch REGEX "^#define NCCL_PATCH")
  string(REGEX MATCH "[0-9]+" _nccl_major "${_nccl_major}")
  string(REGEX MATCH "[0-9]+" _nccl_minor "${_nccl_minor}")
  string(REGEX MATCH "[0-9]+" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION ${NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
endif()

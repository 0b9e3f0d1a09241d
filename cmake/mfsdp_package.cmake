# mfsdp_package: the installed libraries and how consumers find them
# (included from runtime/CMakeLists.txt once mfsdp_rt_obj exists).
#
# Components, so that a CPU trainer never sees CUDA:
#   libmfsdp.so / libmfsdp.a            the CPU backends (local, and mpi when
#                                       built with MPI); no CUDA symbol, flag or
#                                       dependency
#   libmfsdp_nccl.so / libmfsdp_nccl.a  the same API plus the NCCL and
#                                       cuda-local backends (CUDA builds only);
#                                       a GPU trainer links this one instead
# CMake: find_package(mfsdp CONFIG) gives mfsdp::mfsdp, mfsdp::mfsdp_static
# and, with MPI, mfsdp::mpi (mfsdp::mfsdp + MPI for trainers that include
# mfsdp_mpi.h); find_package(mfsdp CONFIG COMPONENTS nccl) adds mfsdp::nccl and
# mfsdp::nccl_static and is the only path that looks for CUDA and NCCL.
# pkg-config: mfsdp, mfsdp-static, mfsdp-mpi, and with CUDA mfsdp-nccl and
# mfsdp-nccl-static (docs/runtime.md, "Building against it", has the line for
# each case).
#
# Run-time lookup: installed outside the loader's default directories, a
# trainer needs an rpath. MFSDP_PC_RPATH (ON) puts -Wl,-rpath,<libdir> into
# the shared modules' Libs; every module also defines the variable `rpath`.
# mfsdp-mlp is installed with the rpath $ORIGIN/../<libdir>.

option(MFSDP_PC_RPATH "Add -Wl,-rpath,<libdir> to the pkg-config Libs of the shared libraries" ON)

# ---- the CPU objects ----
if(MFSDP_HAVE_CUDA)
  # The library without the GPU backends: the same sources compiled without
  # MFSDP_HAVE_CUDA (mf_rt.c then names no GPU backend).
  set(_mf_cpu_sources ${MFSDP_RT_SOURCES})
  list(FILTER _mf_cpu_sources EXCLUDE REGEX "((mf_backend_(nccl|cuda)|mf_cuda)[^/]*\\.c|\\.cu)$")
  set(_mf_cpu_defines ${MFSDP_RT_DEFINES})
  list(REMOVE_ITEM _mf_cpu_defines MFSDP_HAVE_CUDA)
  set(_mf_cpu_link ${MFSDP_RT_LINK})
  list(REMOVE_ITEM _mf_cpu_link CUDA::cudart NCCL::nccl)
  add_library(mfsdp_cpu_obj OBJECT ${_mf_cpu_sources})
  target_include_directories(mfsdp_cpu_obj PUBLIC $<BUILD_INTERFACE:${MFSDP_RT_PUBLIC_DIR}>
                             PRIVATE ${MFSDP_RT_PRIVATE_DIRS}
                             PRIVATE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/core>
                                     $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/ckpt>)
  target_compile_options(mfsdp_cpu_obj PRIVATE ${MFSDP_WARNINGS})
  target_compile_definitions(mfsdp_cpu_obj PRIVATE MFSDP_BUILDING ${_mf_cpu_defines})
  set_target_properties(mfsdp_cpu_obj PROPERTIES C_VISIBILITY_PRESET hidden)
  target_link_libraries(mfsdp_cpu_obj PUBLIC ${_mf_cpu_link})
  set(_mf_cpu_obj mfsdp_cpu_obj)
else()
  set(_mf_cpu_obj mfsdp_rt_obj)
  set(_mf_cpu_link ${MFSDP_RT_LINK})
endif()

# ---- the libraries ----
set(MFSDP_PUBLIC_HEADERS ${MFSDP_RT_PUBLIC_DIR}/mfsdp.h ${MFSDP_RT_PUBLIC_DIR}/mfsdp_mpi.h
    ${MFSDP_RT_PUBLIC_DIR}/mfsdp_ckpt.h)

# mf_package_libs(SHARED STATIC OBJ LINK...): one shared and one static
# library from an object library, the core's and the checkpoint format's
# objects (core/, ckpt/); LINK is
# what the static one needs.
function(mf_package_libs shared static obj)
  add_library(${shared} SHARED $<TARGET_OBJECTS:mfsdp_core_obj> $<TARGET_OBJECTS:mfsdp_ckpt_fmt_obj> $<TARGET_OBJECTS:${obj}>)
  add_library(${static} STATIC $<TARGET_OBJECTS:mfsdp_core_obj> $<TARGET_OBJECTS:mfsdp_ckpt_fmt_obj> $<TARGET_OBJECTS:${obj}>)
  foreach(lib ${shared} ${static})
    set_target_properties(${lib} PROPERTIES OUTPUT_NAME ${shared} C_VISIBILITY_PRESET hidden)
    target_include_directories(${lib} PUBLIC
      $<BUILD_INTERFACE:${MFSDP_RT_PUBLIC_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  endforeach()
  set_target_properties(${shared} PROPERTIES VERSION ${PROJECT_VERSION}
                        SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_link_libraries(${shared} PRIVATE ${ARGN})
  target_link_libraries(${static} PUBLIC ${ARGN})
  if(NOT APPLE)
    target_link_options(${shared} PRIVATE -Wl,--no-undefined)
  endif()
endfunction()

mf_package_libs(mfsdp mfsdp_static ${_mf_cpu_obj} ${_mf_cpu_link})
set_target_properties(mfsdp PROPERTIES PUBLIC_HEADER "${MFSDP_PUBLIC_HEADERS}")
set(_mf_export_targets mfsdp mfsdp_static)
if(MFSDP_HAVE_MPI)
  # mfsdp::mpi: for trainers that include mfsdp_mpi.h (and so call MPI).
  add_library(mfsdp_mpi INTERFACE)
  target_link_libraries(mfsdp_mpi INTERFACE mfsdp MPI::MPI_C)
  set_target_properties(mfsdp_mpi PROPERTIES EXPORT_NAME mpi)
  list(APPEND _mf_export_targets mfsdp_mpi)
endif()
if(MFSDP_HAVE_CUDA)
  mf_package_libs(mfsdp_nccl mfsdp_nccl_static mfsdp_rt_obj ${MFSDP_RT_LINK})
  # mfsdp_nccl.h includes <cuda_runtime_api.h> and <nccl.h>.
  target_link_libraries(mfsdp_nccl PUBLIC CUDA::cudart NCCL::nccl)
  # The device kernels are C++ objects: a C consumer of the static library
  # needs the C++ runtime (the shared library carries it itself).
  target_link_libraries(mfsdp_nccl_static PUBLIC stdc++)
  set_target_properties(mfsdp_nccl PROPERTIES EXPORT_NAME nccl)
  set_target_properties(mfsdp_nccl_static PROPERTIES EXPORT_NAME nccl_static)
endif()

# ---- install: libraries, headers, tools, a CMake package, pkg-config ----
include(CMakePackageConfigHelpers)
set(MFSDP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mfsdp)
install(TARGETS ${_mf_export_targets} EXPORT mfsdpTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mfsdpTargets NAMESPACE mfsdp:: DESTINATION ${MFSDP_CMAKE_DIR})
if(MFSDP_HAVE_CUDA)
  install(TARGETS mfsdp_nccl mfsdp_nccl_static EXPORT mfsdpNcclTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT mfsdpNcclTargets NAMESPACE mfsdp:: DESTINATION ${MFSDP_CMAKE_DIR})
  install(FILES ${MFSDP_RT_PUBLIC_DIR}/mfsdp_nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake DESTINATION ${MFSDP_CMAKE_DIR})
endif()
install(TARGETS mfsdp-replay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mfsdpConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/mfsdpConfig.cmake INSTALL_DESTINATION ${MFSDP_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/mfsdpConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/mfsdpConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/mfsdpConfigVersion.cmake
        DESTINATION ${MFSDP_CMAKE_DIR})

# ---- pkg-config ----
# A library path as linker flags: /d/libx.so -> -L/d -lx (rpath too when
# MFSDP_PC_RPATH, for directories the loader does not search by default).
function(mf_pc_link_flags out)
  set(flags "")
  foreach(lib ${ARGN})
    if(lib MATCHES "^(.*)/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
      set(dir ${CMAKE_MATCH_1})
      string(APPEND flags " -L${dir} -l${CMAKE_MATCH_2}")
      if(MFSDP_PC_RPATH AND NOT dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        string(APPEND flags " -Wl,-rpath,${dir}")
      endif()
    elseif(lib MATCHES "^-")
      string(APPEND flags " ${lib}")
    elseif(NOT lib MATCHES "::")
      string(APPEND flags " -l${lib}")
    endif()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

set(MFSDP_PC_MPI_LIBS "")
set(MFSDP_PC_MPI_CFLAGS "")
if(MFSDP_HAVE_MPI)
  mf_pc_link_flags(MFSDP_PC_MPI_LIBS ${MPI_C_LIBRARIES})
  foreach(dir ${MPI_C_INCLUDE_DIRS})
    string(APPEND MFSDP_PC_MPI_CFLAGS " -I${dir}")
  endforeach()
endif()
set(MFSDP_PC_RPATH_FLAG "")
if(MFSDP_PC_RPATH)
  set(MFSDP_PC_RPATH_FLAG " \${rpath}")
endif()
# Relocatable: the prefix is found from the .pc file's own directory.
string(REGEX REPLACE "[^/]+" ".." MFSDP_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
set(_mf_pc_modules mfsdp mfsdp-static)
if(MFSDP_HAVE_MPI)
  list(APPEND _mf_pc_modules mfsdp-mpi)
endif()
if(MFSDP_HAVE_CUDA)
  get_filename_component(_mf_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
  mf_pc_link_flags(MFSDP_PC_CUDA_LIBS ${CUDAToolkit_LIBRARY_DIR}/libcudart.so ${_mf_nccl_dir}/libnccl.so)
  set(MFSDP_PC_CUDA_CFLAGS "")
  foreach(dir ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR})
    if(NOT MFSDP_PC_CUDA_CFLAGS MATCHES " -I${dir}( |$)")
      string(APPEND MFSDP_PC_CUDA_CFLAGS " -I${dir}")
    endif()
  endforeach()
  list(APPEND _mf_pc_modules mfsdp-nccl mfsdp-nccl-static)
endif()
foreach(m ${_mf_pc_modules})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${m}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${m}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${m}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

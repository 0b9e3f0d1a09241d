# mfsdp_build: the CMake functions the project's folders share (included by
# the top-level CMakeLists.txt before any folder).

# mf_static_library(NAME SOURCES src... [LINK dep...] [OBJ_LINK dep...])
#   An object library NAME_obj (hidden symbols, the project's warnings,
#   MFSDP_BUILDING) and a static library NAME of its objects, both exporting
#   this folder as their include directory. OBJ_LINK: what the objects link
#   (other object libraries); LINK: what the static library links.
function(mf_static_library name)
  cmake_parse_arguments(L "" "" "SOURCES;LINK;OBJ_LINK" ${ARGN})
  add_library(${name}_obj OBJECT ${L_SOURCES})
  target_include_directories(${name}_obj PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}>)
  target_compile_options(${name}_obj PRIVATE ${MFSDP_WARNINGS})
  target_compile_definitions(${name}_obj PRIVATE MFSDP_BUILDING)
  set_target_properties(${name}_obj PROPERTIES C_VISIBILITY_PRESET hidden)
  target_link_libraries(${name}_obj PUBLIC ${L_OBJ_LINK})
  add_library(${name} STATIC $<TARGET_OBJECTS:${name}_obj>)
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}>)
  target_link_libraries(${name} PUBLIC ${L_LINK})
endfunction()

# mf_compile_specs(OUT_VAR OUTDIR dir SPECS spec... [WORKING_DIRECTORY dir])
#   Compiles each .mfsdp spec (an absolute path) with mfsdpc at build time into
#   OUTDIR/NAME.yaml and sets OUT_VAR to the list of schedules. With
#   WORKING_DIRECTORY, mfsdpc runs there and is given the spec's path relative
#   to it, which the schedule records as its `source`.
function(mf_compile_specs out_var)
  cmake_parse_arguments(C "" "OUTDIR;WORKING_DIRECTORY" "SPECS" ${ARGN})
  set(outputs "")
  foreach(spec ${C_SPECS})
    get_filename_component(name ${spec} NAME_WE)
    set(arg ${spec})
    set(cwd ${CMAKE_CURRENT_BINARY_DIR})
    if(C_WORKING_DIRECTORY)
      file(RELATIVE_PATH arg ${C_WORKING_DIRECTORY} ${spec})
      set(cwd ${C_WORKING_DIRECTORY})
    endif()
    add_custom_command(OUTPUT ${C_OUTDIR}/${name}.yaml
      COMMAND ${CMAKE_COMMAND} -E make_directory ${C_OUTDIR}
      COMMAND mfsdpc compile ${arg} -o ${C_OUTDIR}/${name}.yaml
      WORKING_DIRECTORY ${cwd}
      DEPENDS mfsdpc ${spec}
      COMMENT "Compiling ${name}.mfsdp"
      VERBATIM)
    list(APPEND outputs ${C_OUTDIR}/${name}.yaml)
  endforeach()
  set(${out_var} ${outputs} PARENT_SCOPE)
endfunction()

# mf_add_subdirectories(): every subfolder of this one that has a
# CMakeLists.txt (the test areas, the benchmark areas).
function(mf_add_subdirectories)
  file(GLOB entries LIST_DIRECTORIES true CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(entry ${entries})
    if(IS_DIRECTORY ${entry} AND EXISTS ${entry}/CMakeLists.txt)
      add_subdirectory(${entry})
    endif()
  endforeach()
endfunction()

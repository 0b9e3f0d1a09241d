# cmake -DMFSDPC=<mfsdpc> -DOUT=<dir> -DSPECS="<spec>;<spec>..." -P compile_schedules.cmake
# Compiles every spec into OUT/<name>.yaml (test fixture of the runtime tests).
file(MAKE_DIRECTORY ${OUT})
foreach(spec ${SPECS})
  get_filename_component(name ${spec} NAME_WE)
  execute_process(COMMAND ${MFSDPC} compile ${spec} -o ${OUT}/${name}.yaml
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mfsdpc compile ${spec} failed (${rc}):\n${err}")
  endif()
endforeach()

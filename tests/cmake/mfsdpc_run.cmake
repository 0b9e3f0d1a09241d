# Helpers for the scripts that run the real mfsdpc binary (cmake -P):
#   run(EXPECT_RC ARGS...)  runs ${MFSDPC} ARGS in ${MF_RUN_DIR}; fails unless
#                           the exit status is EXPECT_RC; leaves out and err
#   expect_contains(out|err TEXT)
function(run expect_rc)
  execute_process(COMMAND ${MFSDPC} ${ARGN} WORKING_DIRECTORY ${MF_RUN_DIR}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "mfsdpc ${ARGN}: exit status ${rc}, expected ${expect_rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_contains stream text)
  string(FIND "${${stream}}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in ${stream}:\n${${stream}}")
  endif()
endfunction()

# Runs the real `mfsdpc check` binary: exit statuses 0 (valid), 1 (errors),
# 2 (usage or unreadable file), output on stdout/stderr, and the file name
# printed as given (a relative path, run from tests/grammar).
#   cmake -DMFSDPC=... -DSRC=tests/grammar -DSCHEDULES=schedules -P check_cli.cmake

set(MF_RUN_DIR ${SRC})
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/mfsdpc_run.cmake)

function(expect_golden name)
  file(READ ${SRC}/invalid/${name}.expected want)
  if(NOT err STREQUAL want)
    message(FATAL_ERROR "stderr differs from invalid/${name}.expected\n--- got\n${err}--- expected\n${want}")
  endif()
  if(NOT out STREQUAL "")
    message(FATAL_ERROR "unexpected stdout:\n${out}")
  endif()
endfunction()

# valid: no output at all
run(0 check ${SCHEDULES}/hfsdp.mfsdp valid/extensions.mfsdp)
if(NOT out STREQUAL "" OR NOT err STREQUAL "")
  message(FATAL_ERROR "a valid spec printed something:\n${out}${err}")
endif()

# invalid: the golden text on stderr, exit 1
foreach(name syntax_several_errors several_errors suffix_rule mesh_missing too_many_units)
  run(1 check invalid/${name}.mfsdp)
  expect_golden(${name})
endforeach()

# several files: all checked, exit 1 if any failed
run(1 check valid/defaults.mfsdp invalid/partial_weight.mfsdp ${SCHEDULES}/zero3.mfsdp)
expect_golden(partial_weight)
run(1 check -- invalid/role_twice.mfsdp)
expect_golden(role_twice)

# usage errors and unreadable files: exit 2
run(2 check)
expect_contains(err "no spec files given")
run(2 check --frobnicate valid/defaults.mfsdp)
expect_contains(err "unknown option '--frobnicate'")
run(2 check no/such/file.mfsdp)
expect_contains(err "cannot read 'no/such/file.mfsdp'")
run(2 check invalid/partial_weight.mfsdp no/such/file.mfsdp)
expect_contains(err "invalid/partial_weight.mfsdp:")
expect_contains(err "cannot read 'no/such/file.mfsdp'")

# help and version
run(0 check --help)
expect_contains(out "usage: mfsdpc check")
run(0 check --version)
expect_contains(out "mfsdpc ")
expect_contains(out "mfsdp-schedule/4")

# explain shows the evaluation pass (docs/runtime.md §4.3): its peak within
# the arena, its bytes per axis, and the short step's note.
run(0 explain ${SCHEDULES}/hfsdp.mfsdp)
expect_contains(out "evaluation pass (eval_forward_pre/post, between steps; no gradient buffers)")
expect_contains(out "peak transient 141.8 KiB (145152 bytes) of the arena's 732.0 KiB")
expect_contains(out "(12 launches a pass)")
expect_contains(out "short step (step_end after m < M microbatches)")
run(0 explain ${SCHEDULES}/hfsdp.mfsdp --format yaml)
expect_contains(out "evaluation_pass:\n    peak_transient: 145152")

# Runs the real `mfsdpc explain` binary: exit statuses 0 (success), 1 (errors
# in the spec), 2 (usage, unreadable file, malformed cost option), the text
# and YAML listings, and a cost option that changes the choice.
#   cmake -DMFSDPC=... -DSCHEDULES=schedules -DWORK=dir -P explain_cli.cmake

set(MF_RUN_DIR ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/../cmake/mfsdpc_run.cmake)


file(MAKE_DIRECTORY ${WORK})
file(COPY ${SCHEDULES}/hfsdp.mfsdp ${SCHEDULES}/hsdp_nosync.mfsdp DESTINATION ${WORK})

# text: everything the listing promises
run(0 explain hfsdp.mfsdp)
foreach(text "; mfsdpc explain hfsdp.mfsdp" "unit 0 embed" "bucket 0 embed/hfsdp  layout hfsdp"
             "padding (" "main_weight  fp32  [Flat, Flat]" "all_gather      dp_outer     outer  bf16"
             "reduce_scatter  dp_inner     inner  fp32" "why: " "memory/rank grad" "totals per step"
             "bytes/rank   axis" "memory/rank  peak " "arena live-bytes lower bound"
             "model/rank   by role, not the peak" "plan/rank    " "+ optimizer state")
  expect_contains(out "${text}")
endforeach()
# one peak: the allocated one (docs/semantics.md §9); the model is not called one
string(REGEX MATCHALL "peak [0-9]" peaks "${out}")
list(LENGTH peaks npeaks)
if(NOT npeaks EQUAL 1)
  message(FATAL_ERROR "explain prints ${npeaks} peak figures, expected one:\n${out}")
endif()
if(NOT err STREQUAL "")
  message(FATAL_ERROR "unexpected stderr:\n${err}")
endif()
# plan's figure is that peak plus the optimizer state (docs/plan.md §2)
string(REGEX MATCH "memory/rank  peak [^\n]* \\(([0-9]+) bytes\\) allocated" m "${out}")
set(allocated "${CMAKE_MATCH_1}")
string(REGEX MATCH "plan/rank    [^\n]* = allocated [^\n]* \\(([0-9]+) bytes\\) \\+ optimizer state" m "${out}")
if(allocated STREQUAL "" OR NOT CMAKE_MATCH_1 STREQUAL allocated)
  message(FATAL_ERROR "plan's line does not add to the allocated peak (${allocated}):\n${out}")
endif()

# yaml: the same data, canonical (two runs identical)
run(0 explain hfsdp.mfsdp --format yaml)
set(first "${out}")
expect_contains(out "format: mfsdp-explain/1")
expect_contains(out "collectives_per_step:")
expect_contains(out "- {op: all_gather, axis: dp_outer, stream: outer, when: first, dtype: bf16")
run(0 explain --format=yaml hfsdp.mfsdp)
if(NOT out STREQUAL first)
  message(FATAL_ERROR "two YAML listings of the same spec differ")
endif()

# cost options reach the model and change the listing
run(0 explain hfsdp.mfsdp --outer-bw=12.5 --launch-lat=0)
expect_contains(out "dp_outer: alpha 8.00 us, beta 12.5 GB/s")
expect_contains(out "launch 0.00 us")
run(0 explain hfsdp.mfsdp --axis-lat=dp_inner:1)
expect_contains(out "dp_inner: alpha 1.00 us")

# usage errors: 2
run(2 explain)
expect_contains(err "no spec given")
run(2 explain hfsdp.mfsdp --format xml)
expect_contains(err "unknown format 'xml'")
run(2 explain hfsdp.mfsdp --format)
run(2 explain hfsdp.mfsdp --frobnicate)
expect_contains(err "unknown option '--frobnicate'")
run(2 explain hfsdp.mfsdp hsdp_nosync.mfsdp)
run(2 explain no_such_file.mfsdp)
expect_contains(err "cannot read 'no_such_file.mfsdp'")
run(2 explain hfsdp.mfsdp --inner-bw=fast)
expect_contains(err "malformed cost option '--inner-bw=fast'")
run(2 explain hfsdp.mfsdp --axis-bw=dp_middle:3)
expect_contains(err "names no mesh axis")
if(NOT out STREQUAL "")
  message(FATAL_ERROR "a failed explain printed a listing:\n${out}")
endif()
run(0 explain --help)
expect_contains(out "usage: mfsdpc explain SPEC")

# errors in the spec: 1, located, nothing on stdout
file(WRITE ${WORK}/bad.mfsdp "mesh dp_outer = 2, dp_inner = 4;\nlayout bad {\n  weight bf16 [Replicate, Flat];\n  grad fp32 [Flat, Flat];\n  main_weight fp32 [Replicate, Flat];\n}\nunit \"u\" layout bad {\n  tensor \"w\" [16];\n}\n")
run(1 explain bad.mfsdp)
expect_contains(err "bad.mfsdp:")
expect_contains(err "error:")
if(NOT out STREQUAL "")
  message(FATAL_ERROR "a spec with errors printed a listing:\n${out}")
endif()

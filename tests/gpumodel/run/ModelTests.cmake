# ModelTests.cmake: the GPU tests and tools registered a second time, to run
# on the CPU model of CUDA and NCCL (tests/gpumodel) under several
# perturbation seeds; included by tests/gpu/CMakeLists.txt in CUDA builds
# (never in the sanitize build, which has no CUDA: .ci/test runs them with the
# plain build's own tests).
#
# mf_add_model_test(NAME EXE <target> [ARGS ...] [COMMAND ...] [ENV VAR=V ...]
#                   [SEEDS "1 2 ..."] [SEED_TIMEOUT s] [EXPECT_FAIL_WITH VAR=V ...]
#                   [FIXTURES fixture ...] [MPI] [SERIAL])
#   registers NAME: model_run.sh runs `EXE ARGS` (or COMMAND, e.g. mpirun ...
#   EXE ...) once per seed with LD_LIBRARY_PATH=${MFSDP_GPUMODEL_LIBDIR},
#   GM_STRICT=1, GM_SEED and a small GM_DELAY_US, after checking that the
#   loader resolves EXE's libcudart.so.13 to the model's. Labels gpu;gpumodel
#   (and mpi with MPI). No skip code: on the model, a skip (77) is a failure.
#   EXPECT_FAIL_WITH: the mutation check (passes as is, fails with each VAR=V).
#
# The tier (MFSDP_TEST_TIER): per change five seeds each, every test, and the
# small variants; soak twelve seeds for all and the bigger meshes.
set(MFSDP_GPUMODEL_RUN ${CMAKE_CURRENT_LIST_DIR}/model_run.sh)
if(NOT MFSDP_GPUMODEL_LIBDIR)
  # tests/gpumodel/CMakeLists.txt sets the same folder; it is configured after
  # tests/gpu (name order), so the default is spelled here too.
  set(MFSDP_GPUMODEL_LIBDIR ${PROJECT_BINARY_DIR}/tests/gpumodel/lib)
endif()
if(MFSDP_TEST_TIER STREQUAL "soak")
  set(MFSDP_GPUMODEL_SEEDS "1 2 3 4 5 6 7 8 9 10 11 12")
else()
  set(MFSDP_GPUMODEL_SEEDS "1 2 3 4 5")
endif()

function(mf_add_model_test name)
  cmake_parse_arguments(M "MPI;SERIAL" "EXE;SEEDS;SEED_TIMEOUT"
                        "ARGS;COMMAND;ENV;FIXTURES;EXPECT_FAIL_WITH" ${ARGN})
  if(NOT M_EXE)
    message(FATAL_ERROR "mf_add_model_test(${name}): EXE is required")
  endif()
  if(NOT M_SEEDS)
    set(M_SEEDS "${MFSDP_GPUMODEL_SEEDS}")
  endif()
  if(NOT M_SEED_TIMEOUT)
    set(M_SEED_TIMEOUT 120)
  endif()
  if(NOT M_COMMAND)
    set(M_COMMAND $<TARGET_FILE:${M_EXE}> ${M_ARGS})
  endif()
  set(opts --libdir ${MFSDP_GPUMODEL_LIBDIR} --exe $<TARGET_FILE:${M_EXE}> --seeds "${M_SEEDS}"
      --seed-timeout ${M_SEED_TIMEOUT})
  foreach(e ${M_ENV})
    list(APPEND opts --env ${e})
  endforeach()
  foreach(m ${M_EXPECT_FAIL_WITH})
    list(APPEND opts --expect-fail-with ${m})
  endforeach()
  add_test(NAME ${name} COMMAND bash ${MFSDP_GPUMODEL_RUN} ${opts} -- ${M_COMMAND})
  separate_arguments(seed_list UNIX_COMMAND "${M_SEEDS}")
  list(LENGTH seed_list nseeds)
  list(LENGTH M_EXPECT_FAIL_WITH nmut)
  math(EXPR nseeds "(1 + ${nmut}) * ${nseeds}")
  math(EXPR timeout "${nseeds} * (${M_SEED_TIMEOUT} + 10) + 30")
  set(labels gpu gpumodel)
  if(M_MPI)
    list(APPEND labels mpi)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${MFSDP_MPIRUN_ENV}" RESOURCE_LOCK mpi)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout})
  if(M_FIXTURES)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "${M_FIXTURES}")
  endif()
  if(M_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

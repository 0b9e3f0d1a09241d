# The steps .ci/test (per change) and .ci/soak (nightly) share; sourced from
# the repository root. docs/reliability.md, "Two tiers", says what each tier
# runs.

ci_jobs=$(nproc 2>/dev/null || echo 2)
ci_t0=$SECONDS
ci_stage_name=""
ci_stage_t0=$SECONDS
ci_stage_names=()
ci_stage_secs=()

# stage NAME: ends the running stage (its time is kept for the summary) and
# starts the next one.
stage() {
  ci_stage_end
  ci_stage_name=$1
  ci_stage_t0=$SECONDS
  echo "== $1 (at $((SECONDS - ci_t0)) s)"
}

ci_stage_end() {
  if [ -n "$ci_stage_name" ]; then
    ci_stage_names+=("$ci_stage_name")
    ci_stage_secs+=($((SECONDS - ci_stage_t0)))
  fi
  ci_stage_name=""
}

# stages_done: the time of every stage and their sum; on exit, also after a
# failure (the EXIT trap below).
stages_done() {
  ci_stage_end
  echo "== done in $((SECONDS - ci_t0)) s; the stages:"
  local i sum=0
  for i in "${!ci_stage_names[@]}"; do
    printf '%6d s  %s\n' "${ci_stage_secs[$i]}" "${ci_stage_names[$i]}"
    sum=$((sum + ci_stage_secs[i]))
  done
  printf '%6d s  in all\n' "$sum"
}

# python_env_start: .ci/install-python in the background, since what it
# does is mostly I/O (unpacking gigabytes of wheels) that overlaps the
# builds' compiling; returns once the environment's python exists, which is
# all that configuring needs (the Python tests are registered when it
# exists). python_env_wait waits for the rest, printing its log, and fails
# when it failed.
python_env_start() {
  local venv=${MFSDP_VENV:-build/venv}
  mkdir -p build
  bash .ci/install-python > build/install-python.log 2>&1 &
  ci_python_pid=$!
  while [ ! -e "$venv/bin/python" ] && kill -0 "$ci_python_pid" 2>/dev/null; do sleep 1; done
}

python_env_wait() {
  if ! wait "$ci_python_pid"; then
    cat build/install-python.log >&2
    echo "error: .ci/install-python failed" >&2
    return 1
  fi
  cat build/install-python.log
}

# build_preset PRESET [CMAKE -D ARGS...]: configures (warnings as errors) and
# builds the preset's whole tree.
build_preset() {
  local preset=$1
  shift
  cmake --preset "$preset" "$@" >/dev/null
  cmake --build --preset "$preset" -j"$ci_jobs"
}

# test_names PRESET: the names of the tests the preset's build registers,
# sorted.
test_names() {
  ctest --preset "$1" -N | sed -n 's/^ *Test *#[0-9]*: //p' | sort
}

# require_registered: the tests that are registered only when their tools
# are there (valgrind, build/venv) are registered in the plain build.
require_registered() {
  if ! ctest --preset test -N -L valgrind | grep -q "Total Tests: [1-9]"; then
    echo "error: no valgrind test registered (is valgrind installed?)" >&2
    exit 1
  fi
  if ! ctest --preset test -N -L python | grep -q "Total Tests: [1-9]"; then
    echo "error: no Python test registered (did .ci/install-python make build/venv?)" >&2
    exit 1
  fi
  if ! ctest --preset test -N -R '^ckpt_hf_interop$' | grep -q "Total Tests: 1"; then
    echo "error: the Hugging Face interop test is not registered (no build/venv?)" >&2
    exit 1
  fi
}

# check_pip_install: `pip install .` into the tests' environment, and the
# package's tests against the installed package (no build tree).
check_pip_install() {
  local venv
  venv=$(realpath -m "${MFSDP_VENV:-build/venv}")
  "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps .
  (cd "$(mktemp -d)" && env -u MFSDP_LIBRARY -u MFSDPC PYTHONPATH="$OLDPWD/tests/python" \
     "$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/tests/python/test_package.py")
  # The three console scripts from PATH, outside the build tree: a compile, a
  # replay of it, mfsdp-ckpt's help (its C commands and to-dcp/from-dcp) and
  # a C command passed through (a missing checkpoint: exit status 1).
  local t
  t=$(mktemp -d)
  cp schedules/hfsdp.mfsdp "$t/"
  (cd "$t" && env -u MFSDPC -u MFSDP_CKPT -u MFSDP_REPLAY -u MFSDP_LIBRARY PATH="$venv/bin:$PATH" sh -ec '
     mfsdpc check hfsdp.mfsdp
     mfsdpc compile hfsdp.mfsdp -o hfsdp.yaml
     mfsdp-replay hfsdp.yaml --steps 1 --quiet
     mfsdp-ckpt --help > help.txt
     grep -q "reshard DIR" help.txt && grep -q "to-dcp CKPT OUT" help.txt && grep -q "from-dcp DCP" help.txt
     rc=0; mfsdp-ckpt info no-such-checkpoint 2> err.txt || rc=$?
     test "$rc" = 1')
}

# sanitize_suite: ctest --preset sanitize. ASan/UBSan options come with the
# preset; processes under mpirun also get Open MPI's leak suppressions
# (tests/hardening/lsan.supp). LeakSanitizer's own stop-the-world tracer now
# and then crashes while a process exits ("Tracer caught signal 11" then
# "LeakSanitizer has encountered a fatal error"): the leak check itself died,
# it reported no leak. Failed tests are rerun once when, and only when, the
# log shows that signature; the rerun must pass (docs/reliability.md,
# "Sanitizers and valgrind").
sanitize_suite() {
  ctest --preset sanitize && return 0
  local log=build/sanitize/Testing/Temporary/LastTest.log
  grep -q "LeakSanitizer has encountered a fatal error" "$log" && grep -q "^Tracer caught signal" "$log" ||
    return 1
  echo "== LeakSanitizer's tracer crashed (no leak reported): rerunning the failed tests once"
  ctest --preset sanitize --rerun-failed
}

trap stages_done EXIT

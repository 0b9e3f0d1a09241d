#!/usr/bin/env bash
# model_run.sh: runs a device test or tool on the CPU model of CUDA and NCCL
# (tests/gpumodel), once per perturbation seed, and says which seed failed.
#
#   model_run.sh --libdir DIR --exe BINARY [--seeds "1 2 3 4 5"]
#                [--seed-timeout S] [--expect-fail-with VAR=VALUE]...
#                [--env VAR=VALUE]... -- COMMAND [ARG...]
#
# COMMAND runs with LD_LIBRARY_PATH=DIR first (the binaries find libcudart.so.13
# and libnccl.so.2 through RUNPATH, which LD_LIBRARY_PATH precedes),
# GM_STRICT=1 (a rule the model saw broken fails the process), GM_SEED=<seed>
# and GM_DELAY_US (default 20: small random delays per stream worker).
# BINARY is the program that links CUDA (COMMAND itself, or the one mpirun
# starts): before anything runs, the dynamic loader must resolve its
# libcudart.so.13 (and libnccl.so.2 when it needs one) to DIR, so a test never
# runs silently on the real libraries (where it would skip, exit 77: here
# 77 is a failure like any other).
#
# GM_SEEDS in the environment overrides --seeds (GM_SEEDS=7 ctest -R @model
# reruns every model test under seed 7 alone).
#
# Every seed runs, each under `timeout` (S seconds, default 120); the output
# of a failing seed is printed (its last 200 lines), and the summary names
# the failing seeds. Exit 0 when every seed passed.
#
# --expect-fail-with VAR=VALUE (the mutation check, repeatable): COMMAND must
# pass as is under every seed, and each VAR=VALUE (a model knob such as
# GM_DROP_WAIT=k: the k-th cudaStreamWaitEvent dropped) must make it fail
# under at least one seed. A dropped wait shows only when the work it ordered
# is still pending, which the seed's delays make likely, not certain: exit 0
# when every mutation was caught at least once.
set -uo pipefail

libdir="" exe="" seeds="1 2 3 4 5" seed_timeout=120 mutations=() envs=()
die() { echo "model_run.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --libdir) libdir=${2:-}; shift 2 ;;
    --exe) exe=${2:-}; shift 2 ;;
    --seeds) seeds=${2:-}; shift 2 ;;
    --seed-timeout) seed_timeout=${2:-}; shift 2 ;;
    --expect-fail-with) mutations+=("${2:-}"); shift 2 ;;
    --env) envs+=("${2:-}"); shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (expected --libdir, --exe, --seeds, --seed-timeout, --expect-fail-with, --env, --)" ;;
  esac
done
seeds=${GM_SEEDS:-$seeds}
[ $# -gt 0 ] || die "no command after --"
[ -n "$libdir" ] && [ -n "$exe" ] || die "--libdir and --exe are required"
[[ "$seed_timeout" =~ ^[1-9][0-9]*$ ]] || die "--seed-timeout '$seed_timeout' is not a positive integer"
for m in "${mutations[@]}"; do
  [[ "$m" =~ ^[A-Z_][A-Z0-9_]*=.+$ ]] || die "--expect-fail-with '$m' is not VAR=VALUE"
done
for s in $seeds; do [[ "$s" =~ ^[0-9]+$ ]] || die "seed '$s' is not a non-negative integer"; done
[ -n "${seeds// /}" ] || die "no seeds"
for e in "${envs[@]}"; do [[ "$e" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '$e' is not VAR=VALUE"; done

# The guard: the model's libraries exist, and the loader picks them for BINARY.
libdir=$(realpath -e "$libdir" 2>/dev/null) || die "the CPU model's library folder is missing (build the gpumodel targets)"
[ -x "$exe" ] || die "$exe: no such program"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
resolved=$(ldd "$exe" 2>&1) || die "ldd $exe failed: $resolved"
check_lib() { # check_lib SONAME REQUIRED
  local line path
  line=$(grep -E "^[[:space:]]*$1 => " <<<"$resolved" | head -1)
  if [ -z "$line" ]; then
    [ "$2" = required ] && die "$exe does not load $1 (not a CUDA build?)"
    return 0
  fi
  path=$(sed -E 's/^[^=]*=> ([^ ]*) .*/\1/' <<<"$line")
  [ -e "$libdir/$1" ] || die "$libdir has no $1 (the model is not built)"
  [ "$(realpath -e "$path" 2>/dev/null)" = "$(realpath -e "$libdir/$1")" ] ||
    die "$exe would load $1 from '$path', not the model's $libdir/$1: refusing to run on the real library"
}
check_lib libcudart.so.13 required
check_lib libnccl.so.2 optional

export GM_STRICT=1 GM_DELAY_US="${GM_DELAY_US:-20}"
for e in "${envs[@]}"; do export "${e?}"; done

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# run_seed SEED [VAR=VALUE]: COMMAND once; sets rc and secs.
run_seed() {
  local t0=$SECONDS
  env GM_SEED="$1" ${2:+"$2"} timeout --kill-after=10 "$seed_timeout" "${cmd[@]}" >"$log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
}
explain() { # explain RC: what an exit status means here
  case $1 in
    0) echo "passed" ;;
    3) echo "exit 3: the model counted violations of CUDA's or NCCL's rules (GM_STRICT)" ;;
    77) echo "exit 77: skipped as if there were no GPU (on the model, a failure)" ;;
    124|137) echo "timed out after $seed_timeout s" ;;
    *) if [ "$1" -gt 128 ]; then echo "killed by signal $(($1 - 128))"; else echo "exit $1"; fi ;;
  esac
}
show_log() { echo "---- output of seed $1${2:+ with $2} (last 200 lines) ----"; tail -n 200 "$log"; echo "----"; }

cmd=("$@")
failed=()
declare -A caught=()
for s in $seeds; do
  run_seed "$s"
  if [ $rc -ne 0 ] || [ ${#mutations[@]} -eq 0 ]; then
    last=""
    [ $rc -ne 0 ] || last=": $(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-160)"
    echo "seed $s${mutations[0]:+ as is}: $(explain $rc) (${secs} s)$last"
    [ $rc -eq 0 ] || { show_log "$s"; failed+=("$s"); }
    continue
  fi
  echo "seed $s as is: passed (${secs} s)"
  for m in "${mutations[@]}"; do
    run_seed "$s" "$m"
    if [ $rc -eq 0 ] || [ $rc -eq 77 ]; then
      echo "seed $s: with $m: $(explain $rc) (${secs} s): not caught under this seed"
    else
      caught[$m]=$((${caught[$m]:-0} + 1))
      echo "seed $s: with $m: caught, $(explain $rc) (${secs} s):"
      grep -m 4 -E "gpumodel:|FAILED|ERROR|error|mismatch|differ" "$log" | cut -c1-240 | sed 's/^/    /'
    fi
  done
done
for m in "${mutations[@]}"; do
  [ "${caught[$m]:-0}" -gt 0 ] || { echo "model_run.sh: $m was caught under none of the seeds $seeds"; failed+=("$m"); }
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "model_run.sh: FAILED (${failed[*]}), seeds $seeds: ${cmd[*]}"
  exit 1
fi
echo "model_run.sh: every seed ($seeds) ok${mutations[0]:+; each mutation caught: ${mutations[*]}}"

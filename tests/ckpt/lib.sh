# tests/ckpt/lib.sh: shared by the checkpoint test scripts (sourced).
# Needs TRAINER (ckpt-trainer), CKPT (mfsdp-ckpt) and WORK (a scratch dir).
set -u
fail() { echo "FAIL: $*" >&2; exit 1; }
# world size of a compiled schedule: the product of its mesh sizes
world_of() {
  sed -n 's/^mesh: //p' "$1" | grep -o 'size: [0-9]*' | awk '{w *= $2} BEGIN {w = 1} END {print w}'
}
# run_trainer BACKEND SCHEDULE ARGS...: the trainer on every rank of the mesh
run_trainer() {
  local backend=$1 sched=$2
  shift 2
  if [ "$backend" = mpi ]; then
    mpirun -np "$(world_of "$sched")" --oversubscribe "$TRAINER" --backend mpi --schedule "$sched" "$@"
  else
    "$TRAINER" --schedule "$sched" "$@"
  fi
}

#!/usr/bin/env bash
# corrupt.sh TRAINER CKPT SCHEDULE [mpi]: damaged checkpoints are refused, by
# `mfsdp-ckpt verify` (exit 1) and by mfsdp_ckpt_load, naming the file: a
# flipped bit in the data or in a header, a truncated file, a file from
# another checkpoint, a missing manifest (a torn save), an edited manifest.
# With `mpi`, also under mpirun: a corrupt first piece that one replica
# reads (it still posts its later sends) makes all 8 ranks refuse, promptly.
TRAINER=$1 CKPT=$2 sched=$3 with_mpi=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
"$TRAINER" --schedule "$sched" --steps 2 --save "$WORK/good" || fail "save"
"$TRAINER" --schedule "$sched" --steps 3 --save "$WORK/other" || fail "save other"
"$CKPT" verify "$WORK/good" | grep -Eq "^ok: .*: 8 files, [0-9]+ bytes" || fail "verify of a good checkpoint"
n=0
# info: what a checkpoint holds (8 ranks of 2 x 4, 3 states, a 16-byte blob per rank, step 2)
info=$("$CKPT" info "$WORK/good") || fail "info"
for want in "format: mfsdp-checkpoint version 1" "step: 2" "mesh: dp_outer=2 x dp_inner=4 (8 ranks)" \
            "states: main_weight (fp32), exp_avg (fp32), exp_avg_sq (fp32)" "tensors: 8 (5722 elements)" \
            "user blobs: 8 ranks, 128 bytes" "  in.weight \[45, 27\] 1215 elements"; do
  echo "$info" | grep -q -- "$want" || fail "info lacks '$want': $info"
done
echo "ok: info"
# usage errors exit 2, a missing checkpoint 1
"$CKPT" info >/dev/null 2>&1; [ $? -eq 2 ] || fail "info without DIR: not exit 2"
"$CKPT" frobnicate x >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown command: not exit 2"
"$CKPT" verify "$WORK/none" >/dev/null 2>&1; [ $? -eq 1 ] || fail "missing checkpoint: not exit 1"
echo "ok: exit status 2 on usage errors, 1 on a missing checkpoint"
n=2
# check NAME REGEX: both the tool and the load refuse $WORK/bad, matching REGEX
check() {
  local name=$1 regex=$2 out rc
  out=$("$CKPT" verify "$WORK/bad" 2>&1)
  rc=$?
  [ $rc -eq 1 ] || fail "$name: verify exit status $rc, expected 1: $out"
  echo "$out" | grep -Eq -- "$regex" || fail "$name: verify message '$out' does not match /$regex/"
  out=$("$TRAINER" --schedule "$sched" --load "$WORK/bad" 2>&1) && fail "$name: the load accepted it"
  echo "$out" | grep -Eq -- "$regex" || fail "$name: load message '$out' does not match /$regex/"
  echo "ok: $name: $(echo "$out" | grep -Eo -- "$regex.*" | head -c 160)"
  n=$((n + 1))
  rm -rf "$WORK/bad"
}
flip() { # flip FILE OFFSET: xor one byte with 0x10
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $((b ^ 16)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
cp -r "$WORK/good" "$WORK/bad"; f=$WORK/bad/rank-00002.safetensors
flip "$f" $(($(stat -c %s "$f") - 20))
out=$("$TRAINER" --schedule "$sched" --load "$WORK/bad" --verify-files 1 2>&1) && fail "verify-files load accepted a flip"
echo "$out" | grep -Eq "rank 2: .*rank-00002.safetensors: entry [0-9]+ fails its CRC-32C" ||
  fail "MFSDP_CKPT_VERIFY_FILES: $out"
echo "ok: MFSDP_CKPT_VERIFY_FILES: rank 2 (the file's verifier) refuses it"
n=$((n + 1))
# Replicas share reads: only rank 2 reads the flipped piece (it wrote it),
# and every rank refuses the load with rank 2's message.
out=$("$TRAINER" --schedule "$sched" --load "$WORK/bad" --all-errors 1 2>&1) && fail "load accepted a flip"
lines=$(echo "$out" | grep -c "refused: rank 2: .*rank-00002.safetensors: entry .* fails its CRC-32C")
msgs=$(echo "$out" | grep "refused: " | sed 's/.*refused: //' | sort -u | wc -l)
[ "$lines" -eq 8 ] && [ "$msgs" -eq 1 ] || fail "not refused by all 8 ranks with rank 2's message: $out"
echo "ok: a corrupt piece read by one replica: all 8 ranks refuse with its message"
n=$((n + 1))
if [ "$with_mpi" = mpi ]; then
  # The first data byte of rank 2's file: main_weight's first piece, so the
  # reader fails before all its sends are due; the replicas must not wait.
  rm -rf "$WORK/bad"; cp -r "$WORK/good" "$WORK/bad"; f=$WORK/bad/rank-00002.safetensors
  hdr=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  flip "$f" $((8 + hdr + 4))
  start=$(date +%s)
  out=$(timeout 120 mpirun -np 8 --oversubscribe "$TRAINER" --backend mpi --schedule "$sched" --load "$WORK/bad" \
        --all-errors 1 2>&1) && fail "MPI load accepted a flip"
  lines=$(echo "$out" | grep -c "refused: rank 2: .*rank-00002.safetensors: entry 'main_weight:.*fails its CRC-32C")
  [ "$lines" -eq 8 ] || fail "MPI: not refused by all 8 ranks with rank 2's message: $out"
  [ $(($(date +%s) - start)) -lt 60 ] || fail "MPI: the refusal took $(($(date +%s) - start)) s"
  echo "ok: MPI: a corrupt first piece read by one replica: all 8 ranks refuse with its message"
  n=$((n + 1))
fi
# Replicas that share reads index each other's buffers by the states'
# order: a rank passing them in another order is refused by all 8 ranks in
# the match round, before any rank reads.
out=$("$TRAINER" --schedule "$sched" --load "$WORK/good" --swap-states-rank 3 --all-errors 1 2>&1) &&
  fail "load accepted states in another order on rank 3"
lines=$(echo "$out" | grep -c "refused: rank 3 asks for other states than rank 0")
[ "$lines" -eq 8 ] || fail "states in another order on rank 3: not refused by all 8 ranks: $out"
echo "ok: states in another order on one rank: all 8 ranks refuse"
n=$((n + 1))
check "bit flip in the data" "rank-00002.safetensors.*(CRC|corrupt)"
# A resharding load reads pieces in part (2 x 4 HFSDP onto 3 ZeRO-3 ranks):
# each piece's CRC is formed from the parts the ranks read, so a flip in a
# piece that no rank reads whole is refused too, with default flags, and by
# the export tool (which reads in chunks).
z3=$(dirname "$sched")/zero3_1x3.yaml
cp -r "$WORK/good" "$WORK/bad"; flip "$WORK/bad/rank-00001.safetensors" 2800
part_re="rank-00001.safetensors: entry '[a-z_]+:[a-z.0-9]+\[[0-9]+:[0-9]+\]' fails its CRC-32C \(read in part\)"
out=$("$TRAINER" --schedule "$z3" --load "$WORK/bad" --all-errors 1 2>&1) && fail "resharding load accepted a flip"
[ "$(echo "$out" | grep -Ec "refused: rank [0-9]: .*$part_re")" -eq 3 ] ||
  fail "resharding load: not refused by all 3 ranks naming the piece read in part: $out"
if [ "$with_mpi" = mpi ]; then
  out=$(timeout 120 mpirun -np 3 --oversubscribe "$TRAINER" --backend mpi --schedule "$z3" --load "$WORK/bad" \
        2>&1) && fail "MPI resharding load accepted a flip"
  echo "$out" | grep -Eq "refused: rank [0-9]: .*$part_re" || fail "MPI resharding load: $out"
fi
out=$("$CKPT" export "$WORK/bad" "$WORK/bad_hf" 2>&1) && fail "export accepted a flip"
echo "$out" | grep -Eq "rank-00001.safetensors: entry .* fails its CRC-32C" && [ ! -e "$WORK/bad_hf" ] || fail "export of a flip: $out"
"$TRAINER" --schedule "$z3" --load "$WORK/good" >/dev/null || fail "resharding load of the good checkpoint"
echo "ok: a flip in a piece read in part: the resharding load (3 ranks${with_mpi:+, and under mpirun}) and export refuse it"
n=$((n + 1)); rm -rf "$WORK/bad"
cp -r "$WORK/good" "$WORK/bad"; flip "$WORK/bad/rank-00001.safetensors" 40
check "bit flip in a header" "rank-00001.safetensors"
cp -r "$WORK/good" "$WORK/bad"; f=$WORK/bad/rank-00003.safetensors
truncate -s $(($(stat -c %s "$f") - 10)) "$f"
check "truncated file" "rank-00003.safetensors: [0-9]+ bytes, the manifest says [0-9]+ \(truncated"
cp -r "$WORK/good" "$WORK/bad"; cp "$WORK/other/rank-00004.safetensors" "$WORK/bad/"
check "file from another checkpoint" "rank-00004.safetensors: belongs to checkpoint [0-9a-f]+, not to this one"
cp -r "$WORK/good" "$WORK/bad"; rm "$WORK/bad/manifest.json"
check "torn save (no manifest)" "manifest.json is missing: not a committed checkpoint"
cp -r "$WORK/good" "$WORK/bad"; sed -i 's/"crc32c":"\([0-9a-f]\{7\}\)[0-9a-f]/"crc32c":"\1z/' "$WORK/bad/manifest.json"
check "edited manifest" "manifest.json: files\[0\].*crc32c"
cp -r "$WORK/good" "$WORK/bad"; sed -i 's/"step":2/"step":2,"step":3/' "$WORK/bad/manifest.json"
check "duplicate key in the manifest" "manifest.json: line 1, column [0-9]+: duplicate object key"
echo "$n passed, 0 failed"

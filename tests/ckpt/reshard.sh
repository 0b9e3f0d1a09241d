#!/usr/bin/env bash
# reshard.sh BACKEND TRAINER CKPT MFSDPC SCHEDDIR: a checkpoint trained on
# 2x4 HFSDP is loaded and saved again on 4x2 HSDP (align 64), 1x8 ZeRO-3
# (bucket_size 64KiB), 1x1 DDP, 2x4 HFSDP with align 1KiB and bucket_size
# 32KiB, and back on 2x4 HFSDP: after every hop every master-weight and
# Adam-moment element equals the original, bit for bit. The offline
# `mfsdp-ckpt reshard` does the same hops, and `mfsdpc reshard-plan` reads
# exactly the elements needed (ratio 1.000 <= 1.05). Every runtime load reads
# each byte once per replica group (4x2 HSDP: 4 replicas, 1x4 DDP: 4, 2x4
# HFSDP: 2): the ranks' bytes_read add up to the unique bytes (the size of
# the trainer's dump, which holds every tensor's three arrays once) plus the
# small user blob every rank reads, within 1 %.
backend=$1 TRAINER=$2 CKPT=$3 MFSDPC=$4 S=$5
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
. "$(dirname "$0")/lib.sh"
run_trainer "$backend" "$S/hfsdp_2x4.yaml" --steps 3 --save "$WORK/a" --dump "$WORK/a.bin" || fail "training"
prev=a
hops="hsdp_4x2 ddp_1x4 zero3_1x8 ddp_1x1 hfsdp_2x4_align hfsdp_2x4"
for n in $hops; do
  run_trainer "$backend" "$S/$n.yaml" --load "$WORK/$prev" --save "$WORK/$n" --dump "$WORK/$n.bin" \
    >"$WORK/$n.out" || fail "load $prev into $n"
  cmp "$WORK/a.bin" "$WORK/$n.bin" || fail "$prev -> $n changed the state"
  unique=$(stat -c %s "$WORK/a.bin")
  read=$(sed -n 's/^bytes_read=//p' "$WORK/$n.out" | awk '{s += $1} END {print s + 0}')
  awk -v r="$read" -v u="$unique" 'BEGIN {exit !(r >= u && r <= 1.01 * u)}' ||
    fail "load into $n read $read bytes over the ranks, unique bytes $unique (want within 1 %)"
  echo "ok: runtime $prev -> $n: every element equal; $read bytes read for $unique unique"
  ratio=$("$MFSDPC" reshard-plan "$S/hfsdp_2x4.yaml" "$S/$n.yaml" | sed -n 's/.*(\([0-9.]*\) x needed.*/\1/p')
  awk -v r="$ratio" 'BEGIN {exit !(r != "" && r <= 1.05)}' || fail "reshard-plan to $n reads $ratio x needed"
  prev=$n
done
prev=a
for n in $hops; do
  "$CKPT" reshard "$WORK/$prev" "$S/$n.yaml" "$WORK/off_$n" >/dev/null || fail "mfsdp-ckpt reshard to $n"
  "$CKPT" verify "$WORK/off_$n" >/dev/null || fail "verify off_$n"
  run_trainer "$backend" "$S/$n.yaml" --load "$WORK/off_$n" --dump "$WORK/off_$n.bin" || fail "load off_$n"
  cmp "$WORK/a.bin" "$WORK/off_$n.bin" || fail "mfsdp-ckpt reshard $prev -> $n changed the state"
  echo "ok: mfsdp-ckpt reshard $prev -> $n: every element equal"
  prev=off_$n
done
# A schedule with other tensors is refused with every mismatch named.
out=$("$MFSDPC" reshard-plan "$S/hfsdp_2x4.yaml" "$S/other_model.yaml" 2>&1) && fail "reshard-plan accepted another model"
echo "$out" | grep -q "tensor 'in.weight' has another shape" || fail "reshard-plan message: $out"
# A schedule with a Distinct axis has a checkpoint plan when its Distinct
# tensors have global names (deepseek_moe_ep, issue #42 item 2), none when one
# lacks them (the small EP spec without the clause): exit 1, the tensor named.
root="$(dirname "$0")/../.."
"$MFSDPC" reshard-plan "$root/schedules/deepseek_moe_ep.yaml" "$root/schedules/deepseek_moe_ep.yaml" >/dev/null ||
  fail "reshard-plan of deepseek_moe_ep (global names) onto itself"
# ep_small -> ep_small_dp (the same ep size, other data-parallel sizes): global
# expert 4 of a layer (ep coordinate 1) is read from a rank of ep coordinate 1
# of the old mesh only (ranks 2, 3, 6, 7: rank = 4 dp_outer + 2 ep + dp_inner)
for f in ep_small ep_small_dp; do
  "$MFSDPC" compile "$root/tests/planner/distinct/$f.mfsdp" -o "$WORK/$f.yaml" || fail "compile $f"
done
out=$("$MFSDPC" reshard-plan "$WORK/ep_small.yaml" "$WORK/ep_small_dp.yaml") || fail "reshard-plan ep_small -> ep_small_dp"
echo "$out" | grep -q "layers.0.experts.4.w1\[0:2048\] <- rank-0000[2367]" &&
  ! echo "$out" | grep -q "layers.0.experts.4.w1\[.*<- rank-0000[0145]" &&
  echo "$out" | grep -q "read 294912 (1.000 x needed" || fail "reshard-plan ep_small -> ep_small_dp: $out"
sed 's/ global "[^"]*"//' "$root/tests/planner/distinct/ep_small.mfsdp" >"$WORK/ep_nameless.mfsdp"
"$MFSDPC" compile "$WORK/ep_nameless.mfsdp" -o "$WORK/ep_nameless.yaml" || fail "compile ep_nameless"
rc=0; out=$("$MFSDPC" reshard-plan "$WORK/ep_nameless.yaml" "$WORK/ep_nameless.yaml" 2>&1) || rc=$?
[ "$rc" = 1 ] && echo "$out" | grep -q "tensor 'layers.0.experts.0.w1' of bucket '.*' is Distinct .* no global name" ||
  fail "reshard-plan of a Distinct schedule without global names: exit $rc, $out"
out=$(run_trainer "$backend" "$S/other_model.yaml" --load "$WORK/a" 2>&1) && fail "loaded another model"
echo "$out" | grep -Eq "mismatches: .*in.weight' has shape \[45, 27\] in the checkpoint, \[45, 28\]" ||
  fail "load message: $out"
echo "ok: another model refused: $(echo "$out" | grep -o 'mismatches.*' | head -c 200)"
echo "13 passed, 0 failed"

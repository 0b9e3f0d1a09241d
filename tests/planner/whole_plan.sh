#!/bin/sh
# mfsdpc plan --optimizer muon (docs/plan.md §2): Whole on the front where
# the Newton-Schulz step pays for it, not where it cannot; the Flat step's
# figure by hand; the pruned front equal to --exhaustive's; adamw never
# searches Whole; the embedding and the head left to AdamW (--muon-all:
# counted, by hand); bad values exit 2.
#   whole_plan.sh MFSDPC SRC_DIR WORK_DIR
set -u
mfsdpc=$1 src=$2/whole work=$3
rm -rf "$work" && mkdir -p "$work" && cp "$src"/plan_*.mfsdp "$work"/ && cd "$work" || exit 2
fail=0
no() { echo "FAIL: $*"; fail=1; }
"$mfsdpc" plan plan_muon.mfsdp --memory 1GiB --optimizer muon -o best.mfsdp > muon.txt 2>&1 || no "muon plan exit $?"
grep -q "layers.{i}=zero3_whole" muon.txt || no "no Whole layout on the muon front"
grep -q '^  \*.*zero3_whole' muon.txt || no "the fastest plan within 1 GiB is not Whole"
grep -q 'layers.{i}=zero3$' muon.txt || no "zero3 (least memory) left the front"
grep 'layers.{i}=zero3$' muon.txt | grep -q '  3.600 ms' || no "zero3's optimizer step is not the hand-computed 3.600 ms"
grep -q "layout zero3_whole" best.mfsdp || no "the written spec does not name zero3_whole"
"$mfsdpc" plan plan_muon.mfsdp --memory 1GiB > adamw.txt 2>&1 || no "adamw plan exit $?"
grep -q "_whole" adamw.txt && no "adamw searched a Whole layout"
"$mfsdpc" plan plan_1d.mfsdp --memory 1GiB --optimizer muon > oned.txt 2>&1 || no "1-D plan exit $?"
grep -q "_whole" oned.txt && no "a Whole layout is on the front of 1-D tensors"
"$mfsdpc" plan plan_muon_2d.mfsdp --memory 1GiB --optimizer muon > a.txt 2>&1 || no "2-D plan exit $?"
"$mfsdpc" plan plan_muon_2d.mfsdp --memory 1GiB --optimizer muon --exhaustive > b.txt 2>&1 || no "2-D exhaustive exit $?"
sed 1,2d a.txt > a2.txt; sed 1,2d b.txt > b2.txt
cmp -s a2.txt b2.txt || { no "pruned and exhaustive muon fronts differ"; diff a2.txt b2.txt; }
grep -q "_whole" a.txt || no "no Whole layout on the 2-D muon front"
grep -q "^muon: Newton-Schulz on every 2-D tensor$" muon.txt || no "plan_muon (blocks only) names AdamW tensors"
# the Muon recipe: the embedding and the head to AdamW; --muon-all adds their
# Newton-Schulz and gathers (5.708 ms by hand, plan_lm.mfsdp) to the same point
"$mfsdpc" plan plan_lm.mfsdp --memory 2GiB --optimizer muon > lm.txt 2>&1 || no "lm plan exit $?"
"$mfsdpc" plan plan_lm.mfsdp --memory 2GiB --optimizer muon --muon-all > lm_all.txt 2>&1 || no "lm --muon-all exit $?"
grep -q "^muon: Newton-Schulz on every 2-D tensor but embed.tok.weight, head.output.weight (" lm.txt ||
  no "the embedding and the head are not AdamW's"
grep -q "^muon: Newton-Schulz on every 2-D tensor$" lm_all.txt || no "--muon-all still names AdamW tensors"
first() { sed -n 's/^ *\*\{0,1\} *1  .* ms  *[0-9.]*%  *\([0-9.]*\) ms .*  \(embed=.*\)$/\1 \2/p' "$1"; }
read -r a la <<EOT
$(first lm.txt)
EOT
read -r b lb <<EOT
$(first lm_all.txt)
EOT
[ -n "${a:-}" ] && [ "$la" = "$lb" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = b - a - 5.708; exit !(d < 0.002 && d > -0.002) }' ||
  no "--muon-all's optimizer step $b ms is not $a + 5.708 ms on the same point ($la | $lb)"
"$mfsdpc" plan plan_lm.mfsdp --memory 2GiB --muon-all > bad.txt 2>&1; rc=$?
[ $rc = 2 ] && grep -q "muon-all needs --optimizer muon" bad.txt || no "--muon-all without muon: exit $rc"
"$mfsdpc" plan plan_muon.mfsdp --memory 1GiB --optimizer sgd > bad.txt 2>&1; rc=$?
[ $rc = 2 ] && grep -q "takes adamw or muon, got 'sgd'" bad.txt || no "--optimizer sgd: exit $rc"
"$mfsdpc" plan plan_muon.mfsdp --memory 1GiB --optimizer muon --optimizer-tflops 0 > bad.txt 2>&1; rc=$?
[ $rc = 2 ] && grep -q "optimizer-tflops needs a positive number" bad.txt || no "--optimizer-tflops 0: exit $rc"
[ $fail = 0 ] || cat muon.txt oned.txt
exit $fail

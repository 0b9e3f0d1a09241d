#!/usr/bin/env bash
# Scaling benchmark for hostile inputs (not a test: it reports numbers, it
# asserts nothing). For each family the input doubles; time and peak memory
# should roughly double too (linear), never quadruple.
#
#   bash tests/hardening/scale-bench.sh path/to/mfsdpc [SCALE]
# SCALE (default 1) multiplies every size. Prints one line per run:
#   family  size  input-bytes  status  seconds  max-RSS-KiB  stderr-bytes
set -u
mfsdpc=${1:?usage: scale-bench.sh MFSDPC [SCALE]}
scale=${2:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hdr='mesh dp = 2;
layout l { weight fp32 [Replicate]; grad fp32 [Partial]; main_weight fp32 [Replicate]; }'
hdr2='mesh o = 2, i = 4;
microbatches 2;
layout l { weight bf16 [Replicate, Flat]; grad fp32 [Partial, Flat]; main_weight fp32 [Flat, Flat]; }'

gen() { # family n -> file
  local f=$1 n=$2
  case $f in
    long-name)      { echo "$hdr"; printf 'unit "'; head -c "$n" /dev/zero | tr '\0' a; echo '" layout nosuch { tensor "w" [3]; }'; } ;;
    many-errors)    { echo "$hdr"; echo 'unit "u" layout l { tensor "w" [3]; }'; seq "$n" | sed 's/.*/unit "x&" layout l { tensor "w" [0]; }/'; } ;;
    stray-bytes)    { echo "$hdr"; head -c "$n" /dev/zero | tr '\0' '('; echo; } ;;
    nested-blocks)  { echo "$hdr"; printf 'unit "u" layout l { '; for ((i = 0; i < n; i++)); do printf 'for a in 0..1 { '; done; echo; } ;;
    many-tensors)   { echo "$hdr2"; echo 'unit "u" layout l {'; seq "$n" | sed 's/.*/  tensor "t&" [3, 5];/'; echo '}'; } ;;
    many-units)     { echo "$hdr2"; echo "unit \"u{i}\" for i in 0..$n layout l { tensor \"w\" [33, 7]; tensor \"b\" [5]; }"; } ;;
    yaml-nesting)   { printf 'format: mfsdp-schedule/3\nsource: '; head -c "$n" /dev/zero | tr '\0' '['; echo; } ;;
  esac
}

printf '%-14s %9s %11s %6s %8s %10s %12s\n' family size input-bytes status seconds max-RSS-KiB stderr-bytes
for spec in "long-name 262144" "many-errors 25000" "stray-bytes 262144" "nested-blocks 25000" \
            "many-tensors 25000" "many-units 1000" "yaml-nesting 262144"; do
  read -r fam base <<<"$spec"
  for mult in 1 2 4 8; do
    n=$((base * mult * scale))
    ext=mfsdp cmd=check
    case $fam in
      yaml-nesting) ext=yaml cmd=simulate ;;
      many-tensors|many-units) cmd=compile ;;
    esac
    in=$tmp/$fam.$ext
    gen "$fam" "$n" >"$in"
    args=("$cmd" "$in")
    [ "$cmd" = compile ] && args+=(-o "$tmp/out.yaml")
    start=$(date +%s.%N)
    if [ -x /usr/bin/time ]; then
      /usr/bin/time -f '%M' -o "$tmp/rss" "$mfsdpc" "${args[@]}" >/dev/null 2>"$tmp/err"
      st=$?; rss=$(tail -n1 "$tmp/rss")
    else
      "$mfsdpc" "${args[@]}" >/dev/null 2>"$tmp/err"; st=$?; rss=-
    fi
    end=$(date +%s.%N)
    printf '%-14s %9d %11d %6d %8.3f %10s %12d\n' "$fam" "$n" "$(wc -c <"$in")" "$st" \
      "$(echo "$end - $start" | bc)" "$rss" "$(wc -c <"$tmp/err")"
  done
done

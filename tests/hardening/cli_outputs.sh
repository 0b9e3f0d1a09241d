#!/usr/bin/env bash
# mfsdpc never leaves a partial output file and never overwrites its input
# (issue 8). For every way a write can go wrong -- the output is the input
# (same path, another spelling, a symlink, a hard link), the directory is
# missing or read-only, the output is a directory, the disk is full (a tiny
# tmpfs), the file-size limit is hit, standard output is /dev/full -- the
# exit status is 2 with a message naming the file, the input is unchanged,
# an existing output keeps its old bytes and no temporary file is left.
#
#   cli_outputs.sh MFSDPC SPEC WORKDIR
# Cases that need privileges (a read-only bind mount, a tmpfs) run in a user
# or mount namespace when the machine allows one, and say when they cannot.
set -u
mfsdpc=$1 spec=$2 work=$3
fails=0 ran=0
rm -rf "$work" && mkdir -p "$work/d" && cd "$work" || exit 2
cp "$spec" d/in.mfsdp
printf 'old output\n' > d/old.yaml
snapshot() { (cd d && ls -A | sort | tr '\n' ' '; cat -- * 2>/dev/null | cksum); }
before=$(snapshot)

# expect RC PATTERN CMD...: exit status RC, stderr matching PATTERN, and the
# directory d/ exactly as before (no temporary, no partial file, input and
# old output untouched).
expect() {
  local want=$1 pat=$2; shift 2
  ran=$((ran + 1))
  "$@" >out.txt 2>err.txt
  local rc=$? ok=1
  [ "$rc" = "$want" ] || ok=0
  grep -Eq -- "$pat" err.txt || ok=0
  [ "$(snapshot)" = "$before" ] || ok=0
  if [ $ok = 0 ]; then
    fails=$((fails + 1))
    echo "FAIL: $* -> rc $rc (want $want), stderr: $(head -c 400 err.txt)"
    echo "      d/ now: $(cd d && ls -A)"
  else
    echo "ok: $* -> $rc: $(head -n 1 err.txt)"
  fi
}

# the output is the input
expect 2 "refusing to overwrite the input" "$mfsdpc" compile d/in.mfsdp -o d/in.mfsdp
expect 2 "refusing to overwrite the input" "$mfsdpc" compile d/in.mfsdp -o ./d/../d/in.mfsdp
ln -s in.mfsdp d/link.mfsdp; ln d/in.mfsdp d/hard.mfsdp; before=$(snapshot)
expect 2 "refusing to overwrite the input" "$mfsdpc" compile d/in.mfsdp -o d/link.mfsdp
expect 2 "refusing to overwrite the input" "$mfsdpc" compile d/link.mfsdp -o d/in.mfsdp
expect 2 "refusing to overwrite the input" "$mfsdpc" compile d/in.mfsdp -o d/hard.mfsdp
expect 2 "differ from each other and from the input" "$mfsdpc" simulate d/in.mfsdp --trace d/in.mfsdp
expect 2 "refusing to overwrite the input" "$mfsdpc" simulate d/in.mfsdp --svg d/hard.mfsdp
rm d/link.mfsdp d/hard.mfsdp; before=$(snapshot)

# an input with errors leaves an existing output alone
sed 's/Flat/Flot/' d/in.mfsdp > bad.mfsdp
expect 1 "error:" "$mfsdpc" compile bad.mfsdp -o d/old.yaml
# missing directory, output is a directory
expect 2 "no/such/dir/x.yaml" "$mfsdpc" compile d/in.mfsdp -o no/such/dir/x.yaml
expect 2 "no/such/dir/t.json" "$mfsdpc" simulate d/in.mfsdp --trace no/such/dir/t.json
mkdir d/sub; before=$(snapshot)
expect 2 "cannot write 'd/sub'" "$mfsdpc" compile d/in.mfsdp -o d/sub
rmdir d/sub; before=$(snapshot)

# a file-size limit (a full disk as seen by one process): EFBIG, not SIGXFSZ
expect 2 "cannot write 'd/big.yaml'" bash -c "ulimit -f 4; exec \"\$0\" compile d/in.mfsdp -o d/big.yaml" "$mfsdpc"
expect 2 "cannot write 'd/t.json'" bash -c "ulimit -f 4; exec \"\$0\" simulate d/in.mfsdp --trace d/t.json" "$mfsdpc"

# standard output on a full device
for cmd in "compile d/in.mfsdp -o -" "explain d/in.mfsdp" "explain d/in.mfsdp --format yaml" \
           "simulate d/in.mfsdp" "--help" "--version"; do
  ran=$((ran + 1))
  # shellcheck disable=SC2086
  "$mfsdpc" $cmd >/dev/full 2>err.txt
  rc=$?
  if [ $rc = 2 ] && grep -q "cannot write" err.txt; then echo "ok: $cmd >/dev/full -> 2"; else
    fails=$((fails + 1)); echo "FAIL: $cmd >/dev/full -> rc $rc: $(head -c 300 err.txt)"; fi
done
"$mfsdpc" compile d/in.mfsdp -o a.yaml && sed 's/microbatches \([0-9]*\)/microbatches 7/' d/in.mfsdp > b.mfsdp &&
  "$mfsdpc" compile b.mfsdp -o b.yaml || { echo "FAIL: cannot compile the diff inputs"; fails=$((fails + 1)); }
expect 2 "cannot write" bash -c "exec \"\$0\" diff a.yaml b.yaml >/dev/full" "$mfsdpc"

# a read-only directory: chmod when not root, else a read-only bind mount
if [ "$(id -u)" != 0 ]; then
  chmod a-w d; before=$(snapshot)
  expect 2 "cannot create a temporary file next to 'd/x.yaml'" "$mfsdpc" compile d/in.mfsdp -o d/x.yaml
  chmod u+w d
elif unshare -m true 2>/dev/null; then
  expect 2 "Read-only file system" unshare -m bash -c \
    "mount --bind -o ro d d && exec \"\$0\" compile d/in.mfsdp -o d/x.yaml" "$mfsdpc"
else
  echo "skipped: read-only directory (root without mount namespaces)"
fi

# a full disk: an 8 KiB tmpfs in a mount namespace
if unshare -rm true 2>/dev/null || unshare -m true 2>/dev/null; then
  ns=(unshare -m); unshare -m true 2>/dev/null || ns=(unshare -rm)
  mkdir -p full
  ran=$((ran + 1))
  "${ns[@]}" bash -c "mount -t tmpfs -o size=8k none full && printf 'old\n' > full/out.yaml &&
      { \"\$0\" compile d/in.mfsdp -o full/out.yaml; echo rc=\$?; ls -A full; cat full/out.yaml; }" \
      "$mfsdpc" >out.txt 2>err.txt
  if grep -q "^rc=2$" out.txt && [ "$(sed -n '2,$p' out.txt)" = "$(printf 'out.yaml\nold')" ] &&
     grep -q "No space left on device" err.txt; then
    echo "ok: compile onto a full 8 KiB tmpfs -> 2, old output kept, no temporary"
  else
    fails=$((fails + 1)); echo "FAIL: full tmpfs: $(cat out.txt err.txt | head -c 400)"
  fi
else
  echo "skipped: full tmpfs (no mount namespace)"
fi

# and a successful write still works, with the usual permissions
ran=$((ran + 1))
if (umask 022 && "$mfsdpc" compile d/in.mfsdp -o d/new.yaml) && [ "$(stat -c %a d/new.yaml)" = 644 ] &&
   [ "$(cd d && ls -A | sort | tr '\n' ' ')" = "in.mfsdp new.yaml old.yaml " ]; then
  echo "ok: compile -o d/new.yaml writes it (mode 644)"
else
  fails=$((fails + 1)); echo "FAIL: a plain compile did not write d/new.yaml as expected"
fi
echo "$ran cases, $fails failed"
[ $fails = 0 ]

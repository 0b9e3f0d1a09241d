# Sourced by the command-line tests of issue 25 (cli_commit.sh, cli_nul.sh,
# limits.sh): a fresh work directory, counted failures, `expect`, the summary.

# cli_begin WORKDIR: empties WORKDIR, enters it, zeroes the counts
cli_begin() { fails=0 ran=0; rm -rf "$1" && mkdir -p "$1" && cd "$1" || exit 2; }

fail() { fails=$((fails + 1)); echo "FAIL: $*"; }

# expect RC PATTERN CMD...: exit status RC and stderr matching PATTERN
# (grep -E; empty: not checked)
expect() {
  local want=$1 pat=$2; shift 2
  ran=$((ran + 1))
  "$@" >out.txt 2>err.txt
  local rc=$?
  if [ "$rc" != "$want" ] || { [ -n "$pat" ] && ! grep -Eq -- "$pat" err.txt; }; then
    fail "$(echo "$*" | cut -c1-120) -> rc $rc (want $want${pat:+, /$pat/}): $(head -c 300 err.txt)"
  else echo "ok: $(echo "$*" | cut -c1-100) -> $rc${pat:+: $(head -n 1 err.txt | cut -c1-160)}"; fi
}

# cli_end: the summary line; the exit status of the test
cli_end() { echo "$ran cases, $fails failed"; [ "$fails" = 0 ]; }

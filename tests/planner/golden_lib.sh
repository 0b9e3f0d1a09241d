# golden_lib.sh: sourced by the golden listing scripts (whole_golden.sh,
# distinct_golden.sh). Needs $src (the goldens' folder) and sets fail=0.
#   check GOLDEN COMMAND...   runs COMMAND, its output and "exit RC" against
#                             $src/GOLDEN (UPDATE=1 rewrites the golden); a
#                             difference prints the diff and sets fail=1
fail=0
check() {
    golden=$1; shift
    rc=0; "$@" > "$golden.out" 2>&1 || rc=$?
    echo "exit $rc" >> "$golden.out"
    if [ "${UPDATE:-0}" = 1 ]; then cp "$golden.out" "$src/$golden"; return; fi
    if ! diff -u "$src/$golden" "$golden.out"; then echo "FAIL: $golden ($*)"; fail=1; fi
}

#!/bin/sh
# install_consumer.sh BUILD_DIR SOURCE_DIR SCHEDULE CMAKE CC
# Installs the build into a temporary prefix, then builds and runs the
# consumer against the installed tree: with find_package(mfsdp CONFIG)
# (shared and static targets) and with pkg-config (shared and static).
set -eu
build=$1 src=$2 sched=$3 cmake=$4 cc=$5
prefix=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/mfsdp.h"
test -x "$prefix/bin/mfsdp-replay"
pc=$(dirname "$(find "$prefix" -name mfsdp.pc | head -n1)")
libdir=$(dirname "$pc")

echo "== find_package"
"$cmake" -S "$src/consumer" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
"$cmake" --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer_shared" "$sched"
"$prefix/consumer/consumer_static" "$sched"

echo "== pkg-config"
export PKG_CONFIG_PATH="$pc"
# shellcheck disable=SC2046
"$cc" -o "$prefix/pc_shared" "$src/consumer/consumer.c" $(pkg-config --cflags --libs mfsdp) \
    -Wl,-rpath,"$libdir"
"$prefix/pc_shared" "$sched"
static_libs=$(pkg-config --static --libs mfsdp | sed "s#-lmfsdp#$libdir/libmfsdp.a#")
# shellcheck disable=SC2086
"$cc" -o "$prefix/pc_static" "$src/consumer/consumer.c" $(pkg-config --cflags mfsdp) $static_libs
"$prefix/pc_static" "$sched"
# Only the public API is exported from the shared library.
if nm -D --defined-only "$libdir/libmfsdp.so" | awk '{print $3}' | grep -v '^mfsdp_' | grep -q .; then
  echo "install_consumer.sh: libmfsdp.so exports non-public symbols:" >&2
  nm -D --defined-only "$libdir/libmfsdp.so" | awk '{print $3}' | grep -v '^mfsdp_' >&2
  exit 1
fi
echo "installed package ok"

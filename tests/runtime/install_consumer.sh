#!/bin/sh
# install_consumer.sh BUILD_DIR SOURCE_DIR SCHEDULE CMAKE CC HAVE_MPI HAVE_CUDA [MPIEXEC...]
# Installs the build into a temporary prefix and checks the installed tree
# the way docs/runtime.md ("Building against it") tells a user to use it:
#   - every documented file is there (headers, libraries, tools, packages);
#   - find_package(mfsdp CONFIG): CPU targets shared and static (no CUDA
#     anywhere), mfsdp::mpi, and the nccl component;
#   - pkg-config, one documented line per case, each binary run WITHOUT any
#     extra rpath or LD_LIBRARY_PATH: mfsdp, mfsdp-static, mfsdp-mpi,
#     mfsdp-nccl, mfsdp-nccl-static; a CPU trainer's flags and binary name
#     no CUDA;
#   - the installed mfsdp-mlp runs from the prefix.
set -eu
build=$1 src=$2 sched=$3 cmake=$4 cc=$5 have_mpi=$6 have_cuda=$7
shift 7
prefix=$(mktemp -d "${TMPDIR:-/tmp}/mfsdp-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
prefix=$(cd "$prefix" && pwd -P)   # as /proc/self/exe will name it
unset LD_LIBRARY_PATH
fail() { echo "install_consumer.sh: $*" >&2; exit 1; }
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
for f in include/mfsdp.h include/mfsdp_mpi.h bin/mfsdpc bin/mfsdp-replay bin/mfsdp-mlp \
         share/mfsdp/mlp/hfsdp.yaml; do
  test -e "$prefix/$f" || fail "missing $f"
done
pc=$(dirname "$(find "$prefix" -name mfsdp.pc | head -n1)")
libdir=$(dirname "$pc")
for f in libmfsdp.a pkgconfig/mfsdp-static.pc cmake/mfsdp/mfsdpConfig.cmake; do
  test -e "$libdir/$f" || fail "missing $libdir/$f"
done
if [ "$have_cuda" = ON ]; then
  for f in "$prefix/include/mfsdp_nccl.h" "$libdir/libmfsdp_nccl.a" "$pc/mfsdp-nccl.pc"; do
    test -e "$f" || fail "missing $f"
  done
fi
nocuda() {   # nocuda WHAT TEXT: TEXT must not mention CUDA or NCCL
  if printf '%s\n' "$2" | grep -Eqi 'cuda|nccl'; then fail "$1 mentions CUDA: $2"; fi
}

echo "== find_package"
nccl_opt=OFF
[ "$have_cuda" = ON ] && nccl_opt=ON
"$cmake" -S "$src/consumer" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCONSUMER_NCCL=$nccl_opt >/dev/null
"$cmake" --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer_shared" "$sched"
"$prefix/consumer/consumer_static" "$sched"
nocuda "ldd consumer_shared" "$(ldd "$prefix/consumer/consumer_shared")"
nocuda "ldd consumer_static" "$(ldd "$prefix/consumer/consumer_static")"
if [ "$have_mpi" = ON ]; then "$@" 1 "$prefix/consumer/consumer_mpi" "$sched"; fi
if [ "$have_cuda" = ON ]; then
  "$prefix/consumer/consumer_nccl" "$sched"
  "$prefix/consumer/consumer_nccl_static" "$sched"
fi

echo "== pkg-config"
export PKG_CONFIG_PATH="$pc"
c=$src/consumer/consumer.c o=$prefix
nocuda "pkg-config mfsdp" "$(pkg-config --cflags --libs --static mfsdp mfsdp-static)"
# shellcheck disable=SC2046
"$cc" -o "$o/pc_shared" "$c" $(pkg-config --cflags --libs mfsdp)
"$o/pc_shared" "$sched"
# shellcheck disable=SC2046
"$cc" -o "$o/pc_static" "$c" $(pkg-config --cflags --libs mfsdp-static)
"$o/pc_static" "$sched"
if ldd "$o/pc_static" | grep -q libmfsdp; then fail "pc_static links libmfsdp.so"; fi
nocuda "ldd pc_shared" "$(ldd "$o/pc_shared")"
if [ "$have_mpi" = ON ]; then
  # shellcheck disable=SC2046
  "$cc" -DCONSUMER_MPI -o "$o/pc_mpi" "$c" $(pkg-config --cflags --libs mfsdp-mpi)
  "$@" 1 "$o/pc_mpi" "$sched"
  # shellcheck disable=SC2046
  "$cc" -DCONSUMER_MPI -o "$o/pc_mpi_static" "$c" $(pkg-config --cflags --libs mfsdp-static mfsdp-mpi)
  "$@" 1 "$o/pc_mpi_static" "$sched"
fi
if [ "$have_cuda" = ON ]; then
  # shellcheck disable=SC2046
  "$cc" -DCONSUMER_NCCL -o "$o/pc_nccl" "$c" $(pkg-config --cflags --libs mfsdp-nccl)
  "$o/pc_nccl" "$sched"
  # shellcheck disable=SC2046
  "$cc" -DCONSUMER_NCCL -o "$o/pc_nccl_static" "$c" $(pkg-config --cflags --libs mfsdp-nccl-static)
  "$o/pc_nccl_static" "$sched"
fi

echo "== installed mfsdp-mlp"
"$prefix/bin/mfsdp-mlp" --schedule "$prefix/share/mfsdp/mlp/zero2.yaml" --steps 1 | grep -q max_rel_err=
# its default schedule is the installed one
"$prefix/bin/mfsdp-mlp" --steps 1 | grep -q "^mfsdp-mlp: $prefix/share/mfsdp/mlp/hfsdp.yaml: " ||
  fail "the installed mfsdp-mlp does not default to $prefix/share/mfsdp/mlp/hfsdp.yaml"

# Only the public API is exported from the shared libraries.
for so in "$libdir"/libmfsdp*.so; do
  if nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^mfsdp_' | grep -q .; then
    echo "install_consumer.sh: $so exports non-public symbols:" >&2
    nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^mfsdp_' >&2
    exit 1
  fi
done
echo "installed package ok"

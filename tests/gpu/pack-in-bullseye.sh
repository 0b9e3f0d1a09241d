#!/usr/bin/env bash
# pack-in-bullseye.sh [--rehearse] DIR: the device check's prebuilt tree,
# built so that it loads on any image with glibc 2.31 or newer (docs/gpu.md,
# "The device check"). --rehearse: then `device-check.sh --rehearse DIR`
# chrooted in the root, so the tree is seen to load and run on glibc 2.31
# (CTest: device_pack_bullseye).
#
# A binary links against the glibc it is built on: this Debian 12 host (glibc
# 2.36) makes binaries that need GLIBC_2.34. So the tree is built in a Debian
# 11 root (glibc 2.31, GCC 10, its libyaml, libjansson and cmocka, CMake 3.25
# from PyPI), made once with debootstrap and kept in $MFSDP_BULLSEYE_ROOT
# (default build/bullseye-root), with this machine's CUDA toolkit mounted into
# it read-only and the checkout mounted read-only at /src. The build (-O3 -g, sm_80 and
# sm_90, no MPI) is kept in the root and rebuilt incrementally; then
# `device-check.sh --pack` runs inside the root, so the libraries it carries
# are Debian 11's and its floor is checked there: GLIBC_2.31, GLIBCXX_3.4.28.
# DIR is replaced only when the pack succeeded.
#
# Needs root (debootstrap, mount, chroot), util-linux's unshare (the mounts
# live in a private namespace and vanish with it), network the first time
# (deb.debian.org and PyPI), and nvcc. Exit status: 0 packed, 1 failed, 2
# usage, 77 this machine cannot do it (said why), which is 1 under CI=true.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

GLIBC_FLOOR=2.31
GLIBCXX_FLOOR=3.4.28   # GCC 10's libstdc++, Debian 11's and Ubuntu 20.04's
# What the root is made of; a root made from another recipe is made again.
SUITE=bullseye
PACKAGES=gcc,g++,make,flex,bison,m4,pkgconf,libyaml-dev,libjansson-dev,libcmocka-dev,python3-pip,binutils
CMAKE_PYPI=cmake==3.25.2
RECIPE="$SUITE $PACKAGES $CMAKE_PYPI"

die() { echo "pack-in-bullseye: $*" >&2; exit 1; }
cannot() {
    echo "pack-in-bullseye: cannot build here: $*" >&2
    [ "${CI:-}" = true ] && exit 1
    exit 77
}

rehearse=0
[ "${1:-}" = --rehearse ] && { rehearse=1; shift; }
[ $# = 1 ] || { echo "usage: pack-in-bullseye.sh [--rehearse] DIR" >&2; exit 2; }
out=$(realpath -m "$1")
root=$(realpath -m "${MFSDP_BULLSEYE_ROOT:-$repo/build/bullseye-root}")
mirror=${MFSDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}

[ "$(id -u)" = 0 ] || cannot "needs root (debootstrap, mount, chroot)"
command -v unshare >/dev/null || cannot "no unshare (util-linux)"
command -v flock >/dev/null || cannot "no flock (util-linux)"
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
[ -x "$nvcc" ] || nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] && [ -x "$nvcc" ] || cannot "no nvcc (set CUDA_HOME)"
cuda=$(realpath "$(dirname "$nvcc")/..")
[ -f "$cuda/include/nccl.h" ] || cannot "no nccl.h in $cuda/include (NCCL must be installed beside CUDA)"
unshare -m --propagation private true 2>/dev/null || cannot "unshare -m is not allowed here"

mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9   # one build at a time per root

# ---- the root, made once ----
if [ "$(cat "$root/.mfsdp-recipe" 2>/dev/null)" != "$RECIPE" ]; then
    command -v debootstrap >/dev/null || cannot "no debootstrap (apt-get install debootstrap)"
    new=$root.new
    rm -rf "$new" "$root"
    echo "pack-in-bullseye: making a Debian 11 root in $root (debootstrap $SUITE from $mirror)"
    t0=$SECONDS
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$new" "$mirror" >"$new.log" 2>&1 ||
        { tail -20 "$new.log" >&2; die "debootstrap failed (log: $new.log)"; }
    # PyPI through this machine's certificate authorities (a proxy's among them).
    cp /etc/ssl/certs/ca-certificates.crt "$new/tmp/host-ca.crt" 2>/dev/null || : >"$new/tmp/host-ca.crt"
    cert=()
    [ -s "$new/tmp/host-ca.crt" ] && cert=(--cert /tmp/host-ca.crt)
    cp /etc/resolv.conf "$new/etc/resolv.conf" 2>/dev/null || true
    chroot "$new" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
        pip3 install -q --disable-pip-version-check "${cert[@]}" "$CMAKE_PYPI" >>"$new.log" 2>&1 ||
        { tail -20 "$new.log" >&2; die "pip3 install $CMAKE_PYPI in the root failed (log: $new.log)"; }
    mkdir -p "$new$cuda" "$new/src" "$new/work"
    [ "$cuda" = /usr/local/cuda ] || ln -sfn "$cuda" "$new/usr/local/cuda"
    echo "$cuda/lib64" >"$new/etc/ld.so.conf.d/mfsdp-cuda.conf"
    echo "$RECIPE" >"$new/.mfsdp-recipe"
    mv "$new" "$root"
    rm -f "$new.log"
    echo "pack-in-bullseye: root made in $((SECONDS - t0)) s ($(du -sm "$root" | cut -f1) MiB)"
fi

# ---- build and pack inside it ----
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+changes"
mkdir -p "$root$cuda" "$root/src" "$root/work"
t0=$SECONDS
# shellcheck disable=SC2016
unshare -m --propagation private bash -c '
    set -e
    root=$1 cuda=$2 repo=$3
    mount --bind "$cuda" "$root$cuda" && mount -o remount,ro,bind "$root$cuda"
    mount --bind "$repo" "$root/src" && mount -o remount,ro,bind "$root/src"
    mount --bind /proc "$root/proc"
    mount --bind /dev "$root/dev"
    chroot "$root" ldconfig
    chroot "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root TMPDIR=/tmp \
        MFSDP_GLIBC_FLOOR="$4" MFSDP_GLIBCXX_FLOOR="$5" MFSDP_COMMIT="$6" bash -ec "
        # Release with -g: crash reports of the device check name functions and lines;
        # device-check.sh --pack keeps the debug information, compressed
        cmake -S /src -B /work/build -DCMAKE_BUILD_TYPE=Release -DMFSDP_WERROR=ON -DMFSDP_WITH_MPI=OFF \
            -DCMAKE_C_FLAGS_RELEASE=\"-O3 -DNDEBUG -g\" -DCMAKE_CXX_FLAGS_RELEASE=\"-O3 -DNDEBUG -g\" \
            -DMFSDP_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER=$cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=\"80;90\" \
            -DNCCL_ROOT=$cuda >/work/configure.log 2>&1 || { tail -30 /work/configure.log; exit 1; }
        grep -q \"NCCL/CUDA backend ON\" /work/configure.log || { echo \"configured without CUDA/NCCL\"; exit 1; }
        j=\$(nproc)
        { make -C /work/build/tests/gpu -j\$j all && make -C /work/build/planner -j\$j mfsdpc &&
          make -C /work/build/runtime -j\$j mfsdp-replay; } >/work/build.log 2>&1 || { tail -40 /work/build.log; exit 1; }
        rm -rf /work/pack
        bash /src/tests/gpu/device-check.sh --pack /work/build /work/pack"
' pack-in-bullseye "$root" "$cuda" "$repo" "$GLIBC_FLOOR" "$GLIBCXX_FLOOR" "$commit" ||
    die "the build or the pack in the Debian 11 root failed (logs: $root/work/configure.log, build.log)"
rm -rf "$out.new"
cp -a "$root/work/pack" "$out.new"
rm -rf "$out"
mv "$out.new" "$out"
echo "pack-in-bullseye: $out built and packed in $((SECONDS - t0)) s in Debian 11 (glibc $(chroot "$root" ldd --version | head -1 | grep -o '[0-9.]*$'), $(chroot "$root" gcc -dumpfullversion 2>/dev/null | sed 's/^/GCC /'))"
if [ $rehearse = 1 ]; then
    MFSDP_REHEARSE_ROOT=$root bash "$here/device-check.sh" --rehearse "$out"
fi

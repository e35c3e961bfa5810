#!/usr/bin/env bash
# Runs the README's two commands on a fresh Debian 12 machine: a minbase
# debootstrap chroot with only make, git and ca-certificates (what README
# says a new machine needs), a clone of this repository's HEAD inside it,
# then `make demo` and `make test` as root there. A suite that passes only
# where debug packages or a symbolizer happen to be installed fails here.
#
# Usage (as root; needs debootstrap and a Debian mirror):
#   scripts/fresh-check.sh [--keep] [--root DIR] [--mirror URL] [-- MAKE-TARGETS]
# The chroot is made once under DIR (default /var/tmp/kvtier-fresh) and
# reused as a pristine base: each run works on a copy of it. Default
# targets: demo test. Exit status: that of the make run inside.
set -euo pipefail
root=/var/tmp/kvtier-fresh
mirror=http://deb.debian.org/debian
keep=0
targets=(demo test)
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --root) root=$2; shift ;;
    --mirror) mirror=$2; shift ;;
    --) shift; targets=("$@"); break ;;
    *) echo "fresh-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "fresh-check: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "fresh-check: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)

base=$root/base
if [ ! -x "$base/usr/bin/make" ]; then
  echo "fresh-check: debootstrap bookworm (minbase + make, git, ca-certificates) into $base"
  rm -rf "$base"; mkdir -p "$base"
  debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$base" "$mirror" \
    >"$root/debootstrap.log" 2>&1 || { tail -20 "$root/debootstrap.log"; exit 1; }
fi

work=$root/run.$$
cp -a "$base" "$work"
cleanup() {
  for m in dev/shm dev/pts dev sys proc; do umount -l "$work/$m" 2>/dev/null || true; done
  [ "$keep" = 1 ] && { echo "fresh-check: chroot kept at $work"; return; }
  rm -rf "$work"
}
trap cleanup EXIT
cp /etc/resolv.conf "$work/etc/resolv.conf"
mount -t proc proc "$work/proc"
mount --rbind /sys "$work/sys"
mount --bind /dev "$work/dev"
mount -t devpts devpts "$work/dev/pts" -o newinstance,ptmxmode=0666 2>/dev/null || mount --bind /dev/pts "$work/dev/pts"
mount -t tmpfs -o size=4g tmpfs "$work/dev/shm"

# The code arrives the way README says: a git clone (of this checkout's HEAD).
git clone -q --no-hardlinks "$repo" "$work/root/kvtier"
echo "fresh-check: $(git -C "$repo" rev-parse --short HEAD) in a fresh chroot: make ${targets[*]}"
chroot "$work" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  bash -c "cd /root/kvtier && make ${targets[*]}"

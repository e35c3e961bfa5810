#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier needs to build, test and demo.
# As root it runs apt-get; otherwise it prints the exact command and fails.
# Usage: scripts/deps.sh [--check]   (--check: only report what is missing)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev
  liburing-dev libxxhash-dev libcjson-dev libcmocka-dev libsodium-dev libssl-dev
  python3 python3-numpy python3-pip python3-setuptools python3-venv
  libucx-dev ucx-utils
  libmicrohttpd-dev prometheus
  libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
  libhiredis-dev redis-server redis-tools
  spin
  fio
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "${1:-}" = "--check" ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get update && sudo $cmd" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "kvtier needs these Debian packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && $cmd" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; refresh them once.
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"

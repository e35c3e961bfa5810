#!/bin/sh
# pip_install.sh BUILD_DIR SOURCE_DIR - `pip install ./python` and `pip
# install .` (the repository root) as a user runs them, offline: into a
# fresh venv (Debian's numpy and setuptools through --system-site-packages),
# --no-index --no-build-isolation. Then, from another directory and with
# neither KVTIER_LIB nor PYTHONPATH, `import kvtier` and the engines'
# module paths load the installed package and the libkvtier.so.0 a staged
# `make install` put on the loader's path (LD_LIBRARY_PATH stands in for
# ldconfig). The sources are copied first: pip builds in the tree it gets.
set -eu
B=$1
S=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$B" --prefix "$T/usr" >/dev/null
mkdir -p "$T/root"
cp -r "$S/python" "$T/root/python"
cp "$S/pyproject.toml" "$T/root/"
rm -rf "$T/root/python/tests"
for what in python root; do
    src="$T/root/python"
    [ "$what" = root ] && src="$T/root"
    V="$T/venv-$what"
    /usr/bin/python3 -m venv --system-site-packages --without-pip "$V"
    "$V/bin/python" -m pip install --quiet --no-index --no-build-isolation "$src" \
        >"$T/pip.log" 2>&1 || { echo "pip_install: pip install ($what) failed"; cat "$T/pip.log"; exit 1; }
    out=$(cd "$T" && env -u KVTIER_LIB -u PYTHONPATH LD_LIBRARY_PATH="$T/usr/lib" "$V/bin/python" -c '
import kvtier, kvtier.vllm_connector, kvtier.sglang_hicache
print(kvtier.__file__)
print(kvtier.LIB_PATH)
print(kvtier.version())') || { echo "pip_install: import failed ($what)"; exit 1; }
    echo "$out" | sed -n 1p | grep -q "^$V/lib/python3[.0-9]*/site-packages/kvtier/__init__.py$" ||
        { echo "pip_install: kvtier came from elsewhere ($what): $out"; exit 1; }
    [ "$(echo "$out" | sed -n 2p)" = libkvtier.so.0 ] ||
        { echo "pip_install: loaded $(echo "$out" | sed -n 2p), not the installed libkvtier.so.0"; exit 1; }
    [ "$(echo "$out" | sed -n 3p)" = "$(sed -n 's/^version = "\(.*\)"/\1/p' "$S/python/pyproject.toml")" ] ||
        { echo "pip_install: version $(echo "$out" | sed -n 3p) differs from pyproject's"; exit 1; }
done
echo "pip_install: ok"

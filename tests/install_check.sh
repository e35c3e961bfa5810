#!/bin/sh
# install_check.sh BUILD_DIR SOURCE_DIR - `make install` as a packager runs
# it (DESTDIR staging, a PREFIX): every file lands where the docs say, the
# shared library has its soname, a C program builds against the installed
# header and library through pkg-config and runs, the installed CLI runs,
# the rules pass promtool and the dashboard is JSON.
set -eu
B=$1
S=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
P=/opt/kvtier-test
DESTDIR="$T/stage" cmake --install "$B" --prefix "$P" >"$T/install.log" 2>&1 ||
    { echo "install_check: cmake --install failed"; cat "$T/install.log"; exit 1; }
R="$T/stage$P"
for f in bin/kvtier include/kvtier.h lib/libkvtier.a lib/libkvtier.so lib/libkvtier.so.0 \
         lib/pkgconfig/kvtier.pc share/kvtier/kvtier.service share/kvtier/kvtier-tmpfiles.conf \
         share/kvtier/kvtier-rules.yml share/kvtier/grafana-kvtier.json; do
    [ -e "$R/$f" ] || { echo "install_check: $f not installed"; find "$R"; exit 1; }
done
readelf -d "$R/lib/libkvtier.so" | grep -q 'SONAME.*\[libkvtier.so.0\]' ||
    { echo "install_check: no soname libkvtier.so.0"; readelf -d "$R/lib/libkvtier.so"; exit 1; }
grep -q "^ExecStart=$P/bin/kvtier serve" "$R/share/kvtier/kvtier.service" ||
    { echo "install_check: the unit does not run $P/bin/kvtier"; exit 1; }
# The .pc names the final prefix; point it at the staging copy.
sed "s|$P|$R|g" "$R/lib/pkgconfig/kvtier.pc" >"$T/kvtier.pc"
cat >"$T/use.c" <<'C'
#include <kvtier.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    kvt_config *cfg = NULL;
    if (kvt_config_create(&cfg) != KVT_OK) return 1;
    kvt_config_destroy(cfg);
    printf("%s\n", kvt_version_string());
    return strcmp(kvt_version_string(), KVT_VERSION_STRING) != 0;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$T/use" "$T/use.c" $(PKG_CONFIG_PATH="$T" pkg-config --cflags --libs kvtier) ||
    { echo "install_check: a program does not build against the installed kvtier"; exit 1; }
LD_LIBRARY_PATH="$R/lib" "$T/use" >"$T/use.out" ||
    { echo "install_check: the program does not run"; exit 1; }
grep -qx "$(sed -n 's/^Version: //p' "$T/kvtier.pc")" "$T/use.out" ||
    { echo "install_check: version mismatch"; cat "$T/use.out"; exit 1; }
# The same program against libkvtier.a with what `pkg-config --static` adds:
# the .pc must name every library the archive links. --whole-archive pulls
# every object in, so a library only some part needs (hiredis for the
# cluster directory) cannot go missing unnoticed behind a program that
# does not call that part.
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$T/use-static" "$T/use.c" $(PKG_CONFIG_PATH="$T" pkg-config --cflags kvtier) \
    $(PKG_CONFIG_PATH="$T" pkg-config --static --libs kvtier |
      sed "s|-lkvtier|-Wl,--whole-archive $R/lib/libkvtier.a -Wl,--no-whole-archive|") ||
    { echo "install_check: a program does not link statically against libkvtier.a with" \
           "\`pkg-config --static --libs kvtier\`: $(PKG_CONFIG_PATH="$T" pkg-config --static --libs kvtier 2>&1)"; exit 1; }
if ! "$T/use-static" >"$T/use-static.out" || ! cmp -s "$T/use.out" "$T/use-static.out"; then
    echo "install_check: the statically linked program does not run"; cat "$T/use-static.out"; exit 1
fi
if ldd "$T/use-static" | grep -q libkvtier; then
    echo "install_check: the static program loads libkvtier.so"; exit 1
fi
"$R/bin/kvtier" serve --help >/dev/null || { echo "install_check: the installed CLI does not run"; exit 1; }
promtool check rules "$R/share/kvtier/kvtier-rules.yml" >/dev/null ||
    { echo "install_check: the installed rules fail promtool"; exit 1; }
/usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["panels"]' \
    "$R/share/kvtier/grafana-kvtier.json" || { echo "install_check: bad dashboard JSON"; exit 1; }
echo "install_check: ok"

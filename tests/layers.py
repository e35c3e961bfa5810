#!/usr/bin/env python3
"""layers.py SRCDIR - the folders of src/ use only the layers docs/design.md
draws below them: every `#include "folder/..."` in src/<layer>/ names a
folder in that layer's allowed set (the transitive closure of USES). A new
folder must be added here (and to the drawing) before it builds on anything;
an include that points up, such as src/cache starting src/metrics' endpoint,
fails with the file and line.
"""
import os
import re
import sys

# Each layer and the layers it may use directly (docs/design.md, "Layers").
USES = {
    "util": [],
    "layout": ["util"],
    "index": ["util"],
    "store": ["util"],
    "xfer": ["layout"],
    "cuda": ["xfer"],                      # the CUDA copy backend behind xfer's ops table
    "cache": ["index", "store", "xfer", "cuda"],
    "metrics": ["cache"],
    "events": ["index", "store"],
    "emu": ["layout"],
    "net": ["util"],
    "group": ["net"],
    "connector": ["group", "cache"],
    "pd": ["layout", "net"],
    "server": ["cache", "metrics", "events", "net"],
    "cluster": ["server", "net"],
    "api": ["cache", "metrics"],           # public calls that join layers (kvt_cache_create)
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def closure(layer, seen=None):
    seen = set() if seen is None else seen
    for d in USES[layer]:
        if d not in seen:
            seen.add(d)
            closure(d, seen)
    return seen


def check(src):
    bad = []
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for layer in folders:
        if layer not in USES:
            bad.append("src/%s: a folder tests/layers.py does not place (add it to USES "
                       "and to docs/design.md's drawing)" % layer)
            continue
        allowed = closure(layer) | {layer}
        for root, _, files in os.walk(os.path.join(src, layer)):
            for f in sorted(files):
                if not f.endswith((".c", ".h", ".cu")):
                    continue
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as fh:
                    for no, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) in folders and m.group(1) not in allowed:
                            bad.append("%s:%d: src/%s includes src/%s, which is not below it"
                                       % (os.path.relpath(path, os.path.dirname(src)), no,
                                          layer, m.group(1)))
    return folders, bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    src = os.path.join(root, "src")
    for a in USES:  # the table itself points one way
        if a in closure(a):
            print("layers: the table has a cycle through %s" % a)
            return 1
    folders, bad = check(src)
    if len(folders) < 10:
        print("layers: only %d folders under %s" % (len(folders), src))
        return 1
    for b in bad:
        print("layers:", b)
    if bad:
        return 1
    print("layers: ok (%d folders)" % len(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())

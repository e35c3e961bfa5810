#!/usr/bin/python3
"""doc_commands.py KVTIER SRCDIR - every kvtier command that README.md and
docs/*.md show in a shell block is one the CLI takes: its subcommand answers
--help with exit 0 and every --option it uses is in that help. Docs rot by
renamed flags; this catches it at the commit that renames them.

It then runs the README's commands that no other test runs (the warm
restart of `demo --ssd-dir` and `fsck` on it, `config --dump`), in a
scratch directory, and checks what the README says they show, and
docs/metrics.md's scrape of a running demo; and that README's list of
fuzz targets names each one in tests/fuzz. The others
run elsewhere: trace synth / replay / plan in cli_trace_synth, pd in cli_pd,
serve / stats in cli_serve, the bench commands in their own tests."""
import os
import re
import shlex
import subprocess
import sys
import tempfile

K, SRC = sys.argv[1], sys.argv[2]
# Subcommands that take a second word.
TWO_WORD = {"pd", "bench", "trace", "cluster"}
failures = []


def fail(msg):
    failures.append(msg)
    print("doc_commands: " + msg)


def shell_blocks(path):
    """(first line number, lines) of each fenced block whose language is a
    shell's or none (output blocks hold `$ ` commands)."""
    block, lang, start = None, None, 0
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and block is None:
            block, lang, start = [], fence.group(1), no + 1
        elif fence:
            if lang in ("", "sh", "bash", "shell", "console"):
                yield start, block, lang in ("sh", "bash", "shell")
            block = None
        elif block is not None:
            block.append(line.rstrip("\n"))


def commands(lines, script):
    """kvtier command lines of a block, continuation lines joined, each
    with its line offset in the block. In a block of output (no language,
    or console) only the lines after a `$ ` prompt are commands."""
    joined, first = "", None
    for i, line in enumerate(lines):
        if first is None:
            first = i
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        joined += line
        if not script and not re.match(r"^\s*\$\s", joined):
            joined, first = "", None
            continue
        text = re.sub(r"^\s*\$\s+", "", joined).strip()
        if re.match(r"^(sudo\s+)?(\S*/)?kvtier\s", text):
            yield first, text
        joined, first = "", None


def words_of(text):
    text = re.split(r"\s#\s|\s#$", text + " ")[0]  # a trailing comment
    text = re.split(r"\s(&&|\|\||;|\||&)\s?", text + " ")[0]
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


help_cache = {}


def help_of(sub):
    if sub not in help_cache:
        p = subprocess.run([K] + list(sub) + ["--help"], capture_output=True, text=True, timeout=30)
        help_cache[sub] = (p.returncode, p.stdout + p.stderr)
    return help_cache[sub]


def lint(path):
    n = 0
    for start, block, script in shell_blocks(path):
        for off, text in commands(block, script):
            where = "%s:%d" % (os.path.relpath(path, SRC), start + off)
            words = words_of(text)
            while words and words[0] == "sudo":
                words.pop(0)
            args = words[1:]
            if not args or args[0].startswith("-"):
                continue
            sub = tuple(args[:2] if args[0] in TWO_WORD and len(args) > 1 else args[:1])
            rc, text_help = help_of(sub)
            n += 1
            if rc != 0:
                fail("%s: `kvtier %s --help` exits %d: %s" % (where, " ".join(sub), rc,
                                                             text_help.strip()[:200]))
                continue
            for w in args[len(sub):]:
                flag = w.split("=", 1)[0]
                if flag.startswith("--") and not re.search(re.escape(flag) + r"\b", text_help):
                    fail("%s: `kvtier %s` has no %s (its --help: %s)" %
                         (where, " ".join(sub), flag, text_help.strip().splitlines()[0]))
    return n


def run(args, **kw):
    p = subprocess.run([K] + args, capture_output=True, text=True, timeout=600, **kw)
    if p.returncode != 0:
        fail("`kvtier %s` exited %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()[-400:]))
    return p.stdout


def run_readme(tmp):
    """README, 'A cache that survives restarts' and 'Configuration'."""
    kd = os.path.join(tmp, "kd")
    first = run(["demo", "--quick", "--ssd-dir", kd])
    again = run(["demo", "--quick", "--ssd-dir", kd])
    m = re.search(r"SSD traffic\s+\d+ blocks written, (\d+) recovered at start", again)
    if not m or int(m.group(1)) == 0:
        fail("README: the second `demo --quick --ssd-dir` did not start warm:\n" + again)
    for out in (first, again):
        if not re.search(r"verification .* 0 mismatching bytes, 0 failed tasks: OK", out):
            fail("README: demo did not verify every byte:\n" + out)
    fsck = run(["fsck", kd])
    if not re.search(r"blocks:\s+\d+ in \d+ slots, 0 bad", fsck) or not fsck.rstrip().endswith("ok"):
        fail("README: `fsck` on the demo's directory:\n" + fsck)
    dump = run(["config", "--dump"])
    if "cpu_capacity" not in dump:
        fail("README: `config --dump` lists no cpu_capacity:\n" + dump[:400])
    js = run(["config", "--dump", "--json"])
    if not js.lstrip().startswith(("{", "[")):
        fail("README: `config --dump --json` is not JSON:\n" + js[:400])


def run_metrics_doc():
    """docs/metrics.md: `KVTIER_METRICS_PORT=9400 build/kvtier demo &` and a
    scrape of it while it runs (a free port here) shows kvtier_hit_tokens_total."""
    import socket
    import time
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, KVTIER_METRICS_PORT=str(port))
    p = subprocess.Popen([K, "demo"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    body, deadline = "", time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline and \
            not re.search(r"^kvtier_hit_tokens_total\{tier=\"cpu\"\} [1-9]", body, re.M):
        try:
            body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                          timeout=5).read().decode()
        except OSError:
            time.sleep(0.05)
    p.kill() if p.poll() is None else None
    err = p.communicate(timeout=60)[1]
    if not re.search(r"^kvtier_hit_tokens_total\{tier=\"cpu\"\} [1-9]", body, re.M):
        fail("docs/metrics.md: no kvtier_hit_tokens_total hits scraped from `demo` with "
             "KVTIER_METRICS_PORT (exit %s): %s\n%s" % (p.returncode, err[-400:], body[:400]))


def fuzz_targets_named():
    """README's list of fuzz targets names every tests/fuzz/fuzz_*.c (it
    claims to cover every decoder: a target added without a line there
    went unseen twice)."""
    readme = open(os.path.join(SRC, "README.md"), encoding="utf-8").read()
    fdir = os.path.join(SRC, "tests", "fuzz")
    for f in sorted(os.listdir(fdir)):
        if f.startswith("fuzz_") and f.endswith(".c") and "`%s`" % f[:-2] not in readme:
            fail("README.md's fuzz target list does not name %s" % f[:-2])


def main():
    fuzz_targets_named()
    docs = [os.path.join(SRC, "README.md")]
    ddir = os.path.join(SRC, "docs")
    docs += sorted(os.path.join(ddir, f) for f in os.listdir(ddir) if f.endswith(".md"))
    total = sum(lint(p) for p in docs)
    if total < 20:
        fail("only %d kvtier commands found in README.md and docs/: the parser lost them" % total)
    with tempfile.TemporaryDirectory() as tmp:
        run_readme(tmp)
    run_metrics_doc()
    if failures:
        sys.exit(1)
    print("doc_commands: ok (%d commands checked against their --help)" % total)


main()

#!/usr/bin/env python3
"""status_map.py - which kvt_status values each public function can return.

Reads src/ and derives, for every function declared in include/kvtier.h, the
statuses it can return: the codes its own body produces (kvt__fail(KVT_X,
return KVT_X, KVT_CHECK_* -> KVT_EINVAL, ...) and those of every function it
calls, transitively, through ops tables too (a call p->ops->send(...) reaches
every function an ops table puts in .send). A code only compared against
(st == KVT_X) or used as a case label is not produced. The result is a
superset: a path the analysis cannot rule out counts.

The header states the result as one "Returns:" comment line above each
declaration that returns kvt_status.

  scripts/status_map.py           print the map
  scripts/status_map.py --write   rewrite the Returns: lines of include/kvtier.h
                                  and src/server/answers.h (what each request's
                                  reply may carry)
  scripts/status_map.py --check   exit 1 when the header's lines differ (ctest)
  scripts/status_map.py --coverage [N]  which (function, status) pairs
                                  tests/unit/test_api_errors*.c show, and which
                                  not; exit 1 when fewer than N are shown
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "kvtier.h")

STATUS_ORDER = ["OK", "EINVAL", "ENOMEM", "ENOTFOUND", "EAGAIN", "ETIMEDOUT", "ECANCELED",
                "EIO", "ENOSPC", "EGEOMETRY", "ESTATE", "EBUSY", "EFULL", "ECORRUPT",
                "EUNSUPPORTED", "ESYS", "EPROTO", "ECONN", "EABORTED", "EAUTH", "EVERSION"]
STATUS_RE = re.compile(r"\bKVT_(" + "|".join(STATUS_ORDER) + r")\b")
TEARDOWN = re.compile(r"destroy|stop|close|free|fini|drop|release|unref|teardown")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def functions(text):
    """name -> (body, static, params, return type) of every function
    defined in text (brace-matched)."""
    out = {}
    for m in re.finditer(r"^([A-Za-z_][\w \t\*]*?)\b(\w+)\s*\(([^;{}]*?)\)\s*(?:__attribute__\(\(.*?\)\)\s*)?\{",
                         text, flags=re.M | re.S):
        name = m.group(2)
        if name in KEYWORDS:
            continue
        depth, i = 1, m.end()
        while depth and i < len(text):
            c = text[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
        words = m.group(1).split()
        # Teardown reports nothing to its caller: a void destroy/stop/close
        # called on a failure path adds no status (its own failures are
        # logged or recorded in results, not returned).
        if "void" in words and "*" not in m.group(1) and TEARDOWN.search(name):
            continue
        body, static, params, ret = out.get(name, ("", False, "", ""))
        out[name] = (body + text[m.end():i], static or "static" in words,
                     params + m.group(3) + ";", ret + m.group(1) + ";")
    return out


def enclosing_call(body, pos):
    """The name of the call whose parentheses hold body[pos], or None."""
    depth = 0
    for j in range(pos - 1, -1, -1):
        c = body[j]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth == 0:
                f = re.search(r"(\w+)\s*$", body[:j])
                return f.group(1) if f else None
            depth -= 1
        elif c in ";{}" and depth == 0:
            return None
    return None


def produced(body, sinks=()):
    """The codes body produces. A code handed to a sink (a void or bool
    function with no kvt_status * parameter: kvt__cache_end_task(c, t,
    KVT_ECANCELED) records a task's result) is not among them."""
    codes = set()
    for m in STATUS_RE.finditer(body):
        if sinks and enclosing_call(body, m.start()) in sinks:
            continue
        before = body[max(0, m.start() - 12):m.start()]
        if re.search(r"(==|!=)\s*$", before) or re.search(r"\bcase\s+$", before):
            continue
        after = body[m.end():m.end() + 6]
        if re.match(r"\s*(==|!=)", after):
            continue
        codes.add(m.group(1))
    if re.search(r"\bKVT_CHECK_(ARG|NOT_NULL|NOT_NULL_AS)\b", body):
        codes.add("EINVAL")
    if carries_task_result(body):
        codes |= task_results()
    return codes


def carries_task_result(body):
    """Whether body fails with a task's result: kvt__fail(r.status, ...)
    of a kvt_task_result r it declares (external.c's ended_fail: a LAUNCH
    of a task that ended first), or kvt__fail(t->result.status, ...)."""
    if re.search(r"\bkvt__fail\(\s*\w+->result\.status\b", body):
        return True
    for m in re.finditer(r"\bkvt_task_result\s+(\w+)", body):
        if re.search(r"\bkvt__fail\(\s*%s\.status\b" % re.escape(m.group(1)), body):
            return True
    return False


def ops_tables(text, structs):
    """member -> {(ops type, function)}, from ops table initializers
    (designated or positional)."""
    out = {}
    for m in re.finditer(r"\b(\w+_ops)\s+\w+\s*=\s*\{(.*?)\};", text, flags=re.S):
        typ, init = m.group(1), m.group(2)
        for d in re.finditer(r"\.(\w+)\s*=\s*(\w+)", init):
            out.setdefault(d.group(1), set()).add((typ, d.group(2)))
        if "." not in init and typ in structs:
            items = [x.strip() for x in init.split(",")]
            for member, item in zip(structs[typ], items):
                if re.fullmatch(r"\w+", item):
                    out.setdefault(member, set()).add((typ, item))
    return out


def struct_members(text):
    out = {}
    for m in re.finditer(r"typedef struct (\w+_ops) \{(.*?)\}\s*\w+;", text, flags=re.S):
        members = []
        for decl in m.group(2).split(";"):
            f = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl) or re.search(r"(\w+)\s*(\[\w*\])?\s*$", decl.strip())
            if f:
                members.append(f.group(1))
        out[m.group(1)] = members
    return out


def load():
    """(file, name) -> (body, static) of kvt_status functions; the ops
    tables; and per file the ops types it can see (its own text and the
    src/ headers it includes)."""
    funcs, heads, texts, raw = {}, {}, [], {}
    for d, _, files in os.walk(os.path.join(ROOT, "src")):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                path = os.path.relpath(os.path.join(d, f), ROOT)
                with open(os.path.join(d, f)) as fh:
                    raw[path] = fh.read()
                t = strip_comments(raw[path])
                texts.append(t)
                for name, (body, static, params, ret) in functions(t).items():
                    funcs[(path, name)] = (body, static)
                    heads[(path, name)] = (params, ret)
    seen = {}
    for path, t in raw.items():
        types = set(re.findall(r"\b(\w+_ops)\b", t))
        for inc in re.findall(r'#include "([\w/]+\.h)"', t):
            types |= set(re.findall(r"\b(\w+_ops)\b", raw.get("src/" + inc, "")))
        seen[path] = types
    allt = "\n".join(texts)
    structs = struct_members(allt)
    return funcs, heads, ops_tables(allt, structs), seen


def call_args(expr):
    """(top, args): expr with the text inside every call's parentheses
    removed, and that text (nested calls included)."""
    top, args, depth = [], [], 0
    for i, c in enumerate(expr):
        if c == "(" and (depth or re.search(r"\w\s*$", expr[:i])):
            depth += 1
            if depth == 1:
                top.append("(")
                continue
        elif c == ")" and depth:
            depth -= 1
            if depth == 0:
                top.append(")")
                continue
        (args if depth else top).append(c)
    return "".join(top), "".join(args)


def status_vars(text):
    """Names declared kvt_status in text (parameters or locals)."""
    names = set()
    for m in re.finditer(r"\bkvt_status\s+([^;(]*)", text):
        for piece in m.group(1).split(","):
            v = re.match(r"\s*\**\s*(\w+)", piece)
            if v:
                names.add(v.group(1))
    return names


def returned_calls(body, params):
    """The text of every return expression of a function, when none of them
    can pass on a status the function did not produce itself or get from a
    call in that same return expression; else None.

    A return passes a status on when its value is a variable, a field or a
    cast (return st; return t->result.status; return (kvt_status)rc), or when
    a call in it is given a kvt_status variable, a status field or a
    non-constant first argument of kvt__fail (return kvt__fail(st, ...)).
    A function that hands a status out through a kvt_status * parameter or
    stores one in a field is left to the whole-body rule too."""
    if re.search(r"\bkvt_status\s*\*", params) or \
            re.search(r"(->|\.)\s*\w*status\w*\s*=[^=]", body):
        return None
    svars = status_vars(params + ";" + body)
    exprs = []
    for m in re.finditer(r"\breturn\b", body):
        i, depth = m.end(), 0
        while i < len(body) and not (body[i] == ";" and depth == 0):
            depth += (body[i] in "([{") - (body[i] in ")]}")
            i += 1
        expr = body[m.end():i]
        top, args = call_args(expr)
        for t in re.finditer(r"[A-Za-z_]\w*", top):
            after = top[t.end():].lstrip()
            if not (t.group(0).startswith("KVT_") or after.startswith(("(", "->", "."))):
                return None
        if set(re.findall(r"\b\w+\b", args)) & svars or re.search(r"\(\s*kvt_status\s*\)", expr) \
                or re.search(r"(->|\.)\s*\w*status\w*\b", args):
            return None
        for f in re.finditer(r"\bkvt__fail\s*\(\s*([^,]*),", expr):
            if re.search(r"\b(?!KVT_)[A-Za-z_]\w*", f.group(1)):
                return None
        exprs.append(expr)
    return exprs


def _cond_end(body, i):
    """The index just past the parenthesised condition that opens at body[i]."""
    depth = 0
    for j in range(i, len(body)):
        depth += (body[j] == "(") - (body[j] == ")")
        if depth == 0:
            return j + 1
    return len(body)


def early_returns(body, v, pos):
    """Codes X that v cannot hold at body[pos]: an `if (v == KVT_X) return
    <expression without v>;` earlier in the same block, with no assignment
    to v, no label and no end of a block between (straight-line code, so
    reaching pos means that test was passed: open_dir's missing meta file,
    KVT_ENOTFOUND, creates the directory instead of being returned)."""
    codes = set()
    for m in re.finditer(r"\bif\s*\(\s*%s\s*==\s*KVT_(\w+)\s*\)\s*return\b([^;]*);" % re.escape(v),
                         body[:pos]):
        if re.search(r"\b%s\b" % re.escape(v), m.group(2)):
            continue
        between = body[m.end():pos]
        if re.search(r"\b%s\s*=[^=]" % re.escape(v), between) or "}" in between or \
                re.search(r"^\s*\w+\s*:(?!:)", between, flags=re.M) or re.search(r"\b(case|default|goto)\b", between):
            continue
        codes.add(m.group(1))
    return codes


def conjunction(rest):
    """Whether the text after `v != KVT_X` in an if's condition keeps that
    test necessary: nothing, or `&& ...` with no top-level `||` (v != X || t
    can hold with v == X)."""
    rest = rest.strip()
    while re.search(r"\([^()]*\)", rest):
        rest = re.sub(r"\([^()]*\)", "", rest)
    return rest == "" or (rest.startswith("&&") and "||" not in rest and "?" not in rest)


def reaching(body, v, pos):
    """The callees whose status v can hold at body[pos], when straight-line
    code says so: walking back over the assignments to v, every conditional
    one (`if (!v) v = h(...)`, or one in a nested block) and the first
    unconditional `v = g(...)` at pos's own block level, which ends the walk.
    None (anything may reach) when no such assignment is found, or a label,
    case or goto lies between it and pos."""
    found = set()
    for m in reversed(list(re.finditer(r"\b%s\s*=[^=]" % re.escape(v), body[:pos]))):
        between = body[m.end():pos]
        if re.search(r"^\s*\w+\s*:(?!:)", between, flags=re.M) or \
                re.search(r"\b(case|default|goto)\b", between):
            return None
        depth, low = 0, 0
        for c in between:
            depth += (c == "{") - (c == "}")
            low = min(low, depth)
        if low < 0:
            return None  # v assigned inside a block closed before pos: give up
        g = re.match(r"\s*(\w+)\s*\(", body[m.end() - 1:])
        if not g:
            return None
        found.add(g.group(1))
        plain = re.search(r"(?:^|[;{}])\s*(?:kvt_status\s+)?$", body[:m.start()])
        if plain and depth == 0:
            return found
    return None

def guarded_edges(body, replacers=None):
    """callee -> codes a function cannot pass on from that callee, because
    the status it got is compared and replaced before any return.

    Two shapes, both checked on every use of the variable V that holds the
    callee's status (else nothing is excluded):
      - V = g(...) where every return of V that g's value can reach
        (reaching) sits under `if (V != KVT_X && ...)` (X is not returned as
        V; the function says something else instead, e.g. kvt_cache_try_wait
        turning kvt_cache_wait's ETIMEDOUT into EAGAIN), under
        `if (V == KVT_Y) return V;` (only Y is), or after an early
        `if (V == KVT_X) return <other>;` (early_returns); V is otherwise
        only compared (V == KVT_Z, V != KVT_Z, !V, if (V)) or replaced
        (V = m(..., V): m one of replacers, name -> the codes m passes on of
        the status it was given: none for client.c's lost(), which turns a
        failed round trip into KVT_ECONN; its switch's case labels for a
        filter such as plan_status), and every call of g lands in V;
      - while ((V = g(...)) == KVT_X) { body without V }: the loop is left
        only with V != X (a retry until a deadline that reports its own
        ETIMEDOUT), and g is called nowhere else."""
    out = {}
    every = set(STATUS_ORDER)
    replacers = replacers or {}
    for v in status_vars(body):
        uses = [m.start() for m in re.finditer(r"\b%s\b" % re.escape(v), body)]
        assigned = {}
        for m in re.finditer(r"\b%s\s*=\s*(\w+)\s*\(" % re.escape(v), body):
            assigned.setdefault(m.group(1), []).append(m.start())
        if not assigned:
            continue
        # the while-retry shape
        for m in re.finditer(r"\bwhile\s*\(\s*\(\s*%s\s*=\s*(\w+)\s*\(" % re.escape(v), body):
            g, end = m.group(1), _cond_end(body, body.index("(", m.start()))
            cond = body[m.start():end]
            x = re.search(r"\)\s*==\s*KVT_(\w+)\s*\)$", cond)
            blk = re.match(r"\s*\{", body[end:])
            if not x or not blk or len(assigned.get(g, [])) != 1 or \
                    len(re.findall(r"\b%s\s*\(" % g, body)) != 1:
                continue
            i, depth = end + blk.end(), 1
            while depth and i < len(body):
                depth += (body[i] == "{") - (body[i] == "}")
                i += 1
            if not re.search(r"\b%s\b" % re.escape(v), body[end:i]):
                out.setdefault(g, set()).add(x.group(1))
        # the compared-and-replaced shape
        seen_by, ok, rets = [], True, 0
        for u in uses:
            before, after = body[:u], body[u + len(v):]
            if re.match(r"\s*=[^=]", after) or re.search(r"\bkvt_status\s*$", before) and \
                    re.match(r"\s*=\s*\w+\s*\(", after):
                continue
            if re.match(r"\s*[=!]=\s*KVT_\w+", after) or re.search(r"(!|\bif\s*\()\s*$", before) \
                    and re.match(r"\s*\)", after):
                continue
            m = enclosing_call(body, u)
            if m in replacers and re.search(r"\b%s\s*=\s*%s\s*\([^;]*$" % (re.escape(v), m), before):
                continue  # v = m(..., v): replaced by what m returns
            if re.search(r"\breturn\s*$|\breturn\b[^;]*[?:]\s*$", before) and re.match(r"\s*;", after):
                rets += 1
                mine = early_returns(body, v, u)
                g = re.search(r"\bif\s*\(\s*%s\s*(!=|==)\s*KVT_(\w+)([^;{}]*)\)\s*return\s*$"
                              % re.escape(v), before)
                if g and g.group(1) == "!=" and conjunction(g.group(3)):
                    # if (v != KVT_OK && v != KVT_ENOTFOUND) return v;
                    mine.add(g.group(2))
                    mine.update(re.findall(r"&&\s*%s\s*!=\s*KVT_(\w+)\b(?=\s*(?:&&|$))"
                                           % re.escape(v), g.group(3).strip()))
                elif g and g.group(1) == "==" and not g.group(3).strip():
                    mine |= every - {g.group(2)}
                seen_by.append((reaching(body, v, u), mine))
                continue
            ok = False
            break
        # every call of a callee must land in v, or its status goes elsewhere too
        if ok and rets:
            for g, at in assigned.items():
                if len(re.findall(r"(?<![\w>.])%s\s*\(" % re.escape(g), body)) != len(at):
                    continue
                # only the returns g's value can reach
                excl = set(every)
                for k, mine in seen_by:
                    if k is None or g in k:
                        excl &= mine
                    else:  # g's value may pass a filter on its way here
                        for m in k & set(replacers):
                            excl &= (every - replacers[m]) | mine
                if excl:
                    out.setdefault(g, set()).update(excl)
    return out


def struct_types():
    """Names of the struct typedefs of include/kvtier.h and src/."""
    names = set()
    paths = [HEADER] + [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "src"))
                        for f in fs if f.endswith((".h", ".c"))]
    for path in paths:
        with open(path) as fh:
            t = fh.read()
        names.update(re.findall(r"typedef struct \w*\s*\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}\s*(\w+)\s*;", t))
        names.update(re.findall(r"typedef struct \w+\s+(\w+)\s*;", t))
    return names


def void_sinks(heads):
    """Functions every definition of which returns void, bool or a struct
    (not a pointer) and takes no kvt_status *: a status given to one (a
    room's or a task's recorded failure, a task result built from it)
    cannot come back as the caller's return value, except through a field
    the caller returns (returns_field)."""
    structs = struct_types()
    verdict = {}
    for (_, name), (params, ret) in heads.items():
        words = ret.replace(";", " ").split()
        ok = ("void" in words or "bool" in words or (words and words[-1] in structs)) and \
            "*" not in ret and not re.search(r"\bkvt_status\s*\*", params)
        verdict[name] = verdict.get(name, True) and ok
    return {n for n, ok in verdict.items() if ok}


def returns_field(body):
    """Whether some return of body reads a field (return t->result)."""
    for m in re.finditer(r"\breturn\b([^;]*);", body):
        top, _ = call_args(m.group(1))
        if re.search(r"(->|\.)\s*\w+\b(?!\s*\()", top):
            return True
    return False


# (function, status) pairs the call graph reaches through a path the code
# cannot take, each with the reason: what rules the path out is a fact about
# state (a role, an invariant of a list) that no pattern over the text can
# see. The Returns: lines leave them out; --check fails when one is no
# longer reached at all (the exclusion went stale: delete it).
UNREACHABLE = {
    ("kvt_pd_sender_abort", "ETIMEDOUT"):
        "pd_room_wait_landed (pd/ep.c) times out only while r->landing is raised, and only "
        "the receiver's link threads land batches (pd/receiver.c on_data): a prefill "
        "rank's rooms never land anything",
    ("kvt_pd_sender_clear", "ETIMEDOUT"):
        "as kvt_pd_sender_abort: no batch ever lands in a prefill rank's room",
    ("kvt_conn_wait_layer", "ESTATE"):
        "kvt_cache_wait_layer's ESTATE is a task never launched; the connector puts a load "
        "in c->run only once kvt_cache_launch accepted it (connector/step.c launch_load), "
        "and task ids are never reused (cache/tasks.c)",
    ("kvt_client_cancel", "EIO"):
        "kvt__task_status's EIO is written into the task's result by ct_end (client.c), which "
        "returns nothing; cancel returns only its own round trip's status",
    ("kvt_client_launch", "EIO"):
        "take_launch (client.c) writes kvt__task_status's EIO into t->bad_status, the cut "
        "load's later result; launch returns only its own checks' and round trip's statuses",
    ("kvt_cache_register_memory", "EFULL"):
        "kvt__cuda_backend_pin's EFULL is its 16-range table full; register_cuda (cache/cache.c) "
        "pins once, on the backend it has just created, and registration is allowed once "
        "per cache (ESTATE after)",
}

# Functions that return a task's own result when the task ended with an
# error (task_ended_fail: return t->result). What a task can end with is
# the list kvt__task_status (src/cache/tasks.c) clamps every result to, read
# from there, so it cannot drift from the code.
TASK_RESULT_FUNCS = {"kvt_cache_wait_layer", "kvt_cache_layer_event", "kvt_cache_stream_wait_layer",
                     "kvt_client_wait_layer", "kvt_conn_wait_layer"}
TASKS_C = os.path.join(ROOT, "src", "cache", "tasks.c")


def task_results():
    """The statuses of KVT_TASK_RESULTS[] in src/cache/tasks.c."""
    with open(TASKS_C) as fh:
        m = re.search(r"KVT_TASK_RESULTS\[\]\s*=\s*\{(.*?)\};", fh.read(), flags=re.S)
    if not m:
        sys.exit("status_map: no KVT_TASK_RESULTS[] in %s" % TASKS_C)
    return set(STATUS_RE.findall(m.group(1)))


SERVER_CONN = "src/server/conn.c"
CLIENT = "src/server/client.c"
ROUND_TRIPS = ("round_trip", "round_trip_ex")
# A handler's replying: reply, reply_err, or its own send of the reply frame
# (on_hello passes the tier's fd with it). A failed send is the server's:
# the client sees the connection lost, not the send's status.
SERVER_SEND = {"reply", "reply_err", "kvt__srv_send_frame"}


def server_handlers(funcs):
    """op constant (KVT_SRV_X) -> the node server's handler of that request,
    from serve_one's switch in src/server/conn.c (its on_* call per case)."""
    body = funcs.get((SERVER_CONN, "serve_one"), ("", False))[0]
    out, pending = {}, []
    for m in re.finditer(r"\bcase\s+(KVT_SRV_\w+)\s*:|\b(on_\w+)\s*\(", body):
        if m.group(1):
            pending.append(m.group(1))
        elif pending:
            for op in pending:
                out[op] = (SERVER_CONN, m.group(2))
            pending = []
    return out


def discarded(body, m):
    """Whether the call matched by m (its name and opening parenthesis) is
    a statement of its own whose value is dropped: `f(...);` or
    `(void)f(...);` after `;`, `{`, `}`, `else` or an if's condition. Its
    status cannot be returned (on_plan's kvt__cache_ext_abort(...) undoing
    a plan whose reply failed says nothing to the client). The caller keeps
    the call when the callee hands a status out through a kvt_status *
    parameter, or when the caller returns a field (the callee may have
    stored its status there), and when the callee is not one of
    dropped_calls."""
    start = m.start()
    before = body[:start].rstrip()
    before = re.sub(r"\(\s*void\s*\)\s*$", "", before).rstrip()
    if m.group(1):  # p->ops->f(...): the statement starts at the object
        obj = re.search(r"[\w\]\[>.\-\s]*$", body[:start])
        before = body[:start - len(obj.group(0))].rstrip() if obj else before
    if not (before == "" or before[-1] in ";{}" or re.search(r"\belse$", before) or
            (before[-1] == ")" and if_condition_end(before))):
        return False
    i, depth = m.end(), 1
    while depth and i < len(body):
        depth += (body[i] == "(") - (body[i] == ")")
        i += 1
    return re.match(r"\s*;", body[i:]) is not None


def dropped_calls(heads):
    """Functions whose status a caller can drop (discarded): every
    definition returns kvt_status and none takes a kvt_status *. A void
    function's statuses are what it records (refuse(v, KVT_ESTATE, ...)
    into a verdict its caller returns), so a call of one is never dropped."""
    verdict = {}
    for (_, name), (params, ret) in heads.items():
        ok = re.fullmatch(r"\s*(static\s+)?(inline\s+)?kvt_status\s*;?", ret) is not None and \
            not re.search(r"\bkvt_status\s*\*", params)
        verdict[name] = verdict.get(name, True) and ok
    return {n for n, ok in verdict.items() if ok}


def if_condition_end(text):
    """Whether text ends with the closing parenthesis of an if/while/for
    condition (so what follows is that statement's body)."""
    depth = 0
    for j in range(len(text) - 1, -1, -1):
        depth += (text[j] == ")") - (text[j] == "(")
        if depth == 0:
            return re.search(r"\b(if|while|for)\s*$", text[:j]) is not None
    return False


def replaced(body, params):
    """For a function taking a kvt_status P: the codes of P it can return,
    when it returns P only as `return P;` right after case labels of a
    switch (a filter: plan_status passes the codes a plan may get) and every
    other return is a constant, its own kvt__fail(KVT_X, ...) or a call
    given no status (returned_calls); the empty set when it never returns P
    (client.c's lost). None otherwise."""
    m = re.search(r"\bkvt_status\s+(\w+)\s*(?:,|$|;)", params)
    if not m:
        return None
    p = m.group(1)
    if re.search(r"\breturn\s+%s\s*;" % re.escape(p), body) and \
            len(re.findall(r"\bswitch\b", body)) != 1 or \
            re.search(r"\bswitch\s*\(", body) and not re.search(r"\bswitch\s*\(\s*%s\s*\)" % re.escape(p), body):
        return None  # the case labels must be those of a switch on p
    codes = set()
    for r in re.finditer(r"((?:\bcase\s+KVT_\w+\s*:\s*)+)return\s+%s\s*;" % re.escape(p), body):
        codes |= set(re.findall(r"KVT_(\w+)", r.group(1)))
    rest = re.sub(r"((?:\bcase\s+KVT_\w+\s*:\s*)+)return\s+%s\s*;" % re.escape(p),
                  lambda r: r.group(1) + "return KVT_OK;", body)
    if returned_calls(rest, params) is None:
        return None
    return codes


def closure(funcs, heads, ops, seen):
    """A function's reachable statuses. A call resolves to a static function
    of the caller's own file first, else to the non-static one of that name;
    p->member(...) to every function an ops table puts in .member.

    The statuses of a function's callees reach its caller only where the
    caller can return them: when every return of a function returns a
    constant, its own kvt__fail(KVT_X, ...) or a call's value
    (returned_calls), only the calls in its return expressions count (a
    helper that maps whatever its callees say to KVT_ECONN adds KVT_ECONN
    alone); otherwise every call in its body does.

    A kvt_client_* call returns the status the node server answered its
    request with (src/server/client.c relays the reply's status): a client
    function that names a request op KVT_SRV_X reaches what the server's
    handler of X can answer, i.e. that handler's statuses less those of its
    own replying (a failed send is the server's, the client sees the lost
    connection), and less what the client does to its round trip's status
    (a filter such as cancel_answer passes only some codes).

    A call whose value is dropped adds nothing (discarded)."""
    by_name = {}
    for (path, name), (_, static) in funcs.items():
        if not static or path.endswith(".h"):  # a header's static inlines are everyone's
            by_name.setdefault(name, []).append((path, name))
    def ops_targets(path, member):
        return [k for typ, n in ops.get(member, ()) if typ in seen.get(path, ())
                for k in funcs if k[1] == n]

    def resolve(path, name):
        if (path, name) in funcs:
            return [(path, name)]
        return by_name.get(name, [])

    sinks = void_sinks(heads)
    droppable = dropped_calls(heads)
    # functions that never return a status they were given (their every
    # return is a constant, their own kvt__fail(KVT_X, ...) or a call given
    # no status): v = m(..., v) replaces v (guarded_edges)
    passes = {k: replaced(b, heads.get(k, ("", ""))[0]) for k, (b, _) in funcs.items()}

    def replacers(path, body):
        """name -> pass set of the replacers a call in path's body resolves
        to (client.c's lost, not tcp.c's)."""
        out = {}
        for n in set(re.findall(r"\b(\w+)\s*\(", body)):
            ks = resolve(path, n)
            if ks and all(passes.get(k) is not None for k in ks):
                out[n] = set().union(*(passes[k] for k in ks))
        return out
    direct = {k: produced(b, () if returns_field(b) else sinks) for k, (b, _) in funcs.items()}
    handlers = server_handlers(funcs)
    calls, excl = {}, {}
    for (path, f), (b, _) in funcs.items():
        c = set()
        rets = returned_calls(b, heads.get((path, f), ("", ""))[0])
        if rets is not None:
            b = ";".join(rets)
        # a dropped call's status stays out, unless it may come back
        # through a field (return t->result; return kvt__fail(v.status, ...))
        keep_all = rets is not None or returns_field(b) or \
            re.search(r"\breturn\b[^;]*(->|\.)\s*\w*status\w*\b", b)
        for m in re.finditer(r"(->|\.)?\b(\w+)\s*\(", b):
            name = m.group(2)
            if not keep_all and name in droppable and discarded(b, m):
                continue
            if m.group(1):
                c.update(ops_targets(path, name))
            elif name != f:
                c.update(resolve(path, name))
        if path == CLIENT:
            # a request op named as an argument (not compared against)
            named = re.findall(r"(?<![=!]=)(?<![=!]=\s)\b(KVT_SRV_\w+)\b(?!\s*[=!]=)", b)
            for op in set(named) & set(handlers):
                c.add(("<relay>", handlers[op][1]))
        calls[(path, f)] = c
        body = funcs[(path, f)][0]
        for g, codes in guarded_edges(body, replacers(path, body)).items():
            excl[(path, f, g)] = codes
    # The server's answer reaches the client function as the value of its
    # round trip: whatever that function (or the one it hands the op to,
    # plan for LOOKUP) does to the round trip's status applies to the
    # answer too (plan_status, cancel_answer filter it).
    relay_cuts = {}
    for (path, f), (b, _) in funcs.items():
        if path != CLIENT:
            continue
        for m in re.finditer(r"\b(KVT_SRV_\w+)\b", b):
            if m.group(1) not in handlers or ("<relay>", handlers[m.group(1)][1]) not in calls[(path, f)]:
                continue
            via = enclosing_call(b, m.start())
            h = f if via in ROUND_TRIPS else via
            codes = [excl.get((path, h, rt)) for rt in ROUND_TRIPS
                     if re.search(r"\b%s\s*\(" % rt, funcs.get((path, h), ("", False))[0])]
            cut = set.intersection(*[set(c) for c in codes]) \
                if codes and all(c is not None for c in codes) else set()
            # every naming of the op must cut a code for the relay to lose it
            relay_cuts.setdefault((path, f, handlers[m.group(1)][1]), []).append(cut)
    for key, cuts in relay_cuts.items():
        cut = set.intersection(*cuts)
        if cut:
            excl[key] = excl.get(key, set()) | cut
    for op, h in handlers.items():
        if h in funcs:
            direct[("<relay>", h[1])] = direct.get(h, set())
            calls[("<relay>", h[1])] = {k for k in calls.get(h, ()) if k[1] not in SERVER_SEND}
    memo = {}

    def reach(k, stack):
        if k in memo:
            return memo[k]
        if k in stack:
            return direct.get(k, set())
        stack.add(k)
        s = set(direct.get(k, set()))
        for g in calls.get(k, ()):
            s |= reach(g, stack) - excl.get((k[0], k[1], g[1]), set())
        stack.discard(k)
        memo[k] = s
        return s

    def public(name):
        s = set()
        for k in by_name.get(name, []):
            s |= reach(k, set())
        return s

    def answers(op):
        """What the node server's handler of request op can answer with."""
        h = handlers.get(op)
        return reach(("<relay>", h[1]), set()) if h else set()
    public.answers = answers
    public.ops = sorted(handlers)
    return public


def public_functions(header):
    return re.findall(r"^kvt_status\s+(kvt_\w+)\s*\(", header, flags=re.M)


def line_for(codes):
    codes = set(codes) | {"OK"}
    return "/* Returns: " + ", ".join("KVT_" + c for c in STATUS_ORDER if c in codes) + ". */"


def test_functions_run(t):
    """name -> body of the functions of a test file that its main() runs:
    those named in cmocka_unit_test(...) and every function of the file
    they call, transitively. A case in a function no test runs shows
    nothing."""
    funcs = {name: body for name, (body, _, _, _) in functions(t).items()}
    todo = re.findall(r"cmocka_unit_test\w*\(\s*(\w+)", funcs.get("main", ""))
    run = {}
    while todo:
        f = todo.pop()
        if f in run or f not in funcs:
            continue
        run[f] = funcs[f]
        todo.extend(n for n in re.findall(r"\b(\w+)\b", run[f]) if n in funcs)
    return run


def shows(t):
    """The (function, status) pairs a test file shows. Comments and #if 0
    blocks are dropped first, and only the functions main() runs count. A
    pair is shown by EXPECT_ERR(kvt_x(...), KVT_Y, needle...) (the status
    and a message holding each needle; the macro takes at least one), by EXPECT_OK / assert_ok(kvt_x(...))
    for KVT_OK, and by an allocation-failure row {"kvt_x", oom_f, undo_g}
    whose oom_f calls kvt_x (KVT_ENOMEM, message checked by show_enomem).
    A bare assert_status(kvt_x(...), KVT_Y) checks no message: it does not
    count for an error status."""
    # Comments go; strings become "" (a brace in one must not end a body)
    # except a function's name, which an allocation-failure row needs.
    t = re.sub(r'"(?:\\.|[^"\\\n])*"|/\*.*?\*/|//[^\n]*',
               lambda m: (m.group(0) if re.fullmatch(r'"kvt_\w+"', m.group(0)) else '""')
               if m.group(0)[0] == '"' else " ", t, flags=re.S)
    t = re.sub(r"^#if 0\b.*?^#endif\b", "", t, flags=re.S | re.M)
    run = test_functions_run(t)
    shown = set()
    for body in run.values():
        for m in re.finditer(r"\b(EXPECT_ERR|EXPECT_OK|assert_ok)\(\s*(kvt_\w+)\(", body):
            i, depth = m.end(), 1
            while depth and i < len(body):
                depth += (body[i] == "(") - (body[i] == ")")
                i += 1
            if m.group(1) != "EXPECT_ERR":
                shown.add((m.group(2), "OK"))
                continue
            st = re.match(r"\s*,\s*KVT_(\w+)\s*,", body[i:i + 80])
            if st:
                shown.add((m.group(2), st.group(1)))
        for m in re.finditer(r'\{\s*"(kvt_\w+)"\s*,\s*(oom_\w+)\s*,\s*undo_\w+\s*\}', body):
            if re.search(r"\b%s\s*\(" % m.group(1), run.get(m.group(2), "")):
                shown.add((m.group(1), "ENOMEM"))
    return shown


def coverage(want, minimum):
    """Prints the pairs of kvtier.h's Returns: lines that
    no tests/unit/test_api_errors*.c file shows (each file is read on its
    own: its main() decides what runs); fails (1) when fewer than
    minimum are shown (the ctest test_api_coverage keeps the count from
    dropping)."""
    shown = set()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "unit", "test_api_errors*.c"))):
        with open(path) as fh:
            shown |= shows(fh.read())
    pairs = [(f, c) for f, codes in want.items() for c in STATUS_ORDER if c in codes]
    missing = [p for p in pairs if p not in shown]
    for f, c in missing:
        print("not shown: %s KVT_%s" % (f, c))
    n = len(pairs) - len(missing)
    print("test_api_errors*.c show %d of %d (function, status) pairs" % (n, len(pairs)))
    if n < minimum:
        print("status_map: coverage dropped below %d pairs" % minimum)
        return 1
    return 0


ANSWERS = os.path.join(ROOT, "src", "server", "answers.h")


def answers_header(reach):
    """src/server/answers.h: per request op, the statuses the node server's
    handler of it can answer (the same analysis as the Returns: lines), so
    a client refuses any other status in a reply as a protocol error."""
    rows = []
    for op in reach.ops:
        codes = [c for c in STATUS_ORDER if c in reach.answers(op) and c != "OK"]
        bits = " |\n        ".join("KVT__ANSWER(KVT_%s)" % c for c in codes) or "0"
        rows.append("    [%s] = %s," % (op, bits))
    return """/* answers.h - GENERATED by scripts/status_map.py --write (ctest
 * test_status_lists checks it is current); do not edit. For each request op, the
 * failure statuses the node server's handler of it (src/server/conn.c) can
 * put in its reply. client.c takes any other status in a reply as a
 * protocol error: a server (or something on its socket) cannot hand a
 * call a status the call's documentation does not list. */
#ifndef KVT_SERVER_ANSWERS_H
#define KVT_SERVER_ANSWERS_H

#include <stdbool.h>
#include <stdint.h>
#include "server/proto.h"

#define KVT__ANSWER(s) (1u << -(s)) /* statuses are 0 down to KVT_EVERSION (> -32) */

static const uint32_t kvt__srv_answers[KVT_SRV_END_SYNC + 1] = {
%s
};

/* Whether the server may answer request op with failure status. */
static inline bool kvt__srv_answers_with(uint16_t op, int32_t status)
{
    return op <= KVT_SRV_END_SYNC && status < 0 && status >= KVT_EVERSION &&
           (kvt__srv_answers[op] & KVT__ANSWER(status)) != 0;
}

#endif
""" % "\n".join(rows)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    with open(HEADER) as fh:
        header = fh.read()
    funcs, heads, ops, seen = load()
    reach = closure(funcs, heads, ops, seen)
    defined = {name for (_, name), (_, static) in funcs.items() if not static}
    codes = {f: reach(f) | {"OK"} for f in public_functions(header) if f in defined}
    ended = task_results()
    for f in TASK_RESULT_FUNCS & set(codes):
        codes[f] |= ended
    stale = ["%s KVT_%s" % (f, c) for (f, c) in UNREACHABLE if c not in codes.get(f, ())]
    codes = {f: {c for c in cs if (f, c) not in UNREACHABLE} for f, cs in codes.items()}
    if mode == "--coverage":
        return coverage(codes, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    want = {f: line_for(c) for f, c in codes.items()}
    if mode == "":
        for f, line in want.items():
            print(f, line)
        return 0
    lines = header.split("\n")
    out, bad = [], []
    for i, ln in enumerate(lines):
        if ln.startswith("/* Returns: KVT_") and i + 1 < len(lines):
            continue  # regenerated below, above its declaration
        m = re.match(r"^kvt_status\s+(kvt_\w+)\s*\(", ln)
        if m and m.group(1) in want:
            prev = lines[i - 1] if i else ""
            if prev != want[m.group(1)]:
                bad.append("%s: header says %s; the code can return %s" %
                           (m.group(1), prev if prev.startswith("/* Returns:") else "nothing",
                            want[m.group(1)]))
            out.append(want[m.group(1)])
        out.append(ln)
    missing = [f for f in public_functions(header) if f not in defined]
    answers = answers_header(reach)
    with open(ANSWERS) as fh:
        if fh.read() != answers:
            bad.append("src/server/answers.h: not what the server's handlers answer")
    if mode == "--write":
        with open(HEADER, "w") as fh:
            fh.write("\n".join(out))
        with open(ANSWERS, "w") as fh:
            fh.write(answers)
        return 0
    if mode == "--check":
        for b in bad:
            print(b)
        for f in missing:
            print("%s: declared in kvtier.h but not defined in src/" % f)
        for s in stale:
            print("UNREACHABLE lists %s, which the analysis no longer reaches: delete it" % s)
        if bad or missing or stale:
            print("status_map: include/kvtier.h's Returns: lines or src/server/answers.h are stale; "
                  "run scripts/status_map.py --write")
            return 1
        print("status lists ok: %d functions" % len(want))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())

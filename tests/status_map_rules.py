#!/usr/bin/env python3
"""status_map_rules.py - scripts/status_map.py's rules on small C sources:
each case is a public function whose statuses the analysis must (or must
not) list, with a control that shows the rule is what decides."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import status_map as sm  # noqa: E402

SOURCE = r"""
static kvt_status slow(int x)
{
    if (x) return kvt__fail(KVT_ECONN, "closed");
    return kvt__fail(KVT_ETIMEDOUT, "late");
}

/* A dropped call's status is not returned; a kept one is. */
kvt_status kvt_dropped(int x) { kvt_status st = KVT_OK; if (x) slow(x); return st; }
kvt_status kvt_kept(int x) { kvt_status st = slow(x); return st; }

/* A void function's status is what it records, and may come back. */
typedef struct verdict { kvt_status status; } verdict;
static void record(verdict *v) { v->status = KVT_ESTATE; }
kvt_status kvt_recorded(void) { verdict v = {KVT_OK}; record(&v); return kvt__fail(v.status, "x"); }

/* A replacer never returns the status it was given. */
static kvt_status lost(kvt_status st)
{
    switch (st) {
    case KVT_EPROTO: return kvt__fail(KVT_EPROTO, "malformed");
    default: return kvt__fail(KVT_EIO, "gone");
    }
}
kvt_status kvt_replaced(int x)
{
    kvt_status st = slow(x);
    if (st) {
        st = lost(st);
        return st;
    }
    return KVT_OK;
}

/* A filter passes its switch's labelled codes, and only those. */
static kvt_status only_conn(kvt_status st)
{
    switch (st) {
    case KVT_ECONN: return st;
    default: return kvt__fail(KVT_EPROTO, "unexpected");
    }
}
kvt_status kvt_filtered(int x) { kvt_status st = slow(x); st = only_conn(st); return st; }

/* Labels of a switch on something else filter nothing. */
static kvt_status not_filter(kvt_status st, int y)
{
    switch (y) {
    case KVT_ECONN: return st;
    default: return KVT_OK;
    }
}
kvt_status kvt_unfiltered(int x) { kvt_status st = slow(x); st = not_filter(st, x); return st; }

/* A task's result failed with (a LAUNCH of a task that ended first): any
 * status a task can end with (KVT_TASK_RESULTS[]); kvt_recorded above is
 * the control (another struct's status field adds only what it records). */
typedef struct kvt_task_result { kvt_status status; } kvt_task_result;
static void reap(kvt_task_result *r) { (void)r; }
kvt_status kvt_task_carried(void) { kvt_task_result r; reap(&r); return kvt__fail(r.status, "ended"); }
"""

WANT = {
    "kvt_dropped": {"OK"},
    "kvt_kept": {"OK", "ECONN", "ETIMEDOUT"},
    "kvt_recorded": {"OK", "ESTATE"},
    "kvt_replaced": {"OK", "EPROTO", "EIO"},
    "kvt_filtered": {"OK", "ECONN", "EPROTO"},
    "kvt_unfiltered": {"OK", "ECONN", "ETIMEDOUT"},
    "kvt_task_carried": sm.task_results() | {"OK"},
}


class Rules(unittest.TestCase):
    def test_rules(self):
        with tempfile.TemporaryDirectory() as root:
            os.makedirs(os.path.join(root, "src"))
            os.makedirs(os.path.join(root, "include"))
            with open(os.path.join(root, "src", "rules.c"), "w") as f:
                f.write(SOURCE)
            header = os.path.join(root, "include", "kvtier.h")
            with open(header, "w") as f:
                f.write("".join("kvt_status %s(int x);\n" % n for n in WANT))
            sm.ROOT, sm.HEADER = root, header
            reach = sm.closure(*sm.load())
            for name, want in WANT.items():
                with self.subTest(name):
                    self.assertEqual(reach(name) | {"OK"}, want)


if __name__ == "__main__":
    unittest.main()

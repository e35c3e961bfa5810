"""close() while another thread is inside a library call on the same handle.

ctypes releases the GIL during a foreign call, so a thread can be blocked in
a wait while another closes the handle. close() must not destroy the C
object under it: it wakes the wait (a PD room is aborted, a cache task
cancelled, the net under a group or connector interrupted) and waits for it
to return, and only then destroys. The waiting thread gets
a clean status or exception, later calls raise StateError. Under the ASan
library (tests/CMakeLists.txt: python_close_race_asan) a use after free
shows up as a crash report."""
import os
import re
import threading
import time
import unittest

import numpy as np

from _util import HERE, skip_if_unloadable, quiet_pd_logs


# A wait's timeout: close() must return well before it where it can wake
# the wait. Nothing waits it out when close() works (the waits end when
# close() wakes them, the spinners when a call raises StateError), so it
# can be long: a close() that sits out a wait takes ~LONG, far above
# CLOSE_BOUND, which is far above a close() that wakes it (milliseconds;
# this runs under ASan too, on loaded machines). It was LONG = 6 s with
# LONG / 2 = 3 s as the bound: 3 s of room on either side.
LONG = 20.0
CLOSE_BOUND = 8.0


def setUpModule():
    skip_if_unloadable()
    global kvtier, KVPoll, pdw, _restore_quiet
    _restore_quiet = quiet_pd_logs()
    import kvtier
    from kvtier import KVPoll
    import pd_worker as pdw


_restore_quiet = None


def tearDownModule():
    if _restore_quiet:
        _restore_quiet()


class Blocked:
    """Runs fn() on a thread; .result / .error once it returned."""

    def __init__(self, fn):
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            self.error = e

    def join(self, timeout):
        self.thread.join(timeout)
        return not self.thread.is_alive()


def inside(handle, what, timeout=10):
    """Waits until a library call on handle is in flight, then a little more so
    that the thread is inside the C function."""
    deadline = time.monotonic() + timeout
    while handle._calls_in_flight() == 0:
        if time.monotonic() > deadline:
            raise AssertionError("%s never started" % what)
        time.sleep(0.001)
    time.sleep(0.1)


def timed_close(handle):
    t0 = time.monotonic()
    handle.close()
    return time.monotonic() - t0


class PDWaits(unittest.TestCase):
    """A PD wait is woken by close(): the endpoint aborts the room first."""

    def setUp(self):
        self.closing = []
        try:
            self.bs = self.own(kvtier.BootstrapServer())
            self.seng, self.spages = pdw.engine(1, 0, 16, 20)
            self.reng, self.rpages = pdw.engine(1, 0, 8, 20)
            self.own(self.seng)
            self.own(self.reng)
            self.s = self.own(kvtier.Sender(self.bs, engine=self.seng, connect_timeout=10))
            self.rc = self.own(kvtier.Receiver(self.bs, engine=self.reng, connect_timeout=10))
        except BaseException:
            self.tearDown()
            raise

    def own(self, h):
        self.closing.append(h)
        return h

    def tearDown(self):
        while self.closing:
            self.closing.pop().close()

    def check_closed(self, ep):
        self.assertTrue(ep.closed)
        for fn in (lambda: ep.poll(1), lambda: ep.wait(1, 1), lambda: ep.info(1),
                   lambda: ep.abort(1), lambda: ep.clear(1)):
            with self.assertRaises(kvtier.StateError) as cm:
                fn()
            self.assertIn("%s is closed" % type(ep).__name__, str(cm.exception))
        ep.close()  # idempotent

    def test_receiver_wait_then_close(self):
        self.rc.room(11, self.rpages, 20)  # the prefill rank never claims it
        b = Blocked(lambda: self.rc.wait(11, LONG))
        inside(self.rc, "Receiver.wait")
        took = timed_close(self.rc)
        self.assertTrue(b.join(LONG + 5), "the waiting thread is stuck")
        self.assertLess(took, CLOSE_BOUND, "close() sat out the wait instead of waking it")
        self.assertIsNone(b.error, repr(b.error))
        self.assertEqual(b.result, KVPoll.Failed)
        self.check_closed(self.rc)
        # the engine it borrowed is still open and usable
        self.assertFalse(self.reng.closed)
        self.reng.poison(self.rpages)

    def test_sender_wait_then_close(self):
        self.s.room(3)  # Bootstrapping: the decode rank never opens it
        b = Blocked(lambda: self.s.wait(3, LONG))
        inside(self.s, "Sender.wait")
        took = timed_close(self.s)
        self.assertTrue(b.join(LONG + 5), "the waiting thread is stuck")
        self.assertLess(took, CLOSE_BOUND, "close() sat out the wait instead of waking it")
        self.assertIsNone(b.error, repr(b.error))
        self.assertEqual(b.result, KVPoll.Failed)
        self.check_closed(self.s)
        self.assertRaises(kvtier.StateError, lambda: self.s.port)

    def test_engine_close_closes_the_waiting_receiver_first(self):
        self.rc.room(12, self.rpages, 20)
        waits = [Blocked(lambda: self.rc.wait(12, LONG)) for _ in range(3)]
        inside(self.rc, "Receiver.wait")
        took = timed_close(self.reng)  # the receiver borrows the engine: closed first
        for b in waits:
            self.assertTrue(b.join(LONG + 5), "a waiting thread is stuck")
            self.assertIsNone(b.error, repr(b.error))
            self.assertEqual(b.result, KVPoll.Failed)
        self.assertLess(took, CLOSE_BOUND)
        self.assertTrue(self.reng.closed)
        self.check_closed(self.rc)
        self.assertRaises(kvtier.StateError, self.reng.poison, self.rpages)

    def test_polls_racing_close(self):
        self.rc.room(13, self.rpages, 20)
        stop = time.monotonic() + LONG

        def spin():
            while time.monotonic() < stop:  # until close() makes a call raise StateError
                self.rc.poll(13)
                self.rc.info(13)

        spinners = [Blocked(spin) for _ in range(3)]
        time.sleep(0.05)
        self.rc.close()
        for b in spinners:
            self.assertTrue(b.join(LONG + 5))
            self.assertIsInstance(b.error, kvtier.StateError)


class CacheCalls(unittest.TestCase):
    """Cache calls from several threads while it is closed; a wait on a
    running task."""

    def setUp(self):
        self.geo = kvtier.Geometry.uniform(4, 16, 2, 16)
        self.cfg = kvtier.Config({"cpu_capacity": "16MiB", "block_tokens": 16})
        self.eng = kvtier.EmulatedEngine(self.geo, 256)
        self.cache = kvtier.Cache(self.cfg, self.geo)
        self.cache.register_engine(self.eng)

    def tearDown(self):
        for h in (self.cache, self.eng, self.cfg, self.geo):
            h.close()

    def test_calls_racing_close(self):
        stop = time.monotonic() + LONG

        def spin(seed):
            tok = np.arange(seed * 10000, seed * 10000 + 160)
            while time.monotonic() < stop:
                plan = self.cache.prepare_store(tok)
                if plan.task:
                    self.cache.launch(plan.task, list(range(seed * 10, seed * 10 + 10)))
                    self.cache.wait(plan.task, LONG)
                m = self.cache.lookup(tok)
                if m.task:
                    self.cache.cancel(m.task)
                    self.cache.wait(m.task, LONG)
                self.cache.stats()
                self.cache.poll()

        spinners = [Blocked(lambda s=s: spin(s)) for s in range(4)]
        time.sleep(0.1)
        took = timed_close(self.cache)
        for b in spinners:
            self.assertTrue(b.join(LONG + 5))
            # StateError; or a wait whose task close() cancelled (ECANCELED),
            # which the loop then meets as NotFound
            self.assertIsInstance(b.error, kvtier.KvtierError, repr(b.error))
        self.assertLess(took, CLOSE_BOUND)
        self.assertTrue(self.cache.closed)
        self.assertTrue(self.cache.geometry.closed)
        self.assertRaises(kvtier.StateError, self.cache.stats)
        self.assertFalse(self.eng.closed)

    def test_wait_on_a_running_load_then_close(self):
        tok = np.arange(2000, 2000 + 16 * 200)
        pages = list(range(200))
        self.eng.fill(tok, pages)
        plan = self.cache.prepare_store(tok)
        self.cache.launch(plan.task, pages)
        self.assertTrue(self.cache.wait(plan.task, LONG).ok)
        m = self.cache.lookup(tok)
        self.assertGreater(m.matched_tokens, 0)
        self.cache.launch(m.task, pages)
        b = Blocked(lambda: self.cache.wait(m.task, LONG))
        took = timed_close(self.cache)
        self.assertTrue(b.join(LONG + 5))
        self.assertLess(took, CLOSE_BOUND)
        if b.error is not None:  # close() came first
            self.assertIsInstance(b.error, kvtier.StateError)
        else:  # the load ended, or close() cancelled it
            self.assertIn(b.result.status, (0, kvtier.STATUS["ECANCELED"]), b.result)


class GroupCalls(unittest.TestCase):
    """A group exchange, a connect or the handshake of a Group being created,
    blocked on another thread, is woken by close() through
    kvt_net_interrupt: close returns in well under the call's deadline
    (T = 30 s here), the call raises."""

    def test_close_group_while_a_step_blocks(self):
        T = 30.0
        fab = kvtier.Fabric(2)
        ranks = [kvtier.EmulatedRank(r, tp=2, transport=("inproc", fab), timeout=T)
                 for r in range(2)]
        try:
            joins = [Blocked(lambda r=r: r.join(5.0)) for r in ranks]
            for j in joins:
                self.assertTrue(j.join(10))
                self.assertIsNone(j.error, repr(j.error))
            r0 = ranks[0]
            b = Blocked(lambda: r0.connector.step(1))  # rank 1 never steps: it ends at the deadline
            inside(r0.connector, "Connector.step")
            took = timed_close(r0.group)  # closes the connector first, waking its step
            self.assertTrue(b.join(10))
            self.assertLess(took, 5)  # not the 2T = 60 s of the step's deadline
            self.assertIsInstance(b.error, kvtier.GroupAborted, repr(b.error))
            self.assertIn("stopped waiting: net inproc: rank 0: receive interrupted", str(b.error))
            self.assertTrue(r0.connector.closed)
            self.assertRaises(kvtier.StateError, r0.connector.step, 2)
            self.assertRaises(kvtier.StateError, r0.group.info)
            self.assertFalse(r0.cache.closed)
            r0.cache.stats()
        finally:
            for r in ranks:
                r.close()
            fab.close()

    def test_close_net_while_connect_blocks(self):
        net = kvtier.Net.tcp(0, 2)  # the hub; no peer ever comes
        b = Blocked(lambda: net.connect(30.0))
        inside(net, "Net.connect")
        took = timed_close(net)
        self.assertTrue(b.join(10))
        self.assertLess(took, 5)  # not the connect's 30 s
        self.assertIsInstance(b.error, kvtier.KvtierError, repr(b.error))
        self.assertEqual(b.error.status, kvtier.STATUS["ECANCELED"], repr(b.error))
        self.assertIn("interrupted", str(b.error))
        self.assertRaises(kvtier.StateError, lambda: net.port)

    def test_close_net_while_group_handshake_blocks(self):
        T = 30.0
        fab = kvtier.Fabric(2)
        net = kvtier.Net.inproc(fab, 0)
        try:
            # rank 1 never calls Group(...): rank 0's handshake waits for it
            b = Blocked(lambda: kvtier.Group(net, 1, 1, 2, 1, 1, timeout=T))
            inside(net, "the handshake in Group(...)")  # it holds a use of the net
            took = timed_close(net)  # closes the group being created first, waking it
            self.assertTrue(b.join(5), "Group(...) sat out the handshake's deadline")
            self.assertLess(took, 5)  # not the handshake's deadline (up to 2T = 60 s)
            self.assertIsNone(b.result)
            # the handshake refuses to form (KVT_ECANCELED), naming the interrupt
            self.assertIsInstance(b.error, kvtier.Cancelled, repr(b.error))
            self.assertEqual(b.error.status, kvtier.STATUS["ECANCELED"], repr(b.error))
            self.assertIn("stopped waiting for rank 1's hello", str(b.error))
            self.assertIn("receive interrupted (kvt_net_interrupt)", str(b.error))
            self.assertTrue(net.closed)
            self.assertRaises(kvtier.StateError, net.interrupt)
        finally:
            net.close()
            fab.close()

    def test_interrupt_from_another_thread(self):
        hub = kvtier.Net.tcp(0, 2)
        member = kvtier.Net.tcp(1, 2, port=hub.port)  # the hub never answers its handshake
        try:
            b = Blocked(lambda: member.connect(30.0))
            inside(member, "Net.connect")
            t0 = time.monotonic()
            member.interrupt()
            self.assertTrue(b.join(10))
            self.assertLess(time.monotonic() - t0, 5)
            self.assertEqual(b.error.status, kvtier.STATUS["ECANCELED"], repr(b.error))
            with self.assertRaises(kvtier.KvtierError) as e:
                member.connect(1.0)  # and every later one
            self.assertIn("interrupted", str(e.exception))
        finally:
            member.close()
            hub.close()


class SameThread(unittest.TestCase):
    """close() on a thread that is itself inside a call on the handle (a
    signal handler, a callback) must not wait for itself: the handle is
    marked closed at once and destroyed when that call's use ends."""

    def test_close_inside_a_use_is_deferred(self):
        cfg = kvtier.Config()
        with cfg._use():
            cfg.close()  # returns: does not wait for this thread's own call
            self.assertTrue(cfg.closed)
            self.assertTrue(cfg._h, "destroyed under a call in flight")
            self.assertRaises(kvtier.StateError, cfg.get, "cpu_capacity")
        self.assertFalse(cfg._h, "not destroyed once the call ended")

    def test_borrowers_are_destroyed_before_their_owners(self):
        geo = kvtier.Geometry.uniform(2, 16, 1, 16)
        with kvtier.Config({"cpu_capacity": "1MiB", "block_tokens": 16}) as cfg:
            eng = kvtier.EmulatedEngine(geo, 8)
            cache = kvtier.Cache(cfg, geo)
            cache.register_engine(eng)
            with cache._use():
                eng.close()  # closes the cache first; both wait for this thread's call
                self.assertTrue(cache.closed and eng.closed)
                self.assertTrue(cache._h and eng._h)
            self.assertFalse(cache._h or eng._h)
        geo.close()

    def test_del_never_waits(self):
        cfg = kvtier.Config()
        cfg.__del__()
        self.assertTrue(cfg.closed)
        cfg.__del__()


class EveryCallIsGuarded(unittest.TestCase):
    """The binding's own calls pass Handles (guarded by _handle.call), never
    raw pointers: `.handle` and `._h` appear only in _handle.py and in the
    _wake hooks (which close() runs while the C object still exists)."""

    def test_no_raw_pointer_in_calls(self):
        pkg = os.path.join(os.path.dirname(HERE), "kvtier")
        bad = []
        for name in sorted(os.listdir(pkg)):
            if not name.endswith(".py") or name == "_handle.py":
                continue
            func = None
            with open(os.path.join(pkg, name)) as f:
                for i, line in enumerate(f, 1):
                    m = re.match(r"\s*def (\w+)", line)
                    if m:
                        func = m.group(1)
                    if re.search(r"\w\.handle\b", line) or (re.search(r"\._h\b", line)
                                                            and func != "_wake"):
                        bad.append("%s:%d: %s" % (name, i, line.strip()))
        self.assertEqual(bad, [], "raw handles bypass the close() guard")


if __name__ == "__main__":
    unittest.main()

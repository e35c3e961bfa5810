"""The prefill -> decode hand-off (kvtier.pd) between emulated engines on
127.0.0.1: TP 2 -> TP 4 with every byte verified, SGLang's KVPoll
numbering and state order, abort from the decode side, a geometry the plan
refuses, bad arguments, closed handles, and a prefill rank in another
process over TCP. Every wait is bounded."""
import json
import os
import select
import subprocess
import sys
import time
import unittest

import numpy as np

from _util import HERE, skip_if_unloadable, quiet_pd_logs




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


WAIT_S = 10


def wait_until(fn, what, timeout=WAIT_S):
    """Polls fn() until it is true (or fails the test after timeout s)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("still waiting for %s after %s s" % (what, timeout))
        time.sleep(0.002)


class Cluster:
    """A bootstrap service, prefill ranks (TP ptp, pages of ptpp tokens,
    filled with the request) and decode ranks (TP dtp, poisoned pages of
    dtpp tokens), all in this process."""

    def __init__(self, ptp, dtp, ntok, ptpp=16, dtpp=8, dlayout=None, secret=None,
                 pre_kw=None, dec_kw=None):
        self.ntok = ntok
        self.tokens = pdw.tokens(ntok)
        self.closing = []
        self.bs = self.own(kvtier.BootstrapServer(secret=secret))
        self.pre, self.dec = [], []
        for r in range(ptp):
            eng, pages = pdw.engine(ptp, r, ptpp, ntok)
            self.own(eng)
            eng.fill(self.tokens, pages, ns=pdw.NS)
            s = self.own(kvtier.Sender(self.bs, engine=eng, tp_size=ptp, tp_rank=r, secret=secret,
                                       bootstrap_timeout=WAIT_S, connect_timeout=WAIT_S,
                                       **(pre_kw or {})))
            self.pre.append((s, eng, pages))
        for r in range(dtp):
            eng, pages = pdw.engine(dtp, r, dtpp, ntok, dlayout)
            self.own(eng)
            eng.poison(pages)
            rc = self.own(kvtier.Receiver(self.bs.address, engine=eng, tp_size=dtp, tp_rank=r,
                                          secret=secret, connect_timeout=WAIT_S,
                                          **(dec_kw or {})))
            self.dec.append((rc, eng, pages))

    def own(self, h):
        self.closing.append(h)
        return h

    def close(self):
        while self.closing:
            self.closing.pop().close()


class HandOff(unittest.TestCase):
    """Prefill and decode ranks as objects of one process."""

    def test_tp2_to_tp4_every_byte_verified(self):
        ntok = 100
        cl = Cluster(2, 4, ntok, ptpp=16, dtpp=8, dlayout=kvtier.PAGE_FIRST)
        try:
            self.assertEqual(cl.bs.stats().prefill_ranks, 2)
            # decode first (SGLang's order): pages as a list on two ranks, numpy on the others
            for i, (rc, _, pages) in enumerate(cl.dec):
                rc.room(7, pages.tolist() if i % 2 else pages, ntok)
            for s, _, pages in cl.pre:
                s.room(7)
                s.send(7, pages, ntok)
            per_dec = ntok * pdw.LAYERS * 2 * (pdw.HEADS // 4) * pdw.HEAD_DIM * 2
            for i, (rc, eng, pages) in enumerate(cl.dec):
                self.assertEqual(rc.wait(7, WAIT_S), KVPoll.Success, rc.info(7).message)
                info = rc.info(7)
                self.assertEqual((info.state, info.error, info.message), (KVPoll.Success, 0, ""))
                self.assertEqual(info.bytes, per_dec)
                self.assertEqual(info.peers, 1)  # 2 heads of a TP 4 rank sit on one TP 2 rank
                v = eng.verify(cl.tokens, pages, ns=pdw.NS)
                self.assertEqual(v.mismatches, 0, "decode rank %d: %r" % (i, v))
                self.assertEqual(v.bytes_checked, per_dec)
            for s, _, _ in cl.pre:
                self.assertEqual(s.wait(7, WAIT_S), KVPoll.Success)
                self.assertEqual(s.info(7).bytes, 2 * per_dec)
                self.assertEqual(s.info(7).peers, 2)
            self.assertGreaterEqual(cl.bs.stats().lookups, 4)

            # The same links, room id reused once both sides cleared it, with
            # a prefix the decode side already holds: only [13, ntok) moves.
            for s, _, _ in cl.pre:
                s.clear(7)
                self.assertRaises(kvtier.NotFound, s.poll, 7)
            for rc, eng, pages in cl.dec:
                rc.clear(7)
                self.assertRaises(kvtier.NotFound, rc.poll, 7)
                eng.poison(pages)
                rc.room(7, pages, ntok, prefix_tokens=13)
            for s, _, pages in cl.pre:
                s.room(7)
                s.send(7, pages, ntok)
            for rc, eng, pages in cl.dec:
                self.assertEqual(rc.wait(7, WAIT_S), KVPoll.Success, rc.info(7).message)
                self.assertEqual(rc.info(7).bytes, per_dec // ntok * (ntok - 13))
                self.assertEqual(eng.verify(cl.tokens, pages, 13, ns=pdw.NS).mismatches, 0)
                self.assertGreater(eng.verify(cl.tokens, pages, 0, 13, ns=pdw.NS).mismatches, 0,
                                   "the prefix was sent although the decode side had it")
        finally:
            cl.close()

    def test_checksum_threads_one_side_each(self):
        # a thread per link on one side, inline on the other: the digests
        # must agree (a wrong one fails the room ECORRUPT), both ways
        ntok = 300
        for pre, dec in ((True, False), (False, True)):
            cl = Cluster(1, 2, ntok, pre_kw=dict(checksum_threads=pre), dec_kw=dict(checksum_threads=dec))
            try:
                for rc, _, pages in cl.dec:
                    rc.room(3, pages, ntok)
                s, _, pages = cl.pre[0]
                s.room(3)
                s.send(3, pages, ntok)
                for rc, eng, pages in cl.dec:
                    self.assertEqual(rc.wait(3, WAIT_S), KVPoll.Success, rc.info(3).message)
                    self.assertEqual(eng.verify(cl.tokens, pages, ns=pdw.NS).mismatches, 0)
            finally:
                cl.close()

    def test_kvpoll_numbering_is_sglangs(self):
        # sglang.srt.disaggregation.base.conn.KVPoll
        sglang = {"Failed": 0, "Bootstrapping": 1, "WaitingForInput": 2, "Transferring": 3,
                  "Success": 4}
        self.assertEqual({p.name: int(p) for p in KVPoll}, sglang)
        self.assertIs(kvtier.KVPoll, kvtier.pd.KVPoll)
        from kvtier import _lib
        for p in KVPoll:  # the library's own table (kvt_pd_poll_name)
            self.assertEqual(_lib.cstr(_lib.lib.kvt_pd_poll_name(int(p))), p.name)
        cl = Cluster(1, 1, 40)
        try:
            (s, _, spages), (rc, _, rpages) = cl.pre[0], cl.dec[0]
            s.room(3)
            self.assertIs(type(s.poll(3)), KVPoll)
            self.assertEqual(s.poll(3), KVPoll.Bootstrapping)  # no page table yet
            rc.room(3, rpages, 40)
            wait_until(lambda: rc.poll(3) == KVPoll.WaitingForInput, "decode WaitingForInput")
            wait_until(lambda: s.poll(3) == KVPoll.WaitingForInput, "prefill WaitingForInput")
            self.assertEqual(s.info(3).state, KVPoll.WaitingForInput)
            s.send(3, spages, 40)
            self.assertEqual(s.wait(3, WAIT_S), KVPoll.Success)
            self.assertEqual(rc.wait(3, WAIT_S), KVPoll.Success)
            self.assertIsNone(rc.info(3).exception())
        finally:
            cl.close()

    def test_wait_timeout_carries_the_state(self):
        cl = Cluster(1, 1, 20)
        try:
            rc, _, pages = cl.dec[0]
            rc.room(11, pages, 20)  # the prefill engine never claims it
            t0 = time.monotonic()
            with self.assertRaises(kvtier.Timeout) as cm:
                rc.wait(11, 0.05)
            # A wait that ignores its 50 ms timeout (or takes it for 50 s)
            # runs until the room ends, which here is never: WAIT_S / 2 =
            # 5 s still fails it, and leaves a loaded machine seconds for a
            # 50 ms wait (the bound was 2 s).
            self.assertLess(time.monotonic() - t0, WAIT_S / 2)
            self.assertIn(cm.exception.state, (KVPoll.Bootstrapping, KVPoll.WaitingForInput))
            self.assertIn("kvt_pd_receiver_wait: room 11 still", cm.exception.message)
        finally:
            cl.close()

    def test_abort_from_decode_fails_prefill(self):
        ntok = 50
        cl = Cluster(2, 1, ntok)  # one decode rank fed by both prefill ranks
        try:
            rc, eng, rpages = cl.dec[0]
            for s, _, _ in cl.pre:
                s.room(5)
            rc.room(5, rpages, ntok)
            for s, _, _ in cl.pre:
                wait_until(lambda: s.poll(5) == KVPoll.WaitingForInput, "prefill WaitingForInput")
            rc.abort(5, "client disconnected")
            self.assertEqual(rc.poll(5), KVPoll.Failed)
            for s, _, spages in cl.pre:
                self.assertEqual(s.wait(5, WAIT_S), KVPoll.Failed)
                info = s.info(5)
                self.assertEqual(info.error_name, "KVT_EABORTED")
                self.assertIn("aborted: client disconnected", info.message)
                self.assertIsInstance(info.exception(), kvtier.Aborted)
                with self.assertRaises(kvtier.StateError):  # a failed room takes no input
                    s.send(5, spages, ntok)
            info = wait_until(lambda: (lambda i: i if i.abort_acks == 2 else None)(rc.info(5)),
                              "2 abort acknowledgements")
            self.assertEqual((info.state, info.error_name, info.peers),
                             (KVPoll.Failed, "KVT_EABORTED", 2))
            # cleared on both sides, the room id works again
            rc.clear(5)
            for s, _, spages in cl.pre:
                s.clear(5)
                s.room(5)
                s.send(5, spages, ntok)
            eng.poison(rpages)
            rc.room(5, rpages, ntok)
            self.assertEqual(rc.wait(5, WAIT_S), KVPoll.Success, rc.info(5).message)
            self.assertEqual(eng.verify(cl.tokens, rpages, ns=pdw.NS).mismatches, 0)
        finally:
            cl.close()

    def test_into_numpy_buffers(self):
        # a decode engine's own numpy buffers (layer-first), same geometry:
        # its pages must hold exactly the prefill engine's bytes
        ntok = 40
        req = pdw.tokens(ntok)
        with kvtier.BootstrapServer() as bs, pdw.geometry(1, 16) as g:
            peng, ppages = pdw.engine(1, 0, 16, ntok)
            with peng, kvtier.Sender(bs, engine=peng, connect_timeout=WAIT_S) as s:
                peng.fill(req, ppages, ns=pdw.NS)
                row = 16 * g.token_bytes(0, 0)
                bufs = [[np.full((6, row), 0xEE, np.uint8) for _ in range(2)] for _ in range(3)]
                dpages = np.array([5, 0, 3], np.uint32)
                with kvtier.Receiver(bs, g, num_pages=6, buffers=bufs,
                                     connect_timeout=WAIT_S) as rc:
                    rc.room(9, dpages, ntok)
                    s.room(9)
                    s.send(9, ppages, ntok)
                    self.assertEqual(rc.wait(9, WAIT_S), KVPoll.Success, rc.info(9).message)
                tail = (ntok % 16) * g.token_bytes(0, 0)
                for l in range(3):
                    for c in range(2):
                        src, dst = peng.buffer(l, c), bufs[l][c]
                        for i, (pp, dp) in enumerate(zip(ppages, dpages)):
                            n = row if i < 2 else tail
                            np.testing.assert_array_equal(dst[dp][:n], src[pp][:n])
                        # nothing else written: other pages, past the last token
                        self.assertTrue((dst[[1, 2, 4]] == 0xEE).all())
                        self.assertTrue((dst[dpages[2]][tail:] == 0xEE).all())

    def test_ucx_transport(self):
        # UCX over its tcp transport on loopback (as tests/unit/test_conc_pd_ucx.c)
        env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():
            os.environ.setdefault(k, v)
        ntok, closing = 40, []
        try:
            with kvtier.BootstrapServer() as bs:
                req = pdw.tokens(ntok)
                peng, ppages = pdw.engine(1, 0, 16, ntok)
                closing.append(peng)
                peng.fill(req, ppages, ns=pdw.NS)
                try:
                    s = kvtier.Sender(bs, engine=peng, transport="ucx", connect_timeout=WAIT_S)
                except (kvtier.Unsupported, kvtier.IOFailure) as e:
                    self.skipTest("UCX unavailable: %s" % e)
                closing.append(s)
                decs = []
                for r in range(2):
                    eng, pages = pdw.engine(2, r, 8, ntok)
                    closing.append(eng)
                    eng.poison(pages)
                    rc = kvtier.Receiver(bs, engine=eng, tp_size=2, tp_rank=r, transport="ucx",
                                         connect_timeout=WAIT_S)
                    closing.append(rc)
                    rc.room(1, pages, ntok)
                    decs.append((rc, eng, pages))
                s.room(1)
                s.send(1, ppages, ntok)
                self.assertEqual(s.wait(1, WAIT_S), KVPoll.Success, s.info(1).message)
                for rc, eng, pages in decs:
                    self.assertEqual(rc.wait(1, WAIT_S), KVPoll.Success, rc.info(1).message)
                    self.assertEqual(eng.verify(req, pages, ns=pdw.NS).mismatches, 0)
                while closing:
                    closing.pop().close()
        finally:
            while closing:
                closing.pop().close()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_geometry_the_plan_refuses_names_the_field(self):
        with kvtier.BootstrapServer() as bs:
            peng, _ = pdw.engine(1, 0, 16, 32)
            with peng, kvtier.Sender(bs, engine=peng, connect_timeout=WAIT_S):
                with pdw.geometry(1, 16, head_dim=32) as g, kvtier.EmulatedEngine(g, 8) as deng:
                    t0 = time.monotonic()
                    with self.assertRaises(kvtier.GeometryMismatch) as cm:
                        kvtier.Receiver(bs, engine=deng, connect_timeout=WAIT_S)
                    self.assertLess(time.monotonic() - t0, WAIT_S / 2)  # refused, not timed out
                    msg = str(cm.exception)
                    self.assertIn("KVT_EGEOMETRY", msg)
                    self.assertIn("entry 0 (layer 0 K): bytes_per_head: prefill 32 vs decode 64", msg)
                    self.assertTrue(cm.exception.message.startswith("kvt_pd_receiver_create"), msg)
                # the service kept serving: a matching decode rank connects
                deng2, _ = pdw.engine(1, 0, 8, 32)
                with deng2, kvtier.Receiver(bs, engine=deng2, connect_timeout=WAIT_S) as rc:
                    self.assertFalse(rc.closed)
            self.assertGreaterEqual(bs.stats().lookups, 1)


class Arguments(unittest.TestCase):
    """Bad input raises (Python-side or with the C message); nothing crashes."""

    @classmethod
    def setUpClass(cls):
        cls.cl = Cluster(1, 1, 30)
        cls.s, cls.seng, cls.spages = cls.cl.pre[0]
        cls.rc, cls.reng, cls.rpages = cls.cl.dec[0]

    @classmethod
    def tearDownClass(cls):
        cls.cl.close()

    def test_room_calls(self):
        s, rc = self.s, self.rc
        bad_pages = [[1, -1], "abc", [[1, 2]], [1.5], None, np.array([1, 2], np.float32)]
        for pages in bad_pages:
            self.assertRaises(kvtier.InvalidArgument, rc.room, 1, pages, 30)
            self.assertRaises(kvtier.InvalidArgument, s.send, 1, pages, 30)
        for room in (-1, 2 ** 64, "7", 1.0, None):
            self.assertRaises(kvtier.InvalidArgument, s.room, room)
            self.assertRaises(kvtier.InvalidArgument, rc.poll, room)
        self.assertRaises(kvtier.InvalidArgument, rc.room, 1, self.rpages, 0)
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            rc.room(1, self.rpages, 30, prefix_tokens=30)
        self.assertIn("kvt_pd_receiver_room: prefix_tokens 30 must be below num_tokens 30",
                      str(cm.exception))
        with self.assertRaises(kvtier.InvalidArgument) as cm:  # past the engine: the C message
            rc.room(1, [0, 1, 2, 9000], 30)
        self.assertIn("9000", str(cm.exception))
        self.assertRaises(kvtier.NotFound, rc.poll, 12345)
        self.assertRaises(kvtier.NotFound, s.info, 12345)
        with self.assertRaises(kvtier.NotFound) as cm:
            s.send(99, self.spages, 30)
        self.assertIn("call kvt_pd_sender_room first", str(cm.exception))
        s.room(99)
        with self.assertRaises(kvtier.StateError) as cm:
            s.room(99)
        self.assertIn("already open", str(cm.exception))
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            s.send(99, self.spages[:1], 30)
        self.assertIn("cannot hold 30 tokens", str(cm.exception))
        for t in (None, -1, "1", float("nan")):
            self.assertRaises(kvtier.InvalidArgument, s.wait, 99, t)
        s.clear(99)

    def test_create_arguments(self):
        ok = dict(engine=self.seng, connect_timeout=1)
        bs = self.cl.bs
        cases = [
            (dict(transport="rdma"), "transport"),
            (dict(secret=b"short"), "secret"),
            (dict(secret=123), "secret"),
            (dict(tp_size=0), "tp_size"),
            (dict(port=70000), "port"),
            (dict(connect_timeout=None), "connect_timeout"),
            (dict(connect_timeout=0), "connect_timeout"),
            (dict(bootstrap_timeout=-1), "bootstrap_timeout"),
            (dict(host=None), "host"),
            (dict(checksum_threads=2), "checksum_threads"),
            (dict(checksum_threads=0), "checksum_threads"),
        ]
        for extra, word in cases:
            with self.assertRaises(kvtier.InvalidArgument, msg=repr(extra)) as cm:
                kvtier.Sender(bs, **dict(ok, **extra))
            self.assertIn(word, str(cm.exception))
        for bootstrap in ("nohost", "h:p", ("127.0.0.1", 0), 17, None):
            self.assertRaises(kvtier.InvalidArgument, kvtier.Sender, bootstrap, **ok)
        # checked by the library, its message names the field
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            kvtier.Sender(bs, tp_size=2, tp_rank=2, **ok)
        self.assertIn("kvt_pd_sender_create: pd: rank: tp_rank 2 / tp_size 2", str(cm.exception))
        with self.assertRaises(kvtier.InvalidArgument) as cm:
            kvtier.Receiver(bs, tp_size=8, kv_head_replicas=3, engine=self.reng, connect_timeout=1)
        self.assertIn("kv_head_replicas 3 does not divide tp_size 8", str(cm.exception))
        # engine memory: missing, both ways, foreign geometry
        with pdw.geometry(1, 16) as g:
            self.assertRaises(kvtier.InvalidArgument, kvtier.Sender, bs, g, connect_timeout=1)
            self.assertRaises(kvtier.InvalidArgument, kvtier.Sender, bs, g, self.seng, num_pages=4,
                              connect_timeout=1)
            self.assertRaises(kvtier.InvalidArgument, kvtier.Sender, bs, g, engine="engine",
                              connect_timeout=1)
            self.assertRaises(kvtier.InvalidArgument, kvtier.Sender, bs, g, num_pages=4,
                              buffers=[[np.zeros(4, np.uint8)] * 2] * 3, connect_timeout=1)
        with pdw.geometry(2, 16) as other:
            self.assertRaises(kvtier.GeometryMismatch, kvtier.Sender, bs, other, self.seng,
                              connect_timeout=1)
        self.assertRaises(kvtier.InvalidArgument, kvtier.BootstrapServer, port=-1)
        self.assertRaises(kvtier.InvalidArgument, kvtier.BootstrapServer, host="::1:x:y" * 20)
        # nobody at that port: the library's connect deadline, not a hang
        with self.assertRaises(kvtier.KvtierError):
            kvtier.Sender(("127.0.0.1", 1), engine=self.seng, connect_timeout=0.3)

    def test_exposed_listener_needs_secret_or_insecure(self):
        # beyond loopback without a secret: refused unless insecure=True
        with self.assertRaisesRegex(kvtier.InvalidArgument, "not a loopback address and no secret"):
            kvtier.BootstrapServer(host="0.0.0.0")
        self.assertRaises(kvtier.InvalidArgument, kvtier.BootstrapServer, host="0.0.0.0", insecure=1)
        kvtier.BootstrapServer(host="0.0.0.0", insecure=True).close()
        kvtier.BootstrapServer(host="0.0.0.0", secret=os.urandom(16)).close()

    def test_struct_layouts_match_the_library(self):
        import ctypes
        from kvtier import _lib, pd
        for name, cls in (("kvt_pd_net_params", pd.NetParams), ("kvt_pd_rank", pd.Rank),
                          ("kvt_pd_params", pd.Params), ("kvt_pd_room_params", pd.RoomParams),
                          ("kvt_pd_room_info", pd.CRoomInfo),
                          ("kvt_pd_bootstrap_stats", pd.CBootstrapStats)):
            self.assertEqual(_lib.lib.kvt_abi_struct_size(name.encode()), ctypes.sizeof(cls), name)

    def test_numpy_buffers_and_closed_handles(self):
        # an engine's own numpy buffers, kept alive by the sender until close
        import gc
        import weakref
        # its own bootstrap service: without a secret, the cluster's live
        # prefill rank tp0/1 is not handed to a second address
        bs = kvtier.BootstrapServer()
        self.addCleanup(bs.close)
        with pdw.geometry(1, 16) as g:
            bufs = [[np.zeros((4, 16 * 8 * 32), np.uint8) for _ in range(2)] for _ in range(3)]
            s = kvtier.Sender(bs, g, num_pages=4, buffers=bufs, connect_timeout=WAIT_S)
        ref = weakref.ref(bufs[2][1])
        del bufs
        gc.collect()
        self.assertIsNotNone(ref(), "the sender let go of memory the library points into")
        self.assertGreater(s.port, 0)
        self.assertEqual(s.num_pages, 4)
        s.close()
        gc.collect()
        self.assertIsNone(ref(), "closed, the sender still holds the engine's arrays")
        s.close()  # idempotent
        self.assertTrue(s.closed)
        for call in (lambda: s.poll(1), lambda: s.room(1), lambda: s.info(1), lambda: s.port):
            self.assertRaises(kvtier.StateError, call)
        # closing the engine closes the endpoint that borrows it first
        eng, _ = pdw.engine(1, 0, 16, 16)
        with kvtier.Sender(bs, engine=eng, connect_timeout=WAIT_S) as s2:
            eng.close()
            self.assertTrue(s2.closed)
        bs.close()
        bs = kvtier.BootstrapServer()
        self.assertEqual(bs.stats(), (0, 0, 0))
        bs.close()
        self.assertRaises(kvtier.StateError, bs.stats)


class TwoProcesses(unittest.TestCase):
    """A prefill rank in a subprocess, two decode ranks (TP 1 -> TP 2, page
    16 -> 4, layer-first -> page-first) here, over TCP with a secret."""

    def test_prefill_in_a_subprocess(self):
        ntok, room = 120, 2 ** 63 + 5
        secret = os.urandom(32)
        with kvtier.BootstrapServer(secret=secret) as bs:
            proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "pd_worker.py"), str(bs.port), str(room),
                 str(ntok), secret.hex()],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
            closing, ranks = [], []
            try:
                # bounded: the worker prints READY or fails within its connect_timeout
                ready = select.select([proc.stdout], [], [], 3 * WAIT_S)[0]
                first = proc.stdout.readline() if ready else "(nothing within %d s)\n" % (3 * WAIT_S)
                if first.strip() != "READY":
                    proc.kill()
                    self.fail("prefill process did not start: %s%s"
                              % (first, proc.communicate(timeout=10)[0]))
                req = pdw.tokens(ntok)
                for r in range(2):
                    eng, pages = pdw.engine(2, r, 4, ntok, kvtier.PAGE_FIRST)
                    closing.append(eng)
                    eng.poison(pages)
                    rc = kvtier.Receiver(bs, engine=eng, tp_size=2, tp_rank=r, secret=secret,
                                         connect_timeout=WAIT_S)
                    closing.append(rc)
                    rc.room(room, pages, ntok)
                    ranks.append((rc, eng, pages))
                for rc, eng, pages in ranks:
                    self.assertEqual(rc.wait(room, WAIT_S), KVPoll.Success, rc.info(room).message)
                    self.assertEqual(eng.verify(req, pages, ns=pdw.NS).mismatches, 0)
                try:
                    out = proc.communicate(timeout=WAIT_S)[0]
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.fail("prefill process still running after %d s" % WAIT_S)
                self.assertEqual(proc.returncode, 0, out)
                res = next(json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT "))
                per_dec = ntok * pdw.LAYERS * 2 * (pdw.HEADS // 2) * pdw.HEAD_DIM * 2
                self.assertEqual(res, {"state": int(KVPoll.Success), "bytes": 2 * per_dec,
                                       "peers": 2, "message": ""})
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
                while closing:
                    closing.pop().close()

if __name__ == "__main__":
    unittest.main()

"""KV events of a real `kvtier serve` (events_endpoint), read as a router
reads vLLM's ZmqEventPublisher: a ZeroMQ SUB socket (pyzmq) and msgpack
(Debian's python3-msgpack, not kvtier's code), multipart (topic, 8-byte
big-endian sequence, EventBatch [ts, events, data_parallel_rank]), and the
ROUTER replay from a sequence number ending with sequence -1. A store
shows as BlockStored (a chain: each hash the parent of the next, medium
CPU, block_size the server's block tokens, token_ids the request's tokens
of those blocks), a CLEAR of the namespace as BlockRemoved of the same
hashes from the CPU tier; the first batch is AllBlocksCleared; sequence
numbers count up from 0 with no gap. With an SSD tier (TierEvents), each
tier's changes: BlockStored DISK once a flush made the blocks durable,
BlockRemoved CPU when their CPU copies give way to other blocks (the SSD
keeps them), BlockStored CPU when a load reads them back, and a CLEAR's
BlockRemoved from both. An endpoint off this host is refused naming the
option."""
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

from _util import skip_if_unloadable
from test_client import kvtier_bin, start_server, stop_server


def setUpModule():
    skip_if_unloadable()
    global kvtier, zmq, msgpack, recv_monitor_message
    import kvtier
    try:
        import msgpack
        import zmq
        from zmq.utils.monitor import recv_monitor_message
    except ImportError as e:  # scripts/deps.sh installs both from Debian
        raise AssertionError("pyzmq and msgpack are needed (python3-zmq, python3-msgpack: "
                             "run scripts/deps.sh): %s" % e)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_joined(sock, endpoint, want_ok=True, timeout=10.0):
    """Connects sock to endpoint and returns once its ZMTP handshake ended,
    as a socket monitor reports it (succeeded; or failed, want_ok False),
    then gives the subscription a SUB sends right after it a moment to reach
    the publisher. A SUB that joins late misses what came before, and the
    fixed sleeps this replaced raced the connect on a loaded host."""
    ok = zmq.EVENT_HANDSHAKE_SUCCEEDED
    failed = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
              zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    mon = sock.get_monitor_socket(ok | failed)
    try:
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not mon.poll(int(left * 1000)):
                raise AssertionError("no ZMTP handshake with %s within %.0f s" % (endpoint, timeout))
            if (recv_monitor_message(mon)["event"] == ok) == want_ok:
                break
    finally:
        sock.disable_monitor()
        mon.close(0)
    time.sleep(0.1)


def decode(frames):
    topic, seq, payload = frames
    batch = msgpack.unpackb(payload, raw=False)
    return topic, int.from_bytes(seq, "big", signed=True), batch


class Subscriber:
    """A SUB socket on a server's events, and the batches it got."""

    def __init__(self, test, port):
        self.test = test
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.events = []  # every event received, in order
        connect_joined(self.sub, "tcp://127.0.0.1:%d" % port)

    def close(self):
        self.sub.close(0)
        self.ctx.term()

    def until(self, pred, what, timeout=10.0):
        """Receives until pred(self.events) holds."""
        deadline = time.monotonic() + timeout
        while not pred(self.events):
            if time.monotonic() > deadline:
                self.test.fail("no %s within %.0f s; got %r" % (what, timeout, self.events))
            if self.sub.poll(100):
                self.events += decode(self.sub.recv_multipart())[2][1]

    def blocks(self, tag, medium):
        """The block hashes of every tag (BlockStored/BlockRemoved) event of
        medium so far, in order."""
        return [h for e in self.events if e[0] == tag and e[-2 if tag == "BlockStored" else 2]
                == medium for h in e[1]]


class Events(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtev")
        self.sock = os.path.join(self.dir, "node.sock")
        self.port, self.rport, self.mport = free_port(), free_port(), free_port()
        self.srv = start_server(self.sock, "--set",
                                "events_endpoint=tcp://127.0.0.1:%d" % self.port, "--set",
                                "events_replay_endpoint=tcp://127.0.0.1:%d" % self.rport,
                                "--set", "events_topic=kv@node1", "--set", "events_dp_rank=3",
                                "--set", "metrics_port=%d" % self.mport)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        connect_joined(self.sub, "tcp://127.0.0.1:%d" % self.port)  # replay has the rest

    def tearDown(self):
        self.sub.close(0)
        self.ctx.term()
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def recv_until(self, pred, timeout=10.0, every=False):
        """Batches until pred(events) of one is true (every: pred of the
        events of all batches so far: a server may publish one store's
        blocks in one batch or two)."""
        got, events = [], []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sub.poll(100):
                t, seq, b = decode(self.sub.recv_multipart())
                got.append((t, seq, b))
                events += b[1]
                if pred(events if every else b[1]):
                    return got
        self.fail("no such batch within %.0f s; got %r" % (timeout, got))

    def replay(self, start):
        r = self.ctx.socket(zmq.DEALER)
        r.connect("tcp://127.0.0.1:%d" % self.rport)
        try:
            r.send_multipart([b"", start.to_bytes(8, "big")])
            out = []
            while True:
                self.assertTrue(r.poll(5000), "no replay answer")
                empty, seq, payload = r.recv_multipart()
                self.assertEqual(empty, b"")
                seq = int.from_bytes(seq, "big", signed=True)
                if seq == -1:
                    self.assertEqual(payload, b"")
                    return out
                out.append((seq, msgpack.unpackb(payload, raw=False)))
        finally:
            r.close(0)

    def store(self, cl, eng, toks):
        plan = cl.prepare_store(toks, ns="tenant-a", visible=True)
        eng.fill(toks, list(range(len(toks) // 16 + 1)), ns="tenant-a")
        cl.launch(plan.task, list(range(len(toks) // 16 + 1)))
        self.assertTrue(cl.wait(plan.task, 5).ok)
        return plan

    def test_keyed_blocks_are_named_by_the_engines_keys(self):
        """A router that computes vLLM's block hashes (here: 32-byte sha256
        digests, as vLLM's are) finds them in the events: a keyed store's
        BlockStored carries the engine's keys, its extension's parent is the
        last key, and a CLEAR removes them by the same names."""
        import hashlib
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        eng = kvtier.EmulatedEngine(geo, 64)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            keys = [hashlib.sha256(b"block-%d" % i).digest() for i in range(6)]
            toks = list(range(5, 5 + 6 * bt))
            pages = list(range(6 * bt // 16))
            for part in (keys[:4], keys):
                plan = cl.prepare_store(keys=part, ns="tenant-k", visible=True)
                eng.fill(toks[:len(part) * bt], pages, ns=None)
                cl.launch(plan.task, pages)
                self.assertTrue(cl.wait(plan.task, 5).ok)
            got = self.recv_until(lambda evs: sum(len(e[1]) for e in evs
                                                  if e[0] == "BlockStored") >= len(keys),
                                  every=True)
            stored = [e for _, _, b in got for e in b[1] if e[0] == "BlockStored"]
            named = [h for e in stored for h in e[1]]
            self.assertEqual(named, keys, stored)
            # kvtier never sees a keyed request's tokens: token_ids stays empty
            self.assertTrue(all(e[3] == [] for e in stored), stored)
            for e in stored:  # parents by the engine's keys too (one event or two)
                i = keys.index(e[1][0])
                self.assertEqual(e[2], keys[i - 1] if i else None, e)
            self.assertEqual(cl.clear("tenant-k"), (6, 0))
            seen, deadline = set(), time.monotonic() + 10
            while seen != set(keys) and time.monotonic() < deadline:
                if self.sub.poll(100):
                    for e in decode(self.sub.recv_multipart())[2][1]:
                        if e[0] == "BlockRemoved":
                            seen.update(e[1])
            self.assertEqual(seen, set(keys))
        eng.close()

    def test_store_and_clear_as_a_router_sees_them(self):
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        eng = kvtier.EmulatedEngine(geo, 64)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            toks = list(range(7, 7 + 4 * bt + 1))
            self.store(cl, eng, toks)
            got = self.recv_until(lambda evs: any(e[0] == "BlockStored" for e in evs))
            t, seq, batch = got[-1]
            self.assertEqual(t, b"kv@node1")
            self.assertEqual(len(batch), 3)
            self.assertIsInstance(batch[0], float)
            self.assertLess(abs(batch[0] - time.time()), 60)
            self.assertEqual(batch[2], 3)  # data_parallel_rank
            stored = [e for e in batch[1] if e[0] == "BlockStored"]
            self.assertEqual(len(stored), 1, batch)
            ev = stored[0]
            self.assertEqual(len(ev), 8)  # tag + vLLM's 7 fields
            hashes, parent, token_ids, block_size, lora_id, medium, lora_name = ev[1:]
            self.assertEqual(len(hashes), 4)
            self.assertTrue(all(isinstance(h, bytes) and len(h) == 16 for h in hashes))
            self.assertEqual(len(set(hashes)), 4)
            self.assertIsNone(parent)  # the request's first block is a root
            # token_ids: the stored blocks' tokens, block_size per block (as
            # vLLM's BlockStored carries them)
            self.assertEqual(token_ids, toks[:4 * bt])
            self.assertEqual((block_size, lora_id, medium, lora_name), (bt, None, "CPU", None))
            # A second request extending the first: its new blocks' parent is
            # the first request's last block.
            more = toks[:-1] + list(range(900, 900 + 2 * bt + 1))
            self.store(cl, eng, more)
            got = self.recv_until(lambda evs: any(e[0] == "BlockStored" for e in evs))
            ext = [e for e in got[-1][2][1] if e[0] == "BlockStored"][0]
            self.assertEqual(len(ext[1]), 2)
            self.assertEqual(ext[2], hashes[-1])
            self.assertEqual(ext[3], more[4 * bt:6 * bt])  # the new blocks' tokens only
            # CLEAR of the namespace: every one of them removed, nothing else.
            removed, kept = cl.clear("tenant-a")
            self.assertEqual((removed, kept), (6, 0))
            seen = set()
            want = set(hashes) | set(ext[1])
            deadline = time.monotonic() + 10
            while seen != want and time.monotonic() < deadline:
                if self.sub.poll(100):
                    for e in decode(self.sub.recv_multipart())[2][1]:
                        if e[0] == "BlockRemoved":
                            self.assertEqual(e[2], "CPU")  # the one tier this node has
                            seen.update(e[1])
            self.assertEqual(seen, want)
        # Replay from 0: every batch, in order, numbered 0, 1, ... with no
        # gap, the first AllBlocksCleared (the server started afresh).
        batches = self.replay(0)
        self.assertGreaterEqual(len(batches), 4)
        self.assertEqual([s for s, _ in batches], list(range(len(batches))))
        self.assertEqual(batches[0][1][1][0], ["AllBlocksCleared"])
        # The server's /metrics counts them (a replay answered, no drop).
        import urllib.request
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.mport,
                                      timeout=10).read().decode()
        m = {l.split()[0]: float(l.split()[1]) for l in body.splitlines()
             if l.startswith("kvtier_events_")}
        self.assertGreaterEqual(m["kvtier_events_batches_total"], len(batches), m)
        self.assertGreaterEqual(m["kvtier_events_blocks_total"], 12, m)  # 6 stored, 6 removed
        self.assertGreaterEqual(m["kvtier_events_replays_total"], 1, m)
        self.assertEqual(m["kvtier_events_dropped_blocks_total"], 0, m)
        # kvtier events prints the same batches as JSON lines.
        r = subprocess.run([kvtier_bin(), "events", "--replay", "tcp://127.0.0.1:%d" % self.rport,
                            "--from", "0"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        self.assertEqual([x["seq"] for x in lines], [s for s, _ in batches])
        self.assertEqual(lines[0]["events"], [{"type": "AllBlocksCleared"}])
        self.assertTrue(all(x["data_parallel_rank"] == 3 for x in lines))
        first = [e for x in lines for e in x["events"] if e["type"] == "BlockStored"][0]
        self.assertEqual(first["block_hashes"], [h.hex() for h in hashes])
        self.assertEqual((first["parent_block_hash"], first["block_size"], first["medium"]),
                         (None, bt, "CPU"))
        # Live, with nothing coming: bounded by --timeout-ms, exit 1 saying so.
        r = subprocess.run([kvtier_bin(), "events", "--endpoint",
                            "tcp://127.0.0.1:%d" % self.port, "--timeout-ms", "300"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no batch from tcp://127.0.0.1:%d within 300 ms" % self.port, r.stderr)
        tail = self.replay(batches[-1][0])
        self.assertEqual(len(tail), 1)
        self.assertEqual(tail[0], batches[-1])
        self.assertEqual(self.replay(batches[-1][0] + 1), [])

    def test_endpoint_off_this_host_is_refused(self):
        r = subprocess.run([kvtier_bin(), "serve", "--socket", os.path.join(self.dir, "x.sock"),
                            "--model", "tiny", "--set", "cpu_capacity=16MiB", "--set",
                            "events_endpoint=tcp://*:5557"],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('events_endpoint is "tcp://*:5557"', r.stderr)
        self.assertIn("tcp://127.0.0.1:PORT", r.stderr)


def curve_keys(secret):
    """The CURVE keys events_secret_file gives, derived as docs/events.md
    (Security) tells a router to: each secret key BLAKE2b-256 of a label, a
    NUL and the secret, each public key Curve25519 of it (Z85 text)."""
    from zmq.utils import z85

    def pair(label):
        sk = z85.encode(hashlib.blake2b(label + b"\0" + secret, digest_size=32).digest())
        return zmq.curve_public(sk), sk
    return pair(b"kvtier-events-server"), pair(b"kvtier-events-client")


class AnyGeometryEvents(unittest.TestCase):
    """docs/events.md's server: `kvtier serve` with no --model, so each
    engine attaches with its own geometry (TP 1 and TP 2 of one model here,
    two tiers), and a block's hash does not say which holds it. The stream
    stays a set: the same tokens stored by both geometries are announced
    once, and removed only when the last geometry lets them go.
    `kvtier events --replay R --endpoint E --count N` prints the batches in
    sequence order from the first on."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtevg")
        self.sock = os.path.join(self.dir, "node.sock")
        self.port, self.rport = free_port(), free_port()
        self.srv = start_server(self.sock, "--set",
                                "events_endpoint=tcp://127.0.0.1:%d" % self.port, "--set",
                                "events_replay_endpoint=tcp://127.0.0.1:%d" % self.rport,
                                model=None)

    def tearDown(self):
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, tp):
        geo = kvtier.Geometry.preset("tiny", 16, tp)
        eng = kvtier.EmulatedEngine(geo, 64)
        cl = kvtier.Client(self.sock, geo, timeout_ms=3000)
        cl.register_engine(eng)
        self.addCleanup(eng.close)
        self.addCleanup(cl.close)
        return cl, eng

    def store(self, cl, eng, first):
        bt = cl.block_tokens
        toks = list(range(first, first + 2 * bt + 1))
        pages = list(range(len(toks) // 16 + 1))
        plan = cl.prepare_store(toks, ns="t", visible=True)
        eng.fill(toks, pages, ns="t")
        cl.launch(plan.task, pages)
        self.assertTrue(cl.wait(plan.task, 5).ok)
        return bt

    def events(self, want, kind):
        """Every event so far (through the CLI: replay, then live), once
        want of kind are among them (10 s at most)."""
        deadline, evs = time.monotonic() + 10, []
        while time.monotonic() < deadline:
            r = subprocess.run([kvtier_bin(), "events", "--replay",
                                "tcp://127.0.0.1:%d" % self.rport, "--endpoint",
                                "tcp://127.0.0.1:%d" % self.port, "--timeout-ms", "300"],
                               capture_output=True, text=True, timeout=30)
            lines = [json.loads(x) for x in r.stdout.splitlines()]
            self.assertEqual([x["seq"] for x in lines], list(range(len(lines))), r.stderr)
            evs = [e for x in lines for e in x["events"]]
            if sum(e["type"] == kind for e in evs) >= want:
                break
        return evs

    def test_the_same_tokens_in_two_geometries_are_one_block_to_a_router(self):
        a, ea = self.client(1)
        b, eb = self.client(2)
        bt = self.store(a, ea, 11)
        self.assertEqual(self.store(b, eb, 11), bt)  # the same tokens, another geometry
        self.store(b, eb, 500)                        # and some only the second holds
        evs = self.events(2, "BlockStored")
        stored = [e for e in evs if e["type"] == "BlockStored"]
        self.assertEqual(len(stored), 2, evs)
        shared, own = stored[0]["block_hashes"], stored[1]["block_hashes"]
        self.assertEqual((len(shared), len(own)), (2, 2))
        self.assertTrue(all(e["block_size"] == bt and e["medium"] == "CPU" for e in stored))
        self.assertEqual(a.clear("t"), (2, 0))  # the first geometry lets go: still held
        self.assertEqual(b.clear("t"), (4, 0))  # the last: now removed, once each
        evs = self.events(1, "BlockRemoved")
        removed = [h for e in evs if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        self.assertEqual(sorted(removed), sorted(shared + own), evs)
        self.assertEqual(sum(e["type"] == "BlockStored" for e in evs), 2)


class EventsCliReplayThenLive(unittest.TestCase):
    """`kvtier events --replay R --endpoint E --count N` (docs/events.md)
    against a publisher scripted here, so the order of what it sees is
    fixed: an XPUB (it hears the CLI's subscription) and a ROUTER replay.
    Every batch comes out once, in sequence order, whatever the timing: a
    batch published while the replay is answered is not lost (the CLI used
    to subscribe only after its replay, missing it and then waiting out its
    timeout), one published before the subscription joined is fetched from
    the replay (a gap), and one the replay printed already is skipped and
    not counted against --count."""

    def setUp(self):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.rep = self.ctx.socket(zmq.ROUTER)
        for s in (self.pub, self.rep):
            s.setsockopt(zmq.LINGER, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.rport = self.rep.bind_to_random_port("tcp://127.0.0.1")
        self.kept = {}  # seq -> payload, what the replay answers from

    def tearDown(self):
        self.pub.close(0)
        self.rep.close(0)
        self.ctx.term()

    def batch(self, seq):
        self.kept[seq] = msgpack.packb([1765000000.0 + seq, [["AllBlocksCleared"]], seq])
        return [b"kv", seq.to_bytes(8, "big", signed=True), self.kept[seq]]

    def publish(self, seq):
        self.pub.send_multipart(self.batch(seq))

    def answer_replay(self, upto):
        """Waits for one replay request and answers the kept batches from
        its start through upto, then the end marker."""
        self.assertTrue(self.rep.poll(10000), "the CLI asked no replay")
        ident, empty, start = self.rep.recv_multipart()
        for seq in range(int.from_bytes(start, "big"), upto + 1):
            if seq not in self.kept:
                self.batch(seq)
            self.rep.send_multipart([ident, empty, seq.to_bytes(8, "big"), self.kept[seq]])
        self.rep.send_multipart([ident, empty, (-1).to_bytes(8, "big", signed=True), b""])

    def wait_subscribed(self):
        self.assertTrue(self.pub.poll(10000), "the CLI never subscribed")
        self.assertEqual(self.pub.recv()[:1], b"\x01")

    def cli(self, count):
        return subprocess.Popen([kvtier_bin(), "events", "--replay",
                                 "tcp://127.0.0.1:%d" % self.rport, "--endpoint",
                                 "tcp://127.0.0.1:%d" % self.port, "--count", str(count),
                                 "--timeout-ms", "5000"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def seqs(self, p):
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        return [json.loads(x)["seq"] for x in out.splitlines()]

    def test_a_batch_published_during_the_replay_is_not_lost(self):
        p = self.cli(4)
        self.wait_subscribed()  # the live stream is subscribed before the replay is asked
        self.publish(2)         # while the replay is being answered
        self.answer_replay(1)   # batches 0 and 1
        self.publish(3)
        self.assertEqual(self.seqs(p), [0, 1, 2, 3])

    def test_from_needs_replay_and_a_start_past_the_stream_times_out(self):
        r = subprocess.run([kvtier_bin(), "events", "--endpoint", "tcp://127.0.0.1:%d" % self.port,
                            "--from", "5"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--from needs --replay", r.stderr)
        p = subprocess.Popen([kvtier_bin(), "events", "--replay", "tcp://127.0.0.1:%d" % self.rport,
                              "--endpoint", "tcp://127.0.0.1:%d" % self.port, "--from", "10",
                              "--timeout-ms", "500"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.wait_subscribed()
        self.answer_replay(9)  # nothing kept from 10 on: the end marker alone
        deadline = time.monotonic() + 20
        while p.poll() is None and time.monotonic() < deadline:
            self.publish(3)  # older than --from: skipped, never printed
            time.sleep(0.05)
        out, err = p.communicate(timeout=30)
        self.assertEqual((p.returncode, out), (1, ""), err)
        self.assertIn("no batch from tcp://127.0.0.1:%d past sequence 9 within 500 ms" % self.port,
                      err)

    def test_a_gap_is_filled_from_the_replay_and_repeats_are_skipped(self):
        p = self.cli(5)
        self.wait_subscribed()
        self.answer_replay(1)   # 0 and 1
        self.publish(1)         # printed by the replay already: skipped, not counted
        self.batch(2)           # kept, never seen live: a gap
        self.publish(3)         # past the next expected: 2 and 3 from the replay
        self.answer_replay(3)
        self.publish(4)
        self.assertEqual(self.seqs(p), [0, 1, 2, 3, 4])


class SecretEvents(unittest.TestCase):
    """events_secret_file: the endpoints may be off this host (bound on every
    interface here), and only a subscriber holding the secret's keys hears
    anything: a router in Python derives them from the docs' rule, and
    `kvtier events --secret-file` from the file; a plain SUB, or one that
    knows the server's public key but not the client's, gets nothing."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtevs")
        self.sock = os.path.join(self.dir, "node.sock")
        self.secret = b"events secret, 32 bytes exactly!"
        self.secret_file = os.path.join(self.dir, "events.secret")
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(self.secret)
        self.port, self.rport = free_port(), free_port()
        self.srv = start_server(self.sock, "--set", "events_endpoint=tcp://*:%d" % self.port,
                                "--set", "events_replay_endpoint=tcp://*:%d" % self.rport,
                                "--set", "events_secret_file=" + self.secret_file)
        self.ctx = zmq.Context()

    def tearDown(self):
        self.ctx.term()
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def sub(self, server_public=None, client=None, let_in=True):
        """A SUB whose handshake with the server ended: let in, or refused."""
        s = self.ctx.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        if server_public:
            s.curve_serverkey = server_public
            s.curve_publickey, s.curve_secretkey = client
        s.setsockopt(zmq.SUBSCRIBE, b"")
        connect_joined(s, "tcp://127.0.0.1:%d" % self.port, let_in)
        return s

    def test_only_the_secrets_holder_hears_the_events(self):
        (spub, _), client = curve_keys(self.secret)
        good = self.sub(spub, client)
        plain = self.sub(let_in=False)
        nosy = self.sub(spub, zmq.curve_keypair(), False)  # the server's public key, its own pair
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        eng = kvtier.EmulatedEngine(geo, 64)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            cl.register_engine(eng)
            toks = list(range(5, 5 + 2 * cl.block_tokens + 1))
            plan = cl.prepare_store(toks, visible=True)
            eng.fill(toks, [0, 1, 2])
            cl.launch(plan.task, [0, 1, 2])
            self.assertTrue(cl.wait(plan.task, 5).ok)
        self.assertTrue(good.poll(10000), "the secret's holder heard nothing")
        events = decode(good.recv_multipart())[2][1]
        self.assertTrue(any(e[0] == "BlockStored" for e in events), events)
        self.assertFalse(plain.poll(1000), "a plain SUB heard a CURVE server")
        self.assertFalse(nosy.poll(1000), "a SUB without the client key got past the ZAP check")
        for s in (good, plain, nosy):
            s.close(0)
        # kvtier events, with the file and without it.
        r = subprocess.run([kvtier_bin(), "events", "--replay", "tcp://127.0.0.1:%d" % self.rport,
                            "--from", "0", "--secret-file", self.secret_file],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        self.assertEqual(lines[0]["events"], [{"type": "AllBlocksCleared"}])
        self.assertTrue(any(e["type"] == "BlockStored" for x in lines for e in x["events"]))
        r = subprocess.run([kvtier_bin(), "events", "--replay", "tcp://127.0.0.1:%d" % self.rport,
                            "--timeout-ms", "1000"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("events_secret_file answers only --secret-file", r.stderr)

    def test_off_host_without_a_secret_needs_events_insecure(self):
        port = free_port()
        args = [kvtier_bin(), "serve", "--socket", os.path.join(self.dir, "x.sock"), "--model",
                "tiny", "--set", "cpu_capacity=16MiB", "--set", "events_endpoint=tcp://*:%d" % port]
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("events_secret_file", r.stderr)
        self.assertIn("events_insecure=true", r.stderr)
        ysock = os.path.join(self.dir, "y.sock")
        srv = start_server(ysock, "--set", "events_endpoint=tcp://*:%d" % port, "--set",
                           "events_insecure=true")
        stop_server(srv)
        with open(ysock + ".log") as f:  # the start warns, naming the exposure
            self.assertIn("tcp://*:%d is off this host with no secret" % port, f.read())


class TierEvents(unittest.TestCase):
    """A server with an SSD tier under a CPU tier of 32 blocks: every tier's
    changes are published as they commit, not only the node's."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtevt")
        self.sock = os.path.join(self.dir, "node.sock")
        self.port = free_port()
        self.srv = start_server(self.sock, "--set", "cpu_capacity=1MiB", "--set",
                                "ssd_dirs=" + os.path.join(self.dir, "ssd"), "--set",
                                "ssd_capacity=16MiB", "--set",
                                "events_endpoint=tcp://127.0.0.1:%d" % self.port)
        self.sub = Subscriber(self, self.port)

    def tearDown(self):
        self.sub.close()
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_each_tier_as_a_router_sees_it(self):
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        eng = kvtier.EmulatedEngine(geo, 80)
        sub = self.sub
        with kvtier.Client(self.sock, geo, timeout_ms=5000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            cpu_blocks = cl.stats()["cpu_blocks_total"]
            self.assertEqual(cpu_blocks, 32)
            pages = list(range(80))
            a = list(range(3, 3 + 4 * bt + 1))
            plan = cl.prepare_store(a, ns="tenant-a", visible=True)
            eng.fill(a, pages, ns="tenant-a")
            cl.launch(plan.task, pages)
            self.assertTrue(cl.wait(plan.task, 5).ok)
            sub.until(lambda ev: len(sub.blocks("BlockStored", "CPU")) >= 4, "BlockStored CPU")
            ha = sub.blocks("BlockStored", "CPU")
            self.assertEqual(len(ha), 4)
            # Durable on the SSD: BlockStored DISK of the same chain, with
            # the same tokens as the CPU one (a server with an SSD tier
            # keeps them for it)
            cl.flush(5)
            sub.until(lambda ev: len(sub.blocks("BlockStored", "DISK")) >= 4, "BlockStored DISK")
            self.assertEqual(sub.blocks("BlockStored", "DISK"), ha)
            disk = [e for e in sub.events if e[0] == "BlockStored" and e[6] == "DISK"]
            cpu = [e for e in sub.events if e[0] == "BlockStored" and e[6] == "CPU"]
            self.assertEqual(disk[0][2], None)  # a's first block is a root
            self.assertTrue(all(e[4] == bt for e in disk), disk)
            self.assertEqual([t for e in disk for t in e[3]], a[:4 * bt])
            self.assertEqual([t for e in cpu for t in e[3]], a[:4 * bt])
            self.assertEqual(sub.blocks("BlockRemoved", "CPU"), [])
            # A store of a whole CPU tier's worth: a's CPU copies give way
            # (the SSD keeps them): BlockRemoved CPU, and no DISK removal
            b = list(range(5000, 5000 + cpu_blocks * bt + 1))
            plan = cl.prepare_store(b, ns="tenant-b", visible=True)
            eng.fill(b, pages, ns="tenant-b")
            cl.launch(plan.task, pages)
            self.assertTrue(cl.wait(plan.task, 5).ok)
            sub.until(lambda ev: set(ha) <= set(sub.blocks("BlockRemoved", "CPU")),
                      "BlockRemoved CPU of a's blocks")
            self.assertEqual(sub.blocks("BlockRemoved", "DISK"), [])
            self.assertEqual(cl.stats()["cpu_dropped_blocks"], 4)
            # A load of a reads it back from the SSD: BlockStored CPU again
            # (no token_ids: those went with the store's)
            cl.flush(5)  # b durable, so its CPU copies can give way in turn
            m = cl.lookup(a, ns="tenant-a")
            self.assertEqual(m.matched_tokens, 4 * bt)
            eng.poison(pages)
            cl.launch(m.task, pages)
            self.assertTrue(cl.wait(m.task, 5).ok)
            self.assertEqual(eng.verify(a, pages, 0, 4 * bt, ns="tenant-a").mismatches, 0)
            sub.until(lambda ev: sub.blocks("BlockStored", "CPU").count(ha[0]) == 2,
                      "BlockStored CPU of a's blocks read back")
            back = [e for e in sub.events if e[0] == "BlockStored" and e[6] == "CPU"
                    and e[1][0] in ha][-1]
            self.assertEqual(back[3], [])
            # CLEAR of a: gone from both tiers
            self.assertEqual(cl.clear("tenant-a"), (4, 0))
            sub.until(lambda ev: set(ha) <= set(sub.blocks("BlockRemoved", "DISK")),
                      "BlockRemoved DISK of a's blocks")
            cpu_removed = sub.blocks("BlockRemoved", "CPU")
            self.assertEqual(sorted(cpu_removed.count(h) for h in ha), [2, 2, 2, 2])
        eng.close()


if __name__ == "__main__":
    unittest.main()

"""The cluster tier as it is deployed: a redis-server and three `kvtier
serve` processes (no model: each takes its clients' geometry) joined
through it, and engine processes (client_worker.py) attached to different
nodes. A prefix stored through node A is a hit on node B (pulled from A),
every loaded byte verified against what A's engine wrote; token and keyed
requests. Faults: a holder SIGKILLed is a miss within the pull deadline; a
Redis that goes away costs no local hit and, once back, gets the nodes'
holdings again; a peer without the cluster secret pulls nothing; a
restarted node's earlier entries are never served."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from _util import skip_if_unloadable
from test_client import kvtier_bin, start_server, stop_server, worker

BLOCKS = 4  # client_worker.py's request: 4 blocks


def setUpModule():
    skip_if_unloadable()
    if not shutil.which("redis-server"):  # scripts/deps.sh installs it
        raise AssertionError("redis-server is needed (Debian's redis-server: run scripts/deps.sh)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def redis_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Redis:
    def __init__(self, d, port):
        self.dir, self.port, self.p = d, port, None

    def start(self):
        self.p = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--dir", self.dir],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not redis_ping(self.port):
            if time.monotonic() > deadline or self.p.poll() is not None:
                raise AssertionError("redis-server did not start on port %d" % self.port)
            time.sleep(0.05)

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


class Cluster(unittest.TestCase):
    secret = None

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtcl")
        self.redis = Redis(self.dir, free_port())
        self.redis.start()
        self.nodes = {}
        for name in ("a", "b", "c"):
            self.start_node(name)

    def tearDown(self):
        for p in self.nodes.values():
            if p.poll() is None:
                stop_server(p)
        self.redis.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def redis_url(self):
        return "127.0.0.1:%d" % self.redis.port

    def sock(self, name):
        return os.path.join(self.dir, name + ".sock")

    def start_node(self, name, secret=None, more=()):
        extra = ["--set", "cluster_redis=" + self.redis_url(),
                 "--set", "cluster_node=node-" + name, "--set", "cluster_lease_ms=1500",
                 "--set", "cluster_pull_ms=2000", "--set", "log_level=info"]
        secret = secret or self.secret
        if secret:
            path = os.path.join(self.dir, name + ".secret")
            with open(path, "wb") as f:
                f.write(secret)
            extra += ["--set", "cluster_secret_file=" + path]
        # every node serves metrics (published() reads its backlog) unless
        # the test picks the port
        given = [m for m in more if str(m).startswith("metrics_port=")]
        port = int(given[-1].split("=")[1]) if given else free_port()
        if not given:
            extra += ["--set", "metrics_port=%d" % port]
        self.mports = getattr(self, "mports", {})
        self.mports[name] = port
        extra += list(more)  # last: they override the defaults above
        self.nodes[name] = start_server(self.sock(name), *extra, model=None)

    def published(self, name, timeout=15.0):
        """Until node name's stores are all in the directory: a peer's next
        lookup finds them (a fixed sleep raced the publisher on a loaded
        host, and a test of what a peer does with them then saw nothing)."""
        self.wait_published(self.mports[name], timeout)

    def load_until_hit(self, name, seed, keyed=False, timeout=10.0):
        """Loads on node name until it matches every block (publishing is
        asynchronous: tens of ms), verifying the bytes each time."""
        deadline = time.monotonic() + timeout
        while True:
            r = worker(self.sock(name), "load", seed, keyed)
            self.assertEqual(r.get("mismatches", 0), 0, r)
            if r["matched"] == BLOCKS * r["block_tokens"]:
                self.assertGreater(r["bytes_checked"], 0, r)
                return r
            if time.monotonic() > deadline:
                self.fail("node %s never matched seed %d: %r\n%s" % (name, seed, r, self.log(name)))
            time.sleep(0.1)

    def log(self, name):
        with open(self.sock(name) + ".log") as f:
            return f.read()[-3000:]

    def timed_lookup(self, name, seed):
        """One lookup on node name of client_worker.py's request for seed,
        from this process: (matched tokens, seconds the call took). A
        worker's time would include its interpreter's start, which a
        loaded machine stretches by seconds; this is the call's alone."""
        import kvtier
        from client_worker import TPP, tokens_of
        geo = kvtier.Geometry.preset("tiny", TPP, 1)
        try:
            # a long deadline: a call that outwaits the pull deadline
            # shows as time, not as this client giving up
            with kvtier.Client(self.sock(name), geo, timeout_ms=30000) as cl:
                toks = tokens_of(seed, BLOCKS * cl.block_tokens + 1)
                t0 = time.monotonic()
                m = cl.lookup(ns="tenant", tokens=toks)
                took = time.monotonic() - t0
                if m.task:
                    cl.cancel(m.task)
                return m.matched_tokens, took
        finally:
            geo.close()

    def test_a_prefix_stored_on_one_node_is_a_verified_hit_on_another(self):
        s = worker(self.sock("a"), "store", 11)
        self.assertEqual(s["status"], 0, s)
        r = self.load_until_hit("b", 11)
        self.assertEqual(r["status"], 0, r)
        # b holds it now too: c can get it from either, and a itself still hits
        self.load_until_hit("c", 11)
        self.load_until_hit("a", 11)

    def wait_holding(self, want, timeout=10.0):
        """Until `kvtier cluster status` shows each node of want (name ->
        blocks) holding that many blocks (published, leases renewed)."""
        redis = self.redis_url()
        deadline = time.monotonic() + timeout
        while True:
            rep = json.loads(subprocess.run([kvtier_bin(), "cluster", "status", "--redis", redis,
                                             "--json"], capture_output=True, text=True,
                                            timeout=30).stdout)
            have = {n["node"]: n["blocks"] for n in rep["nodes"]}
            if all(have.get("node-" + k) == v for k, v in want.items()):
                return
            self.assertLess(time.monotonic(), deadline, rep)
            time.sleep(0.2)

    def restart(self, name, *more):
        stop_server(self.nodes[name])
        self.start_node(name, more=more)

    def metric(self, port, name):
        import urllib.request
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.split()[-1])
        self.fail("no %s on :%d/metrics" % (name, port))

    def scribble_tier(self, name):
        """Changes one byte of every 4 KiB page node name's CPU tier holds
        (its memfd, opened through /proc; a stray write into the tier long
        after the stores). Returns the pages changed."""
        pid = self.nodes[name].pid
        fds = "/proc/%d/fd" % pid
        tiers = [f for f in os.listdir(fds) if "memfd:kvtier" in os.readlink(os.path.join(fds, f))]
        self.assertTrue(tiers, os.listdir(fds))
        changed = 0
        for f in tiers:
            fd = os.open(os.path.join(fds, f), os.O_RDWR)
            try:
                end, off = os.fstat(fd).st_size, 0
                while off < end:
                    try:
                        off = os.lseek(fd, off, os.SEEK_DATA)
                    except OSError:
                        break  # no data after off
                    hole = os.lseek(fd, off, os.SEEK_HOLE)
                    for page in range(off, hole, 4096):
                        b = os.pread(fd, 1, page)
                        if b != b"\0":  # a page a block wrote
                            os.pwrite(fd, bytes([b[0] ^ 0x5A]), page)
                            changed += 1
                    off = hole
            finally:
                os.close(fd)
        return changed

    def test_a_block_changed_in_the_holders_tier_is_a_miss_never_a_wrong_byte(self):
        # The holder sends the layer checksums its blocks were stored with
        # (not a hash of the bytes as they are now): the puller's check
        # fails, the pull is a miss (recompute), counted as corrupt. The
        # puller then tells the holder (pull.h, REPORT), which hashes the
        # blocks again, finds them changed and drops them: c's pull is a
        # plain miss, not another corrupt one (before, a kept serving them
        # and every peer's pull failed until a load on a found them).
        pa, pb, pc = free_port(), free_port(), free_port()
        self.restart("a", "--set", "metrics_port=%d" % pa)
        self.restart("b", "--set", "metrics_port=%d" % pb)
        self.restart("c", "--set", "metrics_port=%d" % pc)
        self.assertEqual(worker(self.sock("a"), "store", 12)["status"], 0)
        self.wait_holding({"a": BLOCKS})
        self.assertGreater(self.scribble_tier("a"), 0)
        r = worker(self.sock("b"), "load", 12)
        self.assertEqual(r["matched"], 0, r)
        self.assertGreaterEqual(self.metric(pb, "kvtier_cluster_pull_corrupt_total"), 1)
        self.assertEqual(self.metric(pb, "kvtier_cluster_pulled_blocks_total"), 0)
        self.assertGreaterEqual(self.metric(pa, "kvtier_corrupt_blocks_total"), 1, self.log("a"))
        self.assertIn("a cluster peer's pull found", self.log("a"))
        r = worker(self.sock("c"), "load", 12)
        self.assertEqual(r["matched"], 0, r)
        self.assertEqual(self.metric(pc, "kvtier_cluster_pull_corrupt_total"), 0, self.log("c"))
        self.assertEqual(worker(self.sock("a"), "load", 12)["matched"], 0)  # dropped on a too
        # the engine recomputes and stores again: a peer gets every byte right
        self.assertEqual(worker(self.sock("a"), "store", 12)["status"], 0)
        self.load_until_hit("b", 12)

    def test_a_slow_pull_does_not_stop_pulls_for_good(self):
        # c's engine prefills faster than any pull (cluster_prefill_tps at
        # its maximum): after the first, measured pull, the next is not
        # started (recomputing is faster), but once a second has passed one
        # is made anyway to measure the link again. Before, the estimate
        # moved only with pulls made, so c never pulled again.
        port = free_port()
        self.restart("c", "--set", "cluster_prefill_tps=100000000",
                     "--set", "metrics_port=%d" % port)
        for seed in (41, 42, 43):
            self.assertEqual(worker(self.sock("a"), "store", seed)["status"], 0)
        self.wait_holding({"a": 3 * BLOCKS})
        full, _ = self.timed_lookup("c", 41)  # unmeasured: pulled
        self.assertGreater(full, 0)
        skipped, _ = self.timed_lookup("c", 42)
        self.assertEqual(skipped, 0)
        self.assertEqual(self.metric(port, "kvtier_cluster_pulls_skipped_total"), 1)
        time.sleep(1.2)
        self.assertEqual(self.timed_lookup("c", 43)[0], full)  # the probe
        self.assertEqual(self.metric(port, "kvtier_cluster_pulls_total"), 2)

    def test_a_prefix_spread_over_two_nodes_is_pulled_from_both_in_one_lookup(self):
        # a holds the first 2 blocks, b all 4: the directory names a (the
        # first by name among CPU holders) for blocks 0-1 and b for 2-3, so
        # c's one lookup must pull a run from each (c recomputes slowly,
        # cluster_prefill_tps=1: no run is judged not worth pulling)
        self.restart("c", "--set", "cluster_prefill_tps=1")
        self.assertEqual(worker(self.sock("a"), "store", 29, blocks=2)["status"], 0)
        s = worker(self.sock("b"), "store", 29)
        self.assertEqual(s["status"], 0, s)
        self.wait_holding({"a": 2, "b": 4})
        # the holdings can show before every block entry is readable (in a
        # Redis Cluster they sit on other shards): a probe node d loads
        # until it has them all, so the directory names a holder for each
        # (d holds them then too, but loses every tie to a and b by name)
        self.start_node("d")
        self.load_until_hit("d", 29)
        matched, _ = self.timed_lookup("c", 29)
        self.assertEqual(matched, BLOCKS * s["block_tokens"], self.log("c"))
        r = worker(self.sock("c"), "load", 29)  # a local hit now: every byte verified
        self.assertEqual((r["matched"], r["status"], r["mismatches"]),
                         (BLOCKS * s["block_tokens"], 0, 0), r)
        self.assertGreater(r["bytes_checked"], 0, r)

    def stats(self, name):
        r = subprocess.run([kvtier_bin(), "stats", "--socket", self.sock(name), "--json"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.splitlines()[-1])["totals"]

    def test_a_pull_served_is_not_the_holders_own_hit(self):
        # a's lookups, hits and loads are its engines'; what it serves a
        # peer is the cluster's (kvtier_cluster_served_*), or a's hit rate
        # on a dashboard would rise with every pull its peers make
        worker(self.sock("a"), "store", 19)
        before = self.stats("a")
        self.load_until_hit("b", 19)
        after = self.stats("a")
        for k in ("lookups", "lookup_tokens", "hit_tokens", "ssd_hit_tokens", "loads",
                  "loaded_blocks", "loaded_bytes"):
            self.assertEqual(after[k], before[k], (k, before, after))
        r = worker(self.sock("a"), "load", 19)  # a's own engine: a hit of a's own
        self.assertEqual(r["matched"], BLOCKS * r["block_tokens"], r)
        self.assertEqual(self.stats("a")["lookups"], before["lookups"] + 1)

    def test_cluster_status_lists_every_node_with_its_epoch(self):
        redis = "127.0.0.1:%d" % self.redis.port
        r = subprocess.run([kvtier_bin(), "cluster", "status", "--redis", redis, "--json"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertEqual(rep["node_count"], 3, rep)
        nodes = {n["node"]: n for n in rep["nodes"]}
        self.assertEqual(set(nodes), {"node-a", "node-b", "node-c"})
        for n in nodes.values():
            self.assertGreaterEqual(n["epoch"], 1)
            self.assertGreater(n["lease_left_ms"], 0)
            self.assertRegex(n["addr"], r"^127\.0\.0\.1:\d+$")
        self.assertIn(redis, rep["topology"])
        # a restart bumps the node's epoch; the reader itself never joined
        stop_server(self.nodes["a"])
        self.start_node("a")
        rep2 = json.loads(subprocess.run([kvtier_bin(), "cluster", "status", "--redis", redis,
                                          "--json"], capture_output=True, text=True,
                                         timeout=30).stdout)
        again = {n["node"]: n for n in rep2["nodes"]}
        self.assertEqual(again["node-a"]["epoch"], nodes["node-a"]["epoch"] + 1)
        self.assertEqual(rep2["node_count"], 3)
        # what a node holds shows within a lease renewal (lease/3 = 0.5 s here)
        stored = worker(self.sock("b"), "store", 22)
        deadline = time.monotonic() + 10
        while True:
            rep3 = json.loads(subprocess.run([kvtier_bin(), "cluster", "status", "--redis",
                                              redis, "--json"], capture_output=True, text=True,
                                             timeout=30).stdout)
            b = {n["node"]: n for n in rep3["nodes"]}["node-b"]
            if b["blocks"] == BLOCKS:
                break
            self.assertLess(time.monotonic(), deadline, rep3)
            time.sleep(0.2)
        self.assertEqual(b["bytes"], BLOCKS * stored["stats"]["block_bytes"], b)
        # blocks per tier: these nodes have a CPU tier only
        self.assertEqual((b["cpu_blocks"], b["ssd_blocks"]), (BLOCKS, 0), b)
        text = subprocess.run([kvtier_bin(), "cluster", "status", "--redis", redis],
                              capture_output=True, text=True, timeout=30).stdout
        self.assertIn("node-b", text)
        self.assertRegex(text, r"BLOCKS +CPU +SSD +BYTES")
        bad = subprocess.run([kvtier_bin(), "cluster", "status", "--redis", "127.0.0.1:1"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("127.0.0.1:1", bad.stderr)

    def test_keyed_requests_are_pulled_too(self):
        s = worker(self.sock("b"), "store", 12, keyed=True)
        self.assertEqual(s["status"], 0, s)
        self.load_until_hit("c", 12, keyed=True)

    def test_independent_keys_are_pulled_too(self):
        """SGLang's HiCache backend names pages by independent keys."""
        s = worker(self.sock("a"), "store", 25, keyed="independent")
        self.assertEqual(s["status"], 0, s)
        self.load_until_hit("c", 25, keyed="independent")

    def test_unknown_prefix_is_a_plain_miss(self):
        worker(self.sock("a"), "store", 13)
        r = worker(self.sock("b"), "load", 14)
        self.assertEqual(r["matched"], 0, r)

    def test_a_killed_holder_is_a_miss_within_the_deadline(self):
        worker(self.sock("a"), "store", 15)
        self.published("a")
        self.nodes["a"].send_signal(signal.SIGKILL)
        self.nodes["a"].wait(10)
        # The lookup alone is timed (timed_lookup: this process's client,
        # not a worker whose Python start counted, on a loaded machine
        # seconds of it): a pull from the dead node fails in a fraction of
        # a second (0.3 s measured), at worst at the pull deadline
        # (cluster_pull_ms, 2 s). A pull that outwaits its deadline runs
        # into the client's (30 s): 2 + 3 s fails it.
        matched, took = self.timed_lookup("b", 15)
        self.assertEqual(matched, 0)
        self.assertLess(took, 2.0 + 3.0, "a pull from a dead node took %.1f s" % took)
        # once a's lease expired nobody even tries: milliseconds, well
        # within 3 s (again the call alone)
        time.sleep(1.6)
        matched, took = self.timed_lookup("c", 15)
        self.assertEqual(matched, 0)
        self.assertLess(took, 3.0, "a lookup after the holder's lease expired took %.1f s" % took)

    def test_redis_down_keeps_local_hits_and_republishes_when_back(self):
        self.redis.stop()
        t0 = time.monotonic()
        s = worker(self.sock("a"), "store", 16)
        self.assertEqual(s["status"], 0, s)
        r = worker(self.sock("a"), "load", 16)  # local hit, Redis down
        self.assertEqual(r["matched"], BLOCKS * r["block_tokens"], r)
        self.assertEqual(r["mismatches"], 0, r)
        self.assertLess(time.monotonic() - t0, 8.0)
        self.assertEqual(worker(self.sock("b"), "load", 16)["matched"], 0)
        self.redis.start()  # empty: every node republishes what it holds
        self.load_until_hit("b", 16, timeout=15.0)

    def wait_published(self, port, timeout=15.0):
        """Until the node with metrics on port has its directory up and
        nothing left to write to it (kvtier_cluster_publish_backlog 0)."""
        deadline = time.monotonic() + timeout
        while (self.metric(port, "kvtier_cluster_directory_up") != 1 or
               self.metric(port, "kvtier_cluster_publish_backlog") != 0):
            self.assertLess(time.monotonic(), deadline, "backlog %r" % self.metric(
                port, "kvtier_cluster_publish_backlog"))
            time.sleep(0.02)

    def test_a_backlog_of_zero_means_a_peer_finds_every_block(self):
        # kvtier_cluster_publish_backlog is what a node stored that peers
        # cannot find yet: with the directory up and the backlog 0, a
        # peer's first lookup is a full hit, no retry (the cluster demo
        # waits on it between phases: before, it raced the publisher and a
        # loaded host saw no cross-node hit). While Redis is away, what a
        # stores is owed; once back, a writes it all and the backlog ends.
        # b recomputes slowly (cluster_prefill_tps=1): what it finds it
        # pulls, whatever its first pull measured (this test is about what
        # it finds)
        pa, pb = free_port(), free_port()
        self.restart("a", "--set", "metrics_port=%d" % pa)
        self.restart("b", "--set", "metrics_port=%d" % pb, "--set", "cluster_prefill_tps=1")
        s = worker(self.sock("a"), "store", 34)
        self.assertEqual(s["status"], 0, s)
        self.wait_published(pa)
        self.wait_published(pb)
        self.assertEqual(self.timed_lookup("b", 34)[0], BLOCKS * s["block_tokens"], self.log("b"))
        self.redis.stop()
        self.assertEqual(worker(self.sock("a"), "store", 35)["status"], 0)
        deadline = time.monotonic() + 10.0
        while self.metric(pa, "kvtier_cluster_publish_backlog") < BLOCKS:
            self.assertLess(time.monotonic(), deadline, self.log("a"))
            time.sleep(0.02)
        self.assertEqual(self.metric(pa, "kvtier_cluster_directory_up"), 0)
        self.redis.start()  # empty: a owes everything it holds
        self.wait_published(pa)
        self.wait_published(pb)
        self.assertEqual(self.timed_lookup("b", 35)[0], BLOCKS * s["block_tokens"], self.log("b"))

    def test_a_pull_racing_a_local_store_is_counted_apart(self):
        # b's own client plans a store of the prefix a holds; a lookup of it
        # on b then misses locally and pulls from a, but the blocks are
        # being stored on b meanwhile, so the pull is dropped: a race, not
        # a failure (kvtier_cluster_pulls_raced_total, never
        # pull_failures_total), and the store, once it ends, is a local hit
        import kvtier
        from client_worker import TPP, tokens_of
        s = worker(self.sock("a"), "store", 37)
        self.assertEqual(s["status"], 0, s)
        self.published("a")
        geo = kvtier.Geometry.preset("tiny", TPP, 1)
        with kvtier.Client(self.sock("b"), geo, timeout_ms=30000) as cl:
            toks = tokens_of(37, BLOCKS * cl.block_tokens + 1)
            plan = cl.prepare_store(ns="tenant", tokens=toks)
            self.assertEqual(plan.num_tokens, BLOCKS * cl.block_tokens)
            m = cl.lookup(ns="tenant", tokens=toks)
            self.assertEqual(m.matched_tokens, 0)
            self.assertEqual(m.task, 0)
            cl.cancel(plan.task)
        pb = self.mports["b"]
        self.assertEqual(self.metric(pb, "kvtier_cluster_pulls_raced_total"), 1, self.log("b"))
        self.assertEqual(self.metric(pb, "kvtier_cluster_pull_failures_total"), 0, self.log("b"))
        self.assertEqual(self.metric(pb, "kvtier_cluster_pulls_total"), 0)

    def test_a_node_started_while_redis_is_down_joins_when_it_is_back(self):
        self.redis.stop()
        self.start_node("d")  # serves at once, its local tiers only
        w = worker(self.sock("d"), "store", 21)
        self.assertEqual(w["status"], 0, w)
        self.assertEqual(worker(self.sock("d"), "load", 21)["matched"],
                         BLOCKS * w["block_tokens"])
        self.assertIn("joins when it answers", self.log("d"))
        self.redis.start()
        self.load_until_hit("b", 21, timeout=15.0)  # d joined and published what it held
        self.assertIn("joined the directory", self.log("d"))

    def test_a_peer_bounds_the_bandwidth_it_gives(self):
        """Node a sends at most 1 MiB/s and gives each pull it serves 60 ms:
        4 blocks of 32 KiB need 125 ms, so b's pull is refused mid-way and
        b misses (no wrong byte), and a says why."""
        stop_server(self.nodes["a"])
        self.start_node("a", more=["--set", "cluster_serve_mib_s=1", "--set",
                                   "cluster_pull_ms=60"])
        s = worker(self.sock("a"), "store", 24)
        self.assertEqual(s["stats"]["block_bytes"] * BLOCKS, 4 * 32768, s)
        self.published("a")
        r = worker(self.sock("b"), "load", 24)
        self.assertEqual(r["matched"], 0, r)
        self.assertEqual(r.get("mismatches", 0), 0, r)
        self.assertIn("cluster_serve_mib_s", self.log("a"))

    def test_a_restarted_node_never_serves_its_earlier_life(self):
        worker(self.sock("a"), "store", 17)
        self.published("a")
        self.nodes["a"].send_signal(signal.SIGKILL)
        self.nodes["a"].wait(10)
        self.start_node("a")  # no SSD tier: it holds nothing now
        r = worker(self.sock("b"), "load", 17)
        self.assertEqual(r["matched"], 0, r)
        self.assertEqual(r.get("mismatches", 0), 0, r)


class PortTaken(AssertionError):
    """A redis-server exited at start (its port was taken meanwhile)."""


class RedisClusterMode:
    """Three redis-server processes in cluster mode (no replicas), joined
    with redis-cli --cluster create: the directory's keys spread over three
    shards by slot."""

    def __init__(self, d):
        self.dir, self.procs = d, []
        self.pick_ports()
        self.started = False

    def pick_ports(self):
        self.ports = []
        # distinct (a port just freed may come back), each with its cluster
        # bus port (10000 higher, so at most 55535) free too
        while len(self.ports) < 3:
            p = free_port()
            if p <= 55535 and p not in self.ports and port_free(p + 10000):
                self.ports.append(p)

    def start(self):
        """The first start takes new ports when a server exits at once: a
        port free when picked can be taken before redis-server binds it (by
        another test's connection under ctest -j, from the same ephemeral
        range). A restart keeps its ports: the nodes were told them."""
        for attempt in range(3):
            try:
                self.start_once()
                self.started = True
                return
            except PortTaken:
                self.stop()
                if self.started or attempt == 2:
                    raise
                self.pick_ports()

    def start_once(self):
        log = open(os.path.join(self.dir, "redis-cluster.log"), "ab")
        self.procs = []
        for p in self.ports:  # a restart is a new, empty cluster (as start() was)
            conf = os.path.join(self.dir, "nodes-%d.conf" % p)
            if os.path.exists(conf):
                os.unlink(conf)
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir, "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes-%d.conf" % p],
                stdout=log, stderr=subprocess.STDOUT))
        log.close()
        deadline = time.monotonic() + 30
        while not all(redis_ping(p) for p in self.ports):
            exited = [(p, q.returncode) for p, q in zip(self.ports, self.procs)
                      if q.poll() is not None]
            if exited or time.monotonic() > deadline:
                with open(os.path.join(self.dir, "redis-cluster.log")) as f:
                    msg = ("redis-server (cluster mode) did not start on %s (exited: %s):\n%s"
                           % (self.ports, exited, f.read()[-3000:]))
                raise PortTaken(msg) if exited else AssertionError(msg)
            time.sleep(0.05)
        r = subprocess.run(["redis-cli", "--cluster", "create"] +
                           ["127.0.0.1:%d" % p for p in self.ports] +
                           ["--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError("redis-cli --cluster create failed:\n" + r.stdout + r.stderr)
        deadline = time.monotonic() + 30
        while True:  # every primary agrees, else a node's first call meets CLUSTERDOWN
            infos = [subprocess.run(["redis-cli", "-p", str(p), "cluster", "info"],
                                    capture_output=True, text=True, timeout=10).stdout
                     for p in self.ports]
            if all("cluster_state:ok" in i for i in infos):
                return
            if time.monotonic() > deadline:
                raise AssertionError("the Redis Cluster never reached cluster_state:ok")
            time.sleep(0.1)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)

    def url(self):
        return "cluster://" + ",".join("127.0.0.1:%d" % p for p in self.ports)


class ClusterModeCluster(Cluster):
    """The same nodes and engines with the directory in a Redis Cluster of
    three primaries (keys routed by slot, one pipeline per shard)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtcl")
        self.redis = RedisClusterMode(self.dir)
        self.addCleanup(self.redis.stop)  # also when a later step of setUp fails
        self.redis.start()
        self.nodes = {}
        for name in ("a", "b", "c"):
            self.start_node(name)

    def redis_url(self):
        return self.redis.url()

    def test_redis_down_keeps_local_hits_and_republishes_when_back(self):
        """Here: the status names the Cluster, and with every primary killed
        local hits go on."""
        r = subprocess.run([kvtier_bin(), "cluster", "status", "--redis", self.redis.url(),
                            "--json"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertIn("3", rep["topology"])
        self.assertEqual(rep["node_count"], 3)
        worker(self.sock("a"), "store", 19)
        self.load_until_hit("b", 19)
        self.redis.stop()
        w = worker(self.sock("a"), "store", 20)
        self.assertEqual(w["status"], 0, w)
        r = worker(self.sock("a"), "load", 20)
        self.assertEqual(r["matched"], BLOCKS * r["block_tokens"], r)
        self.assertEqual(r["mismatches"], 0, r)

    RESHARD_SLOTS = 2000

    def test_a_resharding_mid_run_loses_no_local_hit_and_no_byte(self):
        """redis-cli --cluster reshard moves RESHARD_SLOTS slots of the first
        primary to the second (their keys migrated: ASK while a slot moves,
        MOVED after) while engines store on one node and load on others:
        every local hit stays whole, every loaded byte is right, every store
        succeeds; a pull may miss while its slot moves, and after the move
        peers pull again (#26 item 4). A third of the slots: redis-cli moves
        a few hundred slots a second on a loaded 2-core VM."""
        seeds = list(range(60, 64))
        for seed in seeds:
            self.assertEqual(worker(self.sock("a"), "store", seed)["status"], 0)
            self.load_until_hit("b", seed)
        ports = self.redis.ports
        ids = [subprocess.run(["redis-cli", "-p", str(p), "cluster", "myid"], capture_output=True,
                              text=True, timeout=10).stdout.strip() for p in ports]
        # its output to a file: a pipe nobody reads fills and stalls redis-cli
        out_path = os.path.join(self.dir, "reshard.out")
        out_file = open(out_path, "w")
        self.addCleanup(out_file.close)
        reshard = subprocess.Popen(
            ["redis-cli", "--cluster", "reshard", "127.0.0.1:%d" % ports[0], "--cluster-from",
             ids[0], "--cluster-to", ids[1], "--cluster-slots", str(self.RESHARD_SLOTS),
             "--cluster-yes"],
            stdout=out_file, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: reshard.poll() is None and reshard.kill())
        names, rounds, seed, during = ("a", "b", "c"), 0, 100, 0
        deadline = time.monotonic() + 120
        while reshard.poll() is None or rounds < 3:
            during += reshard.poll() is None
            self.assertLess(time.monotonic(), deadline, "the reshard did not finish")
            at, to = names[rounds % 3], names[(rounds + 1) % 3]
            s = worker(self.sock(at), "store", seed)
            self.assertEqual(s["status"], 0, s)
            local = worker(self.sock(at), "load", seed)  # its own: a whole hit
            self.assertEqual((local["matched"], local["mismatches"]),
                             (BLOCKS * s["block_tokens"], 0), local)
            far = worker(self.sock(to), "load", seed)  # a pull, or a miss mid-move
            self.assertEqual(far.get("mismatches", 0), 0, far)
            for old in seeds:  # stored before: hits on a and b (b pulled them)
                for n in ("a", "b"):
                    r = worker(self.sock(n), "load", old)
                    self.assertEqual((r["matched"], r["mismatches"]),
                                     (BLOCKS * s["block_tokens"], 0), (n, old, r))
            rounds, seed = rounds + 1, seed + 1
        with open(out_path) as f:
            out = f.read()
        self.assertEqual(reshard.returncode, 0, out[-3000:])
        moving = [l for l in out.splitlines() if l.startswith("Moving slot")]
        self.assertEqual(len(moving), self.RESHARD_SLOTS, out[-3000:])
        # the moved slots held directory entries (a dot per key migrated)
        self.assertGreater(sum(l.count(".") - l.count("127.0.0.1") * 3 for l in moving), 0,
                           out[-3000:])
        self.assertGreater(during, 0, "no round ran while the slots moved")
        # after the move: a new prefix stored on c is pulled by b
        self.assertEqual(worker(self.sock("c"), "store", 99)["status"], 0)
        self.load_until_hit("b", 99, timeout=20.0)

    def test_cluster_status_lists_every_node_with_its_epoch(self):
        rep = json.loads(subprocess.run([kvtier_bin(), "cluster", "status", "--redis",
                                         self.redis.url(), "--json"], capture_output=True,
                                        text=True, timeout=30).stdout)
        self.assertEqual({n["node"] for n in rep["nodes"]}, {"node-a", "node-b", "node-c"})


class SecretCluster(Cluster):
    """The same behaviour with cluster_secret_file on every node."""
    secret = b"cluster-secret-0123456789abcdef"

    def test_a_node_without_the_secret_pulls_nothing(self):
        worker(self.sock("a"), "store", 18)
        stop_server(self.nodes["c"])
        self.start_node("c", secret=b"another-secret-0123456789abcdef")
        self.published("a")
        r = worker(self.sock("c"), "load", 18)
        self.assertEqual(r["matched"], 0, r)
        self.assertIn("cluster", self.log("c"))


class UcxCluster(Cluster):
    """The same behaviour with every node's cluster_transport=ucx: each new
    link asks its peer to move onto UCX (UCX_TLS=tcp on loopback, as
    tests/unit/test_conc_pd_ucx.c runs it) and every pull, report and fault
    above runs over UCX."""
    UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}

    def setUp(self):
        saved = {k: os.environ.get(k) for k in self.UCX_ENV}

        def restore():
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(restore)
        for k, v in self.UCX_ENV.items():
            os.environ.setdefault(k, v)
        super().setUp()

    def start_node(self, name, secret=None, more=()):
        super().start_node(name, secret, ["--set", "cluster_transport=ucx"] + list(more))

    def test_pulls_move_onto_ucx(self):
        s = worker(self.sock("a"), "store", 36)
        self.assertEqual(s["status"], 0, s)
        self.load_until_hit("b", 36)  # every byte verified
        self.assertIn("moved onto UCX", self.log("b"))
        self.assertNotIn("cannot start", self.log("a") + self.log("b"))

    def test_a_tcp_peer_is_pulled_from_over_tcp(self):
        # d pulls and serves over TCP only: a asks, hears no, says so once
        # and pulls over TCP; d's own pulls from a are plain TCP
        super().start_node("d", more=["--set", "cluster_transport=tcp"])
        s = worker(self.sock("d"), "store", 37)
        self.assertEqual(s["status"], 0, s)
        self.load_until_hit("a", 37)
        self.assertIn("does not serve over UCX", self.log("a"))
        self.assertEqual(worker(self.sock("a"), "store", 38)["status"], 0)
        self.load_until_hit("d", 38)
        self.assertNotIn("UCX", self.log("d"))


class PasswordCluster(unittest.TestCase):
    """A directory Redis with requirepass (cluster_redis_password_file):
    nodes AUTH and pull as without one, `kvtier cluster status` reads it
    with --redis-password-file, and a node or reader without the password,
    or with a wrong one, is told exactly that."""
    password = "redis pass 42"
    user = None  # AclUserCluster: the nodes AUTH as this ACL user

    def redis_auth_args(self):
        return ["--requirepass", self.password]

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtclpw")
        self.port = free_port()
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir] + self.redis_auth_args(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.answers():
            self.assertLess(time.monotonic(), deadline, "redis-server did not start")
            time.sleep(0.05)
        self.pwfile = self.write("redis.pw", self.password + "\n")
        self.nodes = {}
        for name in ("a", "b"):
            self.nodes[name] = self.start_node(name, self.pwfile)

    def tearDown(self):
        for p in self.nodes.values():
            if p.poll() is None:
                stop_server(p)
        self.redis.kill()
        self.redis.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def answers(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"-NOAUTH")
        except OSError:
            return False

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def sock(self, name):
        return os.path.join(self.dir, name + ".sock")

    def auth_opts(self, pwfile, user):
        extra = ["--set", "cluster_redis_password_file=" + pwfile] if pwfile else []
        return extra + (["--set", "cluster_redis_user=" + user] if user else [])

    def start_node(self, name, pwfile):
        extra = ["--set", "cluster_redis=127.0.0.1:%d" % self.port,
                 "--set", "cluster_node=node-" + name, "--set", "cluster_lease_ms=1500"]
        extra += self.auth_opts(pwfile, self.user)
        return start_server(self.sock(name), *extra, model=None)

    def refused(self, name, pwfile, user=None):
        """What `kvtier serve` says when it must not start: it exits non-zero
        (waited for, up to 30 s). Not start_node's wait for the socket: the
        socket exists before the cluster's AUTH is refused, so on a loaded
        machine that wait could return a server about to exit."""
        extra = ["--set", "cluster_redis=127.0.0.1:%d" % self.port,
                 "--set", "cluster_node=node-" + name, "--set", "cluster_lease_ms=1500"]
        extra += self.auth_opts(pwfile, user)
        r = subprocess.run([kvtier_bin(), "serve", "--socket", self.sock(name), "--set",
                            "cpu_capacity=16MiB", "--set", "huge_pages=false"] + extra,
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout + r.stderr

    def status(self, *more):
        return subprocess.run([kvtier_bin(), "cluster", "status", "--redis",
                               "127.0.0.1:%d" % self.port, "--json"] + list(more),
                              capture_output=True, text=True, timeout=30)

    def test_nodes_authenticate_and_pull(self):
        self.assertEqual(worker(self.sock("a"), "store", 31)["status"], 0)
        deadline = time.monotonic() + 10
        while True:
            r = worker(self.sock("b"), "load", 31)
            self.assertEqual(r.get("mismatches", 0), 0, r)
            if r["matched"] == BLOCKS * r["block_tokens"]:
                self.assertGreater(r["bytes_checked"], 0, r)
                break
            self.assertLess(time.monotonic(), deadline, r)
            time.sleep(0.1)
        r = self.status("--redis-password-file", self.pwfile,
                        *(["--redis-user", self.user] if self.user else []))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual({n["node"] for n in json.loads(r.stdout)["nodes"]}, {"node-a", "node-b"})

    def test_without_the_password_the_message_says_what_to_set(self):
        r = self.status()
        self.assertEqual(r.returncode, 1)
        self.assertIn("wants a password", r.stderr)
        self.assertIn("cluster_redis_password_file", r.stderr)
        wrong = self.write("wrong.pw", "not it")
        self.assertIn("refused the password", self.refused("c", wrong))
        self.assertIn("wants a password", self.refused("d", None))
        two = self.write("two.pw", "a\nb\n")
        self.assertIn("line break at byte 1", self.refused("e", two))


class AclUserCluster(PasswordCluster):
    """Redis 6+ ACL: the nodes AUTH as user kvt (cluster_redis_user), which
    may touch the directory's keys only, with only the commands
    docs/cluster.md lists; the default user is off."""
    user = "kvt"

    def redis_auth_args(self):
        # one config line per --user: name, on, >password, ~key pattern, commands
        return ["--user", "kvt", "on", ">" + self.password, "~kvt:*", "+get", "+set", "+incr",
                "+pexpire", "+pttl", "+hset", "+hgetall", "+hdel", "+eval", "+scan",
                "+cluster|slots", "+readonly", "+asking",
                "--user", "narrow", "on", ">" + self.password, "~other:*", "+@all",
                "--user", "default", "off"]

    def test_without_the_password_the_message_says_what_to_set(self):
        wrong = self.write("wrong.pw", "not it")
        msg = self.refused("c", wrong, user="kvt")
        self.assertIn('refused user "kvt"', msg)
        self.assertIn("cluster_redis_password_file", msg)
        # the right password as the default user (which is off): refused
        self.assertIn("refused the password", self.refused("d", self.pwfile))
        # a user without the password file: named before Redis is asked
        self.assertIn("cluster_redis_password_file too", self.refused("e", None, user="kvt"))
        self.assertIn("holds a space", self.refused("f", self.pwfile, user="a b"))

    def test_a_user_denied_the_directory_keys_is_told_which(self):
        msg = self.refused("g", self.pwfile, user="narrow")
        self.assertIn('denies user "narrow"', msg)
        self.assertIn("kvt:*", msg)


if __name__ == "__main__":
    unittest.main()

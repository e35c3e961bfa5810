"""kvtier.vllm_connector in separate processes, as vLLM runs it: one
scheduler process (role SCHEDULER) and two worker processes (TP 2: each its
own KV arrays and TP rank namespace; MLA: one copy written by rank 0, read
by both), all attached to one `kvtier serve` started here; the metadata goes
from the scheduler's process to the workers' pickled, as vLLM sends it.
This process plays vLLM's engine core: it calls the scheduler, hands the
metadata to every worker, and adds up the workers' get_finished reports the
way vLLM's KVOutputAggregator does (a request is done once every worker
reported it). Every loaded block is byte-checked against what its hash says
it holds; also concurrent requests, a server restart in the middle and a
corrupt block in the middle. Not named test_*: ctest runs it as its own
entry (python_vllm_processes), outside python_tests' time budget."""
import glob
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from _util import HERE, skip_if_unloadable

PY = sys.executable
BS = 4
PREFIX_MARK = 0x77


def setUpModule():
    skip_if_unloadable()
    global vc, fakes, kvtier_bin
    import kvtier.vllm_connector as vc
    import _vllm_fakes as fakes
    from test_client import kvtier_bin


def start_server(sock, model, ssd=None, tp=2, layers=None):
    """`kvtier serve` on sock with no --model, as a node runs one server for
    every engine: each rank attaches with its own geometry (model, TP tp,
    `layers` of its layers: a PP stage's), 4-token blocks (vLLM's block size
    here), optionally an SSD tier; returns the process once it listens.
    model, tp and layers only say what attaches (the server is not told)."""
    exe = kvtier_bin()
    if not os.path.exists(exe):
        raise unittest.SkipTest("no kvtier CLI at %s (set KVTIER_BIN)" % exe)
    if os.path.exists(sock):  # left by a killed server: wait for the new one's
        os.unlink(sock)
    del model, tp, layers
    args = [exe, "serve", "--socket", sock,
            "--set", "block_tokens=%d" % BS, "--set", "cpu_capacity=16MiB",
            "--set", "huge_pages=false"]
    if ssd:
        args += ["--set", "ssd_dirs=" + ssd, "--set", "ssd_capacity=64MiB"]
    log = open(sock + ".log", "a")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    p.wait(5)
    with open(sock + ".log") as f:
        raise AssertionError("kvtier serve did not start: " + f.read())


def stop_server(p, sig=signal.SIGTERM):
    p.send_signal(sig)
    rc = p.wait(15)
    if sig == signal.SIGTERM:
        assert rc == 0, "kvtier serve exited %s" % rc


class Proc:
    """A vllm_proc.py process; call() is one pickled round trip with a deadline."""

    def __init__(self, settings, log):
        with open(log, "a") as err:
            self.p = subprocess.Popen([PY, os.path.join(HERE, "vllm_proc.py"),
                                       pickle.dumps(settings).hex()],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                      env=dict(os.environ))
        self.log = log
        self._reply(60)

    def _read(self, n, deadline):
        buf = b""
        fd = self.p.stdout.fileno()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.p.kill()
                raise AssertionError("vllm_proc: no reply in time; log %s" % self.log)
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                with open(self.log) as f:
                    raise AssertionError("vllm_proc exited (%s):\n%s" % (self.p.wait(5),
                                                                         f.read()[-3000:]))
            buf += chunk
        return buf

    def _reply(self, timeout):
        deadline = time.monotonic() + timeout
        n = struct.unpack("<I", self._read(4, deadline))[0]
        kind, value = pickle.loads(self._read(n, deadline))
        if kind != "ok":
            raise AssertionError("vllm_proc: " + value)
        return value

    def call(self, name, *args, timeout=60):
        data = pickle.dumps((name, args))
        self.p.stdin.write(struct.pack("<I", len(data)) + data)
        self.p.stdin.flush()
        return self._reply(timeout)

    def close(self):
        if self.p.poll() is None:
            try:
                self.call("close", timeout=30)
            except AssertionError:
                self.p.kill()
        self.p.stdin.close()
        self.p.stdout.close()
        self.p.wait(10)


class Deployment(unittest.TestCase):
    """One server, one scheduler process, a worker process per TP rank of
    each PP stage: TP 2, PP 2 or both (stage s holds STAGES[s] of the
    model's layers; one server for every stage, or one per stage when
    STAGE_SERVERS)."""
    MODEL, LAYERS, HEADS, DIM, MLA = "tiny", 4, 1, 64, False
    SSD = True
    DEVICE = "cuda"  # "cpu": vLLM's CPU backend, head-major KV tensors
    TP, PP, STAGE_SERVERS, STAGES = 2, 1, False, None

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtvl")
        self.procs, self.srvs = [], []
        self.addCleanup(self.clean_up)  # also when setUp fails half way
        self.sock = os.path.join(self.tmp, "node-pp{pp_rank}.sock" if self.STAGE_SERVERS
                                 else "node.sock")
        self.ssd = os.path.join(self.tmp, "ssd") if self.SSD else None
        if self.ssd:
            os.makedirs(self.ssd)
        for s in range(self.PP if self.STAGE_SERVERS else 1):
            self.srvs.append(self.start_stage_server(s))
        self.srv = self.srvs[0]
        stages = self.STAGES or [self.LAYERS]
        base = dict(block_size=BS, tp=self.TP, layers=self.LAYERS, heads=self.HEADS,
                    dim=self.DIM, mla=self.MLA, blocks=64, device=self.DEVICE,
                    extra={"socket": self.sock, "timeout": 5}, pp=self.PP,
                    stages=stages, total_layers=sum(stages))
        self.sched = self.spawn(dict(base, role="scheduler"), "sched")
        ranks = [(r, p) for p in range(self.PP) for r in range(self.TP)]
        self.workers = [self.spawn(dict(base, role="worker", rank=r, pp_rank=p),
                                   "w%d-pp%d" % (r, p)) for r, p in ranks]
        self.rid = 0

    def stage_sock(self, pp_rank):
        return self.sock.replace("{pp_rank}", str(pp_rank))

    def start_stage_server(self, stage):
        """Stage `stage`'s server (the one server: stage 0's geometry)."""
        return start_server(self.stage_sock(stage), self.MODEL, self.ssd, tp=self.TP,
                            layers=self.STAGES[stage] if self.STAGES else None)

    def spawn(self, settings, name):
        p = Proc(settings, os.path.join(self.tmp, name + ".log"))
        self.procs.append(p)
        return p

    def clean_up(self):
        for p in self.procs:
            p.close()
        for srv in self.srvs:
            if srv.poll() is None:
                stop_server(srv)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- vLLM's engine core ----------------------------------------------

    def step(self, finished=()):
        """One engine step: the scheduler's metadata, pickled, to every
        worker; returns ({req: workers reporting it sent}, {... received},
        [load error blocks per worker])."""
        meta = self.sched.call("meta")
        self.assertIsInstance(pickle.loads(meta), vc.KvtierConnectorMetadata)
        sent, recv, errors = {}, {}, []
        for w in self.workers:
            (s, r), e = w.call("step", meta, set(finished))
            for rid in s or ():
                sent[rid] = sent.get(rid, 0) + 1
            for rid in r or ():
                recv[rid] = recv.get(rid, 0) + 1
            errors.append(set(e))
        return sent, recv, errors

    def run_until(self, sent=(), recv=()):
        """Steps until every worker reported each request of sent and recv
        (KVOutputAggregator's rule); returns the load errors per worker."""
        n = len(self.workers)
        want_s, want_r = {r: n for r in sent}, {r: n for r in recv}
        errors = [set() for _ in self.workers]
        deadline = time.monotonic() + 30
        while want_s or want_r:
            self.assertLess(time.monotonic(), deadline, "not reported: %s %s" % (want_s, want_r))
            s, r, e = self.step()
            for want, got in ((want_s, s), (want_r, r)):
                for rid, n in got.items():
                    self.assertIn(rid, want, "%s reported but not expected" % rid)
                    want[rid] -= n
                    self.assertGreaterEqual(want[rid], 0, "%s reported twice" % rid)
                    if want[rid] == 0:
                        del want[rid]
            for acc, x in zip(errors, e):
                acc |= x
            if want_s or want_r:
                time.sleep(0.005)
        return errors

    def restart(self, stage=0):
        """Starts (PP stage `stage`'s) server again (same socket and SSD
        directory) and waits until the scheduler and every worker
        re-attached on their own."""
        self.srvs[stage] = self.start_stage_server(stage)
        self.srv = self.srvs[0]
        for w in self.workers:
            self.assertTrue(w.call("reattach"))
        deadline = time.monotonic() + 20
        while True:
            try:
                self.sched.call("stage_stats")
                return
            except AssertionError:
                self.assertLess(time.monotonic(), deadline, "the scheduler did not re-attach")
                time.sleep(0.05)

    # --- requests ------------------------------------------------------

    def tokens(self, n, seed):
        return [(seed * 7919 + i * 31) % 32000 for i in range(n)]

    def compute(self, rid, tokens, block_ids):
        """The request ran on the GPU: its full blocks hold their KV."""
        hashes = self.sched.call("hashes", rid)
        for w in self.workers:
            w.call("fill", list(zip(block_ids, hashes)))

    def finish(self, rids_blocks):
        """Requests finish in one step: each held until its save is done."""
        for rid, blocks in rids_blocks:
            self.assertEqual(self.sched.call("finished", rid, blocks), (True, None))
        return self.run_until(sent=[rid for rid, _ in rids_blocks])

    def new_request(self, tokens, computed=0):
        self.rid += 1
        rid = "req-%d" % self.rid
        n, load_async = self.sched.call("matched", rid, tokens, computed)
        return rid, n, load_async

    def save_prompt(self, tokens, first_block):
        rid, n, _ = self.new_request(tokens)
        blocks = list(range(first_block, first_block + len(tokens) // BS + 1))
        self.compute(rid, tokens, blocks)
        return rid, blocks

    def plan_load(self, tokens, first_block, computed=0):
        """A new request: asks, allocates (poisoning the blocks to load)."""
        rid, n, load_async = self.new_request(tokens, computed)
        blocks = list(range(first_block, first_block + len(tokens) // BS + 1))
        loaded = blocks[computed // BS:(computed + n) // BS]
        for w in self.workers:
            w.call("poison", loaded)
            # The computed prefix (running requests may share it): the load
            # must leave it alone; assert_prefix_kept checks the marker.
            w.call("poison", blocks[:computed // BS], PREFIX_MARK)
        self.sched.call("alloc", rid, blocks, n)
        hashes = self.sched.call("hashes", rid)
        pairs = list(zip(blocks, hashes))[computed // BS:(computed + n) // BS]
        return rid, n, load_async, pairs

    def assert_prefix_kept(self, block_ids):
        for w in self.workers:
            self.assertEqual(w.call("is_poisoned", block_ids, PREFIX_MARK), block_ids,
                             "a load rewrote the request's computed prefix blocks")

    def verify(self, pairs, errors):
        """Every block not reported failed holds exactly its bytes, on every
        worker; every failed block was left untouched."""
        for w, errs in zip(self.workers, errors):
            good = [(b, h) for b, h in pairs if b not in errs]
            self.assertEqual(w.call("check", good), [], "loaded blocks with wrong bytes")
            bad = [b for b, _ in pairs if b in errs]
            self.assertEqual(w.call("is_poisoned", bad), bad, "a failed block was written")


class TensorParallel2(Deployment):
    def test_concurrent_requests_saved_and_loaded_byte_verified(self):
        # Three prompts computed and finished in the same step.
        a, b, c = self.tokens(41, 1), self.tokens(26, 2), self.tokens(33, 3)
        ra, ba = self.save_prompt(a, 0)
        rb, bb = self.save_prompt(b, 12)
        rc, bc = self.save_prompt(c, 20)
        self.assertEqual(self.finish([(ra, ba), (rb, bb), (rc, bc)]), [set(), set()])
        st = self.sched.call("stats")
        self.assertEqual(st["stored_blocks"], 2 * (10 + 6 + 8))  # one copy per TP rank
        ns = [w.call("namespace") for w in self.workers]
        self.assertNotEqual(ns[0], ns[1])
        self.assertIn("|tp=0/2|", ns[0])
        # Three requests load at once: a's prefix extended, b's with 2 blocks
        # computed locally, c whole; and a fourth prompt saves meanwhile.
        d = a + self.tokens(9, 4)
        rd, nd, async_d, pd = self.plan_load(d, 30)
        re_, ne, _, pe = self.plan_load(b + self.tokens(6, 5), 44, computed=2 * BS)
        rf, nf, _, pf = self.plan_load(c, 54)
        self.assertEqual((nd, ne, nf), (40, 24 - 2 * BS, 32))
        self.assertTrue(async_d)
        g = self.tokens(17, 6)
        rg, bg = self.save_prompt(g, 0)  # a's blocks, free again
        self.assertEqual(self.sched.call("finished", rg, bg), (True, None))
        errors = self.run_until(sent=[rg], recv=[rd, re_, rf])
        self.assertEqual(errors, [set(), set()])
        self.verify(pd + pe + pf, errors)
        self.assert_prefix_kept([44, 45])  # re_'s 2 computed blocks
        # g's blocks are there now, for both ranks
        rh, nh, _, ph = self.plan_load(g, 30)
        self.assertEqual(nh, 16)
        self.assertEqual(self.run_until(recv=[rh]), [set(), set()])
        self.verify(ph, [set(), set()])

    def test_server_restart_in_the_middle(self):
        a = self.tokens(33, 11)
        ra, ba = self.save_prompt(a, 0)
        self.finish([(ra, ba)])
        self.sched.call("flush")
        # The scheduler planned a load; the server dies before the workers run it.
        rb, nb, _, pb = self.plan_load(a, 20)
        self.assertEqual(nb, 32)
        stop_server(self.srv, signal.SIGKILL)
        errors = self.run_until(recv=[rb])
        want = {b for b, _ in pb}
        self.assertEqual(errors, [want, want])  # every block recomputed
        self.verify(pb, errors)                 # and none written
        # While it is down: the scheduler says 0 (the engine computes), and a
        # finished request's save fails but is still reported (blocks freed).
        self.assertEqual(self.new_request(a)[1], 0)
        rc, bc = self.save_prompt(self.tokens(13, 12), 40)
        self.assertEqual(self.finish([(rc, bc)]), [set(), set()])
        # Back (same SSD directory): every process re-attaches on its own.
        self.restart()
        rd, n, _, pd = self.plan_load(a, 20)
        self.assertEqual(n, 32)
        errors = self.run_until(recv=[rd])
        self.assertEqual(errors, [set(), set()])
        self.verify(pd, errors)
        # and stores work again
        re_, be = self.save_prompt(self.tokens(21, 13), 45)
        self.finish([(re_, be)])
        rf, nf, _, pf = self.plan_load(self.tokens(21, 13), 50)
        self.assertEqual(nf, 20)
        self.assertEqual(self.run_until(recv=[rf]), [set(), set()])
        self.verify(pf, [set(), set()])

    def test_corrupt_block_in_the_middle(self):
        a = self.tokens(33, 21)
        ra, ba = self.save_prompt(a, 0)
        self.finish([(ra, ba)])
        self.sched.call("flush")
        stop_server(self.srv)
        # Flip a byte of rank 0's block 3 (layer 0 K) in the server's data file.
        hashes = fakes.Request("x", a, BS).block_hashes
        needle = fakes.block_content(hashes[3], 0, 0, 2 * BS * self.HEADS * self.DIM * 2)
        needle = needle[:BS * self.HEADS * self.DIM * 2].tobytes()
        # A server of any geometry keeps each geometry's SSD data in a
        # subdirectory named by it: both TP ranks' slices are one geometry.
        paths = glob.glob(os.path.join(self.ssd, "g*", "kvtier.data"))
        self.assertEqual(len(paths), 1, paths)
        path = paths[0]
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(needle)
            self.assertGreaterEqual(at, 0, "rank 0's block 3 not found in the data file")
            self.assertEqual(data.find(needle, at + 1), -1)
            f.seek(at + 7)
            f.write(bytes([data[at + 7] ^ 0xFF]))
        self.restart()
        rb, n, _, pb = self.plan_load(a, 20)
        self.assertEqual(n, 32)
        errors = self.run_until(recv=[rb])
        blocks = [b for b, _ in pb]
        # rank 0: block 3 failed its checksum, so it and what follows are
        # recomputed; rank 1's copy is whole. vLLM recomputes the union.
        self.assertEqual(errors, [set(blocks[3:]), set()])
        self.verify(pb, errors)
        self.assertEqual(self.sched.call("stats")["corrupt_blocks"], 1)


    def test_peeks_once_per_waiting_request_until_its_prefix_changes(self):
        """vLLM asks for a waiting request every step; the server is peeked
        once per TP rank's namespace, then not again until the request's
        computed prefix changes. A peek pins nothing: the server plans no
        load (its lookups stay put) and there is nothing to cancel. The
        peeks are counted by the connector (the server counts none)."""
        a = self.tokens(33, 71)
        ra, ba = self.save_prompt(a, 0)
        self.finish([(ra, ba)])
        before, rt = self.sched.call("stats"), self.sched.call("peeks_sent")
        trips = self.sched.call("lookup_round_trips")
        rid, n, _ = self.new_request(a)
        self.assertEqual(n, 32)
        for _ in range(5):  # five more steps waiting (no room for it yet)
            self.assertEqual(self.sched.call("ask", rid, 0), (32, True))
        self.assertEqual(self.sched.call("peeks_sent") - rt, 2)  # TP 2: one per rank
        st = self.sched.call("stats")
        self.assertEqual(st["lookups"] - before["lookups"], 0)  # nothing planned, pinned
        self.assertEqual(st["cancelled_tasks"] - before["cancelled_tasks"], 0)  # nor cancelled
        # A local prefix cache hit changed its computed prefix: asked again.
        self.assertEqual(self.sched.call("ask", rid, 2 * BS), (24, True))
        self.assertEqual(self.sched.call("ask", rid, 2 * BS), (24, True))
        self.assertEqual(self.sched.call("peeks_sent") - rt, 4)
        # A miss costs one round trip too (both ranks' namespaces in it).
        self.assertEqual(self.new_request(self.tokens(33, 72))[1], 0)
        self.assertEqual(self.sched.call("peeks_sent") - rt, 6)
        # Scheduled (allocated): forgotten, so a preempted request is asked afresh.
        self.sched.call("alloc", rid, list(range(20, 29)), 24)
        self.sched.call("ask", rid, 2 * BS)
        self.assertEqual(self.sched.call("peeks_sent") - rt, 8)
        self.assertEqual(self.sched.call("lookup_round_trips") - trips, 4)  # one per ask
        self.assertEqual(self.sched.call("stats")["lookups"] - before["lookups"], 0)


    def test_requests_added_together_are_looked_up_in_one_round_trip(self):
        """vLLM adds a burst of requests (on_new_request each), then asks
        for them one by one in one step: the first ask peeks for all of
        them, both TP ranks' namespaces, in one round trip to the server;
        every answer is what asking each alone gives (hits, a shorter hit,
        misses)."""
        a, b = self.tokens(33, 81), self.tokens(41, 82)
        ra, ba = self.save_prompt(a, 0)
        rb, bb = self.save_prompt(b, 12)
        self.finish([(ra, ba), (rb, bb)])
        prompts = [a, b, a[:20] + self.tokens(13, 83), self.tokens(33, 84), b, a]
        want = [32, 40, 20, 0, 40, 32]
        rids = []
        for p in prompts:
            self.rid += 1
            rids.append("req-%d" % self.rid)
            self.sched.call("add", rids[-1], p)
        peeks, trips = self.sched.call("peeks_sent"), self.sched.call("lookup_round_trips")
        got = [self.sched.call("ask", r, 0)[0] for r in rids]
        self.assertEqual(got, want)
        self.assertEqual(self.sched.call("lookup_round_trips") - trips, 1)
        self.assertEqual(self.sched.call("peeks_sent") - peeks, 2 * len(prompts))
        # Asked again next step (still waiting): nothing sent. A local prefix
        # hit changes one's computed prefix: that one is asked alone.
        self.assertEqual([self.sched.call("ask", r, 0)[0] for r in rids], want)
        self.assertEqual(self.sched.call("ask", rids[1], 2 * BS)[0], 32)
        self.assertEqual(self.sched.call("lookup_round_trips") - trips, 2)
        # Loads planned from batched answers land byte-verified.
        rp, n, _, pp = self.plan_load(b, 40)
        self.assertEqual(n, 40)
        self.verify(pp, self.run_until(recv=[rp]))


class HeadMajorTensorParallel2(Deployment):
    """vLLM's CPU backend (CPU_ATTN): (2, num_blocks, num_kv_heads,
    block_size, head_size) per layer, 4 KV heads per rank (llama3-8b at TP
    2); the scheduler expects it from the device, as the workers do."""
    MODEL, LAYERS, HEADS, DIM, MLA = "llama3-8b", 32, 4, 128, False
    SSD, DEVICE = False, "cpu"

    def test_head_major_blocks_saved_and_loaded_byte_verified(self):
        ns = [w.call("namespace") for w in self.workers]
        self.assertIn("|layout=HND|", ns[0])
        a = self.tokens(21, 41)
        ra, ba = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(ra, ba)]), [set(), set()])
        rb, nb, _, pb = self.plan_load(a + self.tokens(3, 42), 10, computed=BS)
        self.assertEqual(nb, 4 * BS)
        errors = self.run_until(recv=[rb])
        self.assertEqual(errors, [set(), set()])
        self.verify(pb, errors)
        self.assert_prefix_kept([10])


class MlaTensorParallel2(Deployment):
    """MLA: one latent per token, the same on every TP rank: one copy in the
    server (written by rank 0), L3 hits for every rank."""
    MODEL, LAYERS, HEADS, DIM, MLA = "deepseek-v3", 61, 1, 576, True
    SSD = False

    def test_one_copy_written_by_rank_0_read_by_all(self):
        a = self.tokens(25, 31)
        ra, ba = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(ra, ba)]), [set(), set()])  # both ranks report it
        st = self.sched.call("stats")
        self.assertEqual((st["stores"], st["stored_blocks"]), (1, 6))
        ns = [w.call("namespace") for w in self.workers]
        self.assertEqual(ns[0], ns[1])
        self.assertIn("|mla|", ns[0])
        peeks = self.sched.call("peeks_sent")
        rb, nb, async_b, pb = self.plan_load(a + self.tokens(5, 32), 10)
        self.assertEqual((nb, async_b), (24, True))
        # one peek for both TP ranks: the one copy is the same bytes
        self.assertEqual(self.sched.call("peeks_sent") - peeks, 1)
        errors = self.run_until(recv=[rb])
        self.assertEqual(errors, [set(), set()])
        self.verify(pb, errors)
        self.assertEqual(self.sched.call("stats")["loads"], 2)  # one per rank


class PipelineParallel2(Deployment):
    """PP 2 (TP 1): "tiny"'s 4 layers, 2 per stage, both stages on one
    server (`kvtier serve --layers 2`: a stage's geometry), each stage's
    blocks in its own namespace; the scheduler asks each stage."""
    MODEL, LAYERS, HEADS, DIM = "tiny", 2, 2, 64
    SSD, TP, PP, STAGES = False, 1, 2, [2, 2]

    def total(self, stat):
        """A server stat over every stage's server (one when shared)."""
        sts = self.sched.call("stage_stats")
        return sum(st[stat] for st in (sts[:1] if not self.STAGE_SERVERS else sts))

    def test_stages_store_and_load_their_own_layers_byte_verified(self):
        ns = [w.call("namespace") for w in self.workers]
        self.assertIn("|tp=0/1|pp=0/2", ns[0])
        self.assertIn("|tp=0/1|pp=1/2", ns[1])
        a = self.tokens(41, 51)
        ra, ba = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(ra, ba)]), [set(), set()])
        self.assertEqual(self.total("stored_blocks"), 2 * 10)  # one copy per stage
        before = self.sched.call("peeks_sent")
        rb, nb, async_b, pb = self.plan_load(a + self.tokens(7, 52), 20, computed=BS)
        self.assertEqual((nb, async_b), (40 - BS, True))
        self.assertEqual(self.sched.call("peeks_sent") - before, 2)  # one per stage
        errors = self.run_until(recv=[rb])
        self.assertEqual(errors, [set(), set()])
        self.verify(pb, errors)  # each stage: its own layers' bytes
        self.assert_prefix_kept([20])


class PipelineParallel2StageServers(PipelineParallel2):
    """PP 2 with one server per stage ("{pp_rank}" in the socket path),
    stages of 3 and 2 layers (vLLM's split of 5: the remainder to the
    first stages): a block is a hit only when every stage's server has it."""
    STAGE_SERVERS, STAGES = True, [3, 2]

    def test_hit_only_when_every_stage_has_the_block(self):
        a = self.tokens(33, 61)
        ra, ba = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(ra, ba)]), [set(), set()])
        self.assertEqual([st["stored_blocks"] for st in self.sched.call("stage_stats")], [8, 8])
        self.assertEqual(self.new_request(a)[1], 32)
        # Stage 1's server comes back empty; stage 0's still has every block.
        stop_server(self.srvs[1])
        self.restart(stage=1)
        self.assertEqual([st["stored_blocks"] for st in self.sched.call("stage_stats")], [8, 0])
        self.assertEqual(self.new_request(a)[1], 0)
        # Stored again (stage 0 has it already, stage 1 stores): both hit.
        rc, bc = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(rc, bc)]), [set(), set()])
        rd, nd, _, pd = self.plan_load(a, 20)
        self.assertEqual(nd, 32)
        errors = self.run_until(recv=[rd])
        self.assertEqual(errors, [set(), set()])
        self.verify(pd, errors)


class PipelineTensorParallel(PipelineParallel2):
    """TP 2 x PP 2: four workers, four namespaces on one server ("tiny" at
    TP 2, 2 of its layers per stage); a request asks each of them once."""
    HEADS, TP = 1, 2

    def test_stages_store_and_load_their_own_layers_byte_verified(self):
        ns = [w.call("namespace") for w in self.workers]
        self.assertEqual(len(set(ns)), 4)
        for n, (r, p) in zip(ns, [(0, 0), (1, 0), (0, 1), (1, 1)]):
            self.assertIn("|tp=%d/2|pp=%d/2" % (r, p), n)
        a = self.tokens(29, 81)
        ra, ba = self.save_prompt(a, 0)
        self.assertEqual(self.finish([(ra, ba)]), [set()] * 4)
        self.assertEqual(self.total("stored_blocks"), 4 * 7)
        before = self.sched.call("peeks_sent")
        rb, nb, _, pb = self.plan_load(a + self.tokens(3, 82), 10)
        self.assertEqual(nb, 28)
        self.assertEqual(self.sched.call("peeks_sent") - before, 4)
        errors = self.run_until(recv=[rb])
        self.assertEqual(errors, [set()] * 4)
        self.verify(pb, errors)


if __name__ == "__main__":
    unittest.main()

"""kvtier.Client against a real `kvtier serve` process started here: one
engine process stores, another loads the same prefix through the server's
shared tier, byte-verified (token and keyed requests); a geometry other
than the server's is refused naming the field; a lost server gives
ConnectionFailure naming the socket."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from _util import HERE, skip_if_unloadable

PY = sys.executable


def setUpModule():
    skip_if_unloadable()
    global kvtier
    import kvtier


def kvtier_bin():
    """The kvtier CLI beside the library the binding loaded (KVTIER_BIN overrides)."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        return env
    import kvtier  # this module's global is set by its setUpModule only
    return os.path.join(os.path.dirname(os.path.abspath(kvtier.LIB_PATH)), "kvtier")


def start_server(sock, *extra, page=16, tp=1, model="tiny"):
    """`kvtier serve` on sock (model's geometry at tensor-parallel size tp,
    page tokens per page; model None: no --model, so the server takes each
    client's own geometry, as the engines' deployments run it); returns the
    process once it listens."""
    exe = kvtier_bin()
    if not os.path.exists(exe):
        raise unittest.SkipTest("no kvtier CLI at %s (set KVTIER_BIN)" % exe)
    log = open(sock + ".log", "w")
    geo = ["--model", model, "--page", str(page), "--tp", str(tp)] if model else []
    p = subprocess.Popen([exe, "serve", "--socket", sock] + geo +
                         ["--set", "cpu_capacity=16MiB", "--set", "huge_pages=false"] +
                         list(extra), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    for _ in range(200):
        if os.path.exists(sock):
            return p
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    with open(sock + ".log") as f:
        raise AssertionError("kvtier serve did not start: " + f.read())


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0, "kvtier serve exited %s" % p.returncode


def worker(sock, mode, seed, keyed=False, blocks=None):
    """keyed: True (chained keys), "independent" (SGLang's independent
    page keys) or False (tokens); blocks: the first this many of the
    request's 4 blocks only."""
    args = [PY, os.path.join(HERE, "client_worker.py"), sock, mode, str(seed)]
    if keyed:
        args.append("ikeys" if keyed == "independent" else "keys")
    if blocks is not None:
        args.append("blocks=%d" % blocks)
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("worker %s failed (%d):\n%s%s" % (mode, r.returncode, r.stdout,
                                                              r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


class ClientThroughServer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtcl")
        self.sock = os.path.join(self.dir, "node.sock")
        self.srv = start_server(self.sock)

    def tearDown(self):
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def check_store_then_load(self, seed, keyed):
        s = worker(self.sock, "store", seed, keyed)
        bt = s["block_tokens"]
        self.assertEqual(s["status"], 0)
        self.assertEqual(s["stored"], 4 * bt)
        ld = worker(self.sock, "load", seed, keyed)
        self.assertEqual(ld["matched"], 4 * bt)
        self.assertEqual(ld["status"], 0)
        self.assertGreater(ld["bytes_checked"], 0)
        self.assertEqual(ld["mismatches"], 0)
        # The server counted both processes' traffic.
        self.assertGreaterEqual(ld["stats"]["stores"], 1)
        self.assertGreaterEqual(ld["stats"]["loads"], 1)
        return s, ld

    def test_tokens_store_in_one_process_load_in_another(self):
        self.check_store_then_load(5, keyed=False)

    def test_keys_store_in_one_process_load_in_another(self):
        self.check_store_then_load(6, keyed=True)
        # A token request over the same tokens never meets the keyed chain.
        miss = worker(self.sock, "load", 6, keyed=False)
        self.assertEqual(miss["matched"], 0)

    def test_in_process_client_surface(self):
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        eng = kvtier.EmulatedEngine(geo, 64)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            toks = list(range(1, 2 * bt + 2))
            pages = list(range(len(toks) // 16 + 1))
            plan = cl.prepare_store(toks)
            self.assertEqual((plan.first_token, plan.num_tokens), (0, 2 * bt))
            eng.fill(toks, pages)
            cl.launch(plan.task, pages)
            for _ in range(1000):
                r = cl.try_wait(plan.task)
                if r is not None:
                    break
                time.sleep(0.005)
            self.assertTrue(r.ok)
            lookups = cl.stats()["lookups"]
            self.assertEqual(cl.peek(toks), 2 * bt)  # no task: nothing to cancel
            self.assertEqual(cl.peek(toks, ns="other"), 0)
            self.assertEqual(cl.stats()["lookups"], lookups)
            m = cl.lookup(toks)
            self.assertEqual(m.matched_tokens, 2 * bt)
            cl.cancel(m.task)
            self.assertEqual([x.status for x in cl.poll()], [kvtier.STATUS["ECANCELED"]])
            with self.assertRaises(kvtier.InvalidArgument) as e:
                cl.lookup(keys=["ok", b""])
            self.assertIn("keys[1]", str(e.exception))
            with self.assertRaises(kvtier.InvalidArgument) as e:
                cl.peek(keys=["ok", b""])
            self.assertIn("keys[1]", str(e.exception))
            cl.flush(1)
            self.assertEqual(cl.stats()["stores"], 1)
        with self.assertRaises(kvtier.StateError):
            cl.stats()
        eng.close()
        other = kvtier.Geometry.preset("tiny", 16, 2)  # TP 2: other heads per rank
        with self.assertRaises(kvtier.GeometryMismatch):
            kvtier.Client(self.sock, other, timeout_ms=3000)
        other.close()
        # The server goes away: a call gives ConnectionFailure naming the socket.
        with kvtier.Client(self.sock, geo, timeout_ms=1000) as cl:
            stop_server(self.srv)
            with self.assertRaises(kvtier.ConnectionFailure) as e:
                cl.stats()
            self.assertIn(self.sock, str(e.exception))
            with self.assertRaises(kvtier.ConnectionFailure) as e:
                cl.peek([1, 2, 3])
            self.assertIn(self.sock, str(e.exception))
        geo.close()

    def test_bad_arguments(self):
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        with self.assertRaises(kvtier.InvalidArgument):
            kvtier.Client("", geo)
        with self.assertRaises(kvtier.InvalidArgument):
            kvtier.Client(self.sock, geo, timeout_ms=0)
        with self.assertRaises(kvtier.ConnectionFailure) as e:
            kvtier.Client(os.path.join(self.dir, "none.sock"), geo, timeout_ms=200)
        self.assertIn("none.sock", str(e.exception))
        geo.close()


if __name__ == "__main__":
    unittest.main()

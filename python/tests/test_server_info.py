"""kvtier.server_tiers, kvtier.server_quotas and kvtier.server_info: a node
server's per-geometry tiers, its quota rules and the server as a whole, read from Python on a connection that never
attaches (as `kvtier stats` reads them). A store through one client shows
in its geometry's tier and in its namespace's quota; a geometry the server
does not hold is NotFound naming the ids it holds; a server without quotas
has none; a dead socket is ConnectionFailure naming it."""
import os
import shutil
import tempfile
import unittest

from _util import skip_if_unloadable
from test_client import start_server, stop_server


def setUpModule():
    skip_if_unloadable()
    global kvtier
    import kvtier


class ServerInfo(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvtinfo")
        self.sock = os.path.join(self.dir, "node.sock")
        self.srv = start_server(self.sock, "--set", "server_quotas=tenant=4MiB;*=8MiB",
                                model=None)

    def tearDown(self):
        if self.srv.poll() is None:
            stop_server(self.srv)
        shutil.rmtree(self.dir, ignore_errors=True)

    def store(self, geo, ns, n_blocks=4):
        eng = kvtier.EmulatedEngine(geo, 64)
        with kvtier.Client(self.sock, geo, timeout_ms=3000) as cl:
            cl.register_engine(eng)
            bt = cl.block_tokens
            toks = list(range(11, 11 + n_blocks * bt + 1))
            pages = list(range(len(toks) // 16 + 1))
            plan = cl.prepare_store(toks, ns=ns, visible=True)
            eng.fill(toks, pages, ns=ns)
            cl.launch(plan.task, pages)
            self.assertTrue(cl.wait(plan.task, 5).ok)
            block_bytes = cl.stats()["block_bytes"]
        eng.close()
        return n_blocks * block_bytes

    def test_tiers_and_quotas_after_a_store(self):
        self.assertEqual(kvtier.server_tiers(self.sock), [])
        info = kvtier.server_info(self.sock)
        self.assertEqual(info["version"], kvtier.version())
        self.assertEqual(info["pid"], self.srv.pid)
        self.assertEqual((info["clients"], info["geometries"], info["quotas"]), (0, 0, 2))
        self.assertGreater(info["max_clients"], 0)
        self.assertGreater(info["cpu_capacity_bytes"], 0)
        geo = kvtier.Geometry.preset("tiny", 16, 1)
        stored = self.store(geo, "tenant")
        tiers = kvtier.server_tiers(self.sock)
        self.assertEqual(len(tiers), 1, tiers)
        t = tiers[0]
        self.assertRegex(t["geometry"], r"^g[0-9a-f]{16}$")
        self.assertEqual(t["num_layers"], geo.info()["num_layers"])
        self.assertEqual(t["tokens_per_page"], 16)
        self.assertEqual(t["stats"]["stored_blocks"], 4)
        self.assertEqual(t["stats"]["stored_bytes"], stored)
        self.assertEqual(kvtier.server_tiers(self.sock, geo)[0]["geometry"], t["geometry"])
        other = kvtier.Geometry.preset("tiny", 16, 2)
        with self.assertRaises(kvtier.NotFound) as e:
            kvtier.server_tiers(self.sock, other)
        self.assertIn(t["geometry"], str(e.exception))
        quotas = {q["prefix"]: q for q in kvtier.server_quotas(self.sock)}
        self.assertEqual(set(quotas), {"tenant", "*"})
        self.assertEqual(quotas["tenant"]["limit_bytes"], 4 << 20)
        self.assertEqual(quotas["tenant"]["used_bytes"], stored)
        self.assertEqual(quotas["*"]["used_bytes"], 0)
        # a second geometry: a second tier, listed beside the first
        self.store(other, "other")
        self.assertEqual(len(kvtier.server_tiers(self.sock)), 2)
        self.assertEqual(kvtier.server_info(self.sock)["geometries"], 2)
        self.assertGreater({q["prefix"]: q for q in kvtier.server_quotas(self.sock)}["*"]
                           ["used_bytes"], 0)
        # all three as one reading (kvtier stats' report)
        snap = kvtier.server_snapshot(self.sock)
        self.assertEqual(snap["server"]["pid"], self.srv.pid)
        self.assertEqual((snap["server"]["geometries"], len(snap["tiers"])), (2, 2))
        self.assertEqual((snap["server"]["quotas"], len(snap["quotas"])), (2, 2))
        self.assertEqual({x["geometry"] for x in snap["tiers"]},
                         {x["geometry"] for x in kvtier.server_tiers(self.sock)})
        self.assertEqual({q["prefix"]: q["used_bytes"] for q in snap["quotas"]}["tenant"], stored)
        one = kvtier.server_snapshot(self.sock, geo)
        self.assertEqual([x["geometry"] for x in one["tiers"]], [t["geometry"]])
        self.assertEqual(one["server"]["geometries"], 2)

    def test_errors_name_the_socket_and_the_argument(self):
        stop_server(self.srv)
        with self.assertRaises(kvtier.ConnectionFailure) as e:
            kvtier.server_quotas(self.sock, timeout=0.5)
        self.assertIn(self.sock, str(e.exception))
        with self.assertRaises(kvtier.ConnectionFailure) as e:
            kvtier.server_info(self.sock, timeout=0.5)
        self.assertIn(self.sock, str(e.exception))
        with self.assertRaises(ValueError):
            kvtier.server_tiers(self.sock, geometry="tiny")
        with self.assertRaises(ValueError):
            kvtier.server_snapshot(self.sock, geometry="tiny")
        with self.assertRaises(kvtier.ConnectionFailure) as e:
            kvtier.server_snapshot(self.sock, timeout=0.5)
        self.assertIn(self.sock, str(e.exception))
        with self.assertRaises(ValueError):
            kvtier.server_quotas(self.sock, timeout=-1)


class NoQuotas(unittest.TestCase):
    def test_a_server_without_quotas_has_none(self):
        d = tempfile.mkdtemp(prefix="kvtinfo")
        sock = os.path.join(d, "node.sock")
        srv = start_server(sock)
        try:
            self.assertEqual(kvtier.server_quotas(sock), [])
            self.assertEqual(len(kvtier.server_tiers(sock)), 1)  # the declared model's
        finally:
            stop_server(srv)
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()

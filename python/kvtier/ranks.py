"""One emulated rank, assembled: config, geometry, EmulatedEngine, Cache,
Net, Group and Connector, closed together. Used by the tests and the
example; an engine assembles the same pieces over its own buffers."""
from .cache import Cache
from .config import Config, Geometry
from .connector import Connector
from .emu import EmulatedEngine
from .group import Group, Net
from .sglang import SGLangConnector


class EmulatedRank:
    """Rank `rank` of a pp x cp x tp group over an emulated engine holding
    its TP share of the heads.

    transport: ("inproc", fabric) or ("tcp", host, port) - port 0 on rank 0
    (read the bound port from ``rank.net.port`` before the others connect,
    via ``listen()``/``join()``)."""

    def __init__(self, rank, pp=1, cp=1, tp=1, transport=None, num_layers=4, kv_heads=2,
                 head_dim=16, tokens_per_page=16, num_pages=64, block_tokens=16,
                 cpu_capacity="4MiB", timeout=1.0, ns=b"ns"):
        self.rank, self.pp, self.cp, self.tp = rank, pp, cp, tp
        self.timeout = timeout
        self.num_layers = num_layers
        self._closing = []
        try:
            self.config = self._own(Config({"cpu_capacity": cpu_capacity,
                                            "block_tokens": block_tokens}))
            self.geometry = self._own(Geometry.uniform(num_layers, tokens_per_page, kv_heads,
                                                       head_dim))
            self.engine = self._own(EmulatedEngine(self.geometry, num_pages,
                                                   first_head=(rank % tp) * kv_heads))
            self.cache = self._own(Cache(self.config, self.geometry))
            self.cache.register_engine(self.engine)
            kind = transport[0] if transport else "inproc"
            ranks = pp * cp * tp
            if kind == "inproc":
                self.net = self._own(Net.inproc(transport[1], rank))
            elif kind == "tcp":
                self.net = self._own(Net.tcp(rank, ranks, transport[1], transport[2]))
            else:
                raise ValueError("transport: ('inproc', fabric) or ('tcp', host, port)")
            self.group = self.connector = self.sgl = None
            self.ns = ns
        except BaseException:
            self.close()
            raise

    def _own(self, h):
        self._closing.append(h)
        return h

    def join(self, connect_timeout=10.0):
        """Connects the links (TCP) and forms the group and the connector."""
        self.net.connect(connect_timeout)
        self.group = self._own(Group(self.net, self.pp, self.cp, self.tp,
                                     self.geometry.info()["digest"], self.config.digest(),
                                     timeout=self.timeout))
        self.connector = self._own(Connector(self.group, self.cache))
        self.sgl = SGLangConnector(self.connector, ns=self.ns)
        return self

    def close(self):
        """Closes everything, newest first."""
        while self._closing:
            self._closing.pop().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

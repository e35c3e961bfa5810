"""Rank transports (kvt_net_*, kvt_fabric_*) and rank groups (kvt_group_*).

Ranks as threads of one process share a ``Fabric`` and each opens
``Net.inproc(fabric, rank)``; ranks as processes use ``Net.tcp(...)``
(rank 0 listens; read its port with ``net.port``). A ``Group`` forms over a
net with the startup handshake (versions, pp/cp/tp, geometry and config
digests compared; any difference refuses on every rank with one message)."""
import ctypes
from collections import namedtuple

from . import _lib
from ._arrays import timeout_ms, uint
from ._handle import Handle
from .errors import check, invalid

# What a call blocked on the net waits for (Handle._call_waiting, and the
# keyed _create of a Group): close() on another thread then wakes it with
# kvt_net_interrupt (_wake).
_NET_WAIT = "net"

lib = _lib.lib

ROLE_SYNC_LEADER, ROLE_STAGE_LEADER, ROLE_MEMBER = 1, 2, 3

GroupInfo = namedtuple("GroupInfo", "rank ranks pp_rank cp_rank tp_rank role epoch steps aborted")
GroupInfo.__doc__ = "Where a rank sits in its group, the epoch and the steps done in it."


class Fabric(Handle):
    """Bounded in-process queues between `ranks` ranks (threads); at most
    `depth` messages per ordered pair. Close it after every Net made on it."""

    _destroy = lib.kvt_fabric_destroy

    def __init__(self, ranks, depth=64):
        super().__init__()
        check(self._create(lib.kvt_fabric_create, uint(ranks, "ranks", minimum=1),
                           uint(depth, "depth", minimum=1)))
        self.ranks = int(ranks)


class Net(Handle):
    """One rank's endpoint. Build with Net.inproc or Net.tcp."""

    _destroy = lib.kvt_net_destroy

    def __init__(self):
        super().__init__()
        self.rank = self.ranks = None

    @classmethod
    def inproc(cls, fabric, rank):
        """Rank `rank`'s endpoint on an in-process Fabric (kept alive by the net)."""
        if not isinstance(fabric, Fabric):
            raise invalid("Net.inproc: fabric must be a kvtier.Fabric")
        rank = uint(rank, "rank")
        if rank >= fabric.ranks:
            raise invalid("Net.inproc: rank %d of a %d-rank fabric" % (rank, fabric.ranks))
        n = cls()
        n._borrow(fabric)
        check(n._create(lib.kvt_net_inproc_create, fabric, rank))
        n.rank, n.ranks = rank, fabric.ranks
        return n

    @classmethod
    def tcp(cls, rank, ranks, host="127.0.0.1", port=0, secret=None, max_msg=0, transport="tcp",
            allow_insecure=False):
        """A TCP endpoint: rank 0 is the hub and listens now (port 0: an
        ephemeral port, read it from ``.port``); other ranks connect to
        host:port in connect(). secret: 16..1024 bytes for mutual HMAC auth.
        transport: "tcp", or "ucx" to move the links onto UCX tag messages
        once joined (every rank the same). A hub on a host beyond 127.x needs
        a secret unless allow_insecure=True (a trusted network)."""
        rank, ranks = uint(rank, "rank"), uint(ranks, "ranks", minimum=1)
        if rank >= ranks:
            raise invalid("Net.tcp: rank %d of %d ranks" % (rank, ranks))
        if not isinstance(host, str):
            raise invalid("Net.tcp: host must be a numeric IPv4 string")
        port = uint(port, "port", bits=16)
        if rank != 0 and port == 0:
            raise invalid("Net.tcp: rank %d needs the hub's port (port=0 is for rank 0 only)" % rank)
        n = cls()
        p = _lib.NetTcpParams()
        p.rank, p.ranks, p.host, p.port = rank, ranks, host.encode(), port
        if secret is not None:
            sb = bytes(secret)
            buf = ctypes.create_string_buffer(sb, len(sb))
            p.secret, p.secret_len = ctypes.cast(buf, ctypes.c_void_p), len(sb)
            n._keep.append(buf)
        p.max_msg = uint(max_msg, "max_msg")
        wires = {"tcp": 0, "ucx": 1}
        if not isinstance(transport, str) or transport.lower() not in wires:
            raise invalid("Net.tcp: transport %r; expected one of tcp, ucx" % (transport,))
        p.transport = wires[transport.lower()]
        if not isinstance(allow_insecure, bool):
            raise invalid("Net.tcp: allow_insecure must be True or False, not %r" % (allow_insecure,))
        p.allow_insecure = int(allow_insecure)
        check(n._create(lib.kvt_net_tcp_create, ctypes.byref(p)))
        n.rank, n.ranks = rank, ranks
        return n

    @property
    def port(self):
        """The hub's bound port (rank 0 of a TCP net)."""
        out = ctypes.c_uint16()
        check(self._call(lib.kvt_net_tcp_port, ctypes.byref(out)))
        return out.value

    def connect(self, timeout):
        """Establishes the links within timeout seconds (> 0). A close() on
        another thread meanwhile interrupts it (kvt_net_interrupt): it raises
        (KVT_ECANCELED) within milliseconds."""
        ms = timeout_ms(timeout)
        if ms <= 0:
            raise invalid("connect: timeout must be > 0 seconds")
        check(self._call_waiting(_NET_WAIT, lib.kvt_net_connect, ms))

    def interrupt(self):
        """Thread-safe: ends the waits in progress on this net (a connect, or
        an exchange of a Group or Connector over it) within milliseconds, and
        fails every later one (KVT_ECANCELED). Afterwards the net, group and
        connector are good only for closing. close() does this by itself."""
        check(self._call(lib.kvt_net_interrupt))

    def _wake(self, keys):
        lib.kvt_net_interrupt(self._h)


class Group(Handle):
    """A formed rank group of pp x cp x tp ranks over `net` (kept alive by
    the group). ``timeout`` (seconds) is every exchange's deadline T: an
    abort reaches every rank within 2T. Creation runs the handshake.

    close() from another thread while a call runs (reform or abort here, a
    step or reform in a Connector over this group) interrupts the net
    (kvt_net_interrupt): that call raises within milliseconds, and the net
    is good only for closing afterwards. So is the handshake inside
    Group(...) itself: a close() of the net on another thread meanwhile
    closes the group being created first, which interrupts the net, and
    Group(...) raises Cancelled (KVT_ECANCELED, "refused to form ...
    stopped waiting for rank N's hello") within milliseconds instead of
    waiting for the handshake's deadline."""

    _destroy = lib.kvt_group_destroy

    def __init__(self, net, pp, cp, tp, geometry_digest, config_digest, timeout=1.0, epoch=1):
        super().__init__()
        if not isinstance(net, Net):
            raise invalid("Group: net must be a kvtier.Net")
        ms = timeout_ms(timeout)
        if not 1 <= ms <= 600000:
            raise invalid("Group: timeout %r s is outside [0.001, 600]" % (timeout,))
        p = _lib.GroupParams(uint(pp, "pp", minimum=1), uint(cp, "cp", minimum=1),
                             uint(tp, "tp", minimum=1), uint(geometry_digest, "geometry_digest", 64),
                             uint(config_digest, "config_digest", 64), ms, uint(epoch, "epoch", 64))
        self._borrow(net)
        self.net = net  # before the handshake: _wake interrupts it through this net
        check(self._create(lib.kvt_group_create, net, ctypes.byref(p), key=_NET_WAIT))

    def abort(self, reason=None):
        """Aborts the group now (e.g. from an engine exception handler): every
        rank observes it within 2T and its diagnostic names `reason`."""
        r = None if reason is None else str(reason).encode("utf-8", "replace")
        check(self._call_waiting(_NET_WAIT, lib.kvt_group_abort, r))

    def reform(self, timeout):
        """Re-forms under the epoch the leader agrees (every rank calls it)."""
        check(self._call_waiting(_NET_WAIT, lib.kvt_group_reform, timeout_ms(timeout)))

    def _wake(self, keys):
        # A reform or abort, or the handshake in __init__ (self._h still
        # NULL then): all wait on the net, which outlives this group (it is
        # closed only after its dependents) and is interrupted by its own
        # pointer. The interrupt is sticky, so a wake that comes before the
        # call is inside its wait still ends it.
        lib.kvt_net_interrupt(self.net._h)

    def info(self):
        """A GroupInfo."""
        gi = _lib.GroupInfo()
        check(self._call(lib.kvt_group_info_get, ctypes.byref(gi)))
        return GroupInfo(*(getattr(gi, k) for k, _ in _lib.GroupInfo._fields_))

    @property
    def diagnostic(self):
        """Why the group aborted or refused to form ('' while healthy)."""
        return _lib.cstr(self._call(lib.kvt_group_diagnostic))

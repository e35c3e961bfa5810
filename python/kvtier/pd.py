"""Prefill -> decode hand-off (kvt_pd_*), shaped like SGLang's disaggregation
connector: a ``BootstrapServer`` (the directory), one ``Sender`` per prefill
rank (SGLang's KVSender side) and one ``Receiver`` per decode rank (the
KVReceiver side). Requests are *rooms* (SGLang's ``bootstrap_room``, any
64-bit id); every room reports a ``KVPoll`` state numbered as SGLang's.

Per request::

    decode rank:  receiver.room(room, pages, num_tokens, prefix_tokens=0)
    prefill rank: sender.room(room); ...compute...; sender.send(room, pages, num_tokens)
    both:         receiver.poll(room) / sender.poll(room) -> KVPoll
                  (or wait(room, timeout) until Success / Failed), then clear(room)

The decode side receives straight into its engine pages; every page is
checksummed (XXH3) and verified. docs/pd.md has the protocol, the geometry
rules (TP head slicing, GQA replicas, MLA, DCP, re-paging) and the room state
machine. Timeouts are seconds, as everywhere in the binding.
"""
import ctypes
import enum
from collections import namedtuple
from ctypes import POINTER, Structure, c_char, c_char_p, c_int, c_int64, c_size_t, c_uint16, \
    c_uint32, c_uint64, c_void_p
from dataclasses import dataclass

from . import _lib
from ._arrays import timeout_ms, u32_array, u32_ptr, uint
from ._handle import Handle, call
from .cache import register_memory
from .config import Geometry
from .emu import EmulatedEngine
from .errors import STATUS, check, invalid, make_error, status_name

lib = _lib.lib

# ---------------------------------------------------------------------------
# C structs (include/kvtier.h, "Prefill -> decode transfer"), checked against
# the loaded library below exactly as _lib checks the others.


class NetParams(Structure):
    """kvt_pd_net_params."""
    _fields_ = [("bind_host", c_char_p), ("port", c_uint16), ("secret", c_void_p),
                ("secret_len", c_size_t), ("max_frame", c_uint32), ("transport", c_int),
                ("heartbeat_ms", c_uint32), ("peer_timeout_ms", c_uint32),
                ("allow_insecure", c_uint32)]


class Rank(Structure):
    """kvt_pd_rank."""
    _fields_ = [("tp_size", c_uint32), ("tp_rank", c_uint32), ("dcp_size", c_uint32),
                ("dcp_rank", c_uint32), ("kv_head_replicas", c_uint32)]


class Params(Structure):
    """kvt_pd_params."""
    _fields_ = [("net", NetParams), ("bootstrap_host", c_char_p), ("bootstrap_port", c_uint16),
                ("rank", Rank), ("geo", c_void_p), ("mem", POINTER(_lib.EngineMemory)),
                ("bootstrap_timeout_ms", c_uint32), ("waiting_timeout_ms", c_uint32),
                ("transfer_timeout_ms", c_uint32), ("connect_timeout_ms", c_uint32),
                ("checksum_threads", ctypes.c_int32)]


class RoomParams(Structure):
    """kvt_pd_room_params."""
    _fields_ = [("pages", POINTER(c_uint32)), ("num_pages", c_uint32), ("num_tokens", c_uint32),
                ("prefix_tokens", c_uint32)]


class CRoomInfo(Structure):
    """kvt_pd_room_info."""
    _fields_ = [("state", c_int), ("error", c_int), ("message", c_char * 160), ("bytes", c_uint64),
                ("abort_acks", c_uint32), ("peers", c_uint32)]


class CBootstrapStats(Structure):
    """kvt_pd_bootstrap_stats."""
    _fields_ = [("prefill_ranks", c_uint32), ("lookups", c_uint64), ("refused", c_uint64)]


for _cname, _pyt in (("kvt_pd_net_params", NetParams), ("kvt_pd_rank", Rank),
                     ("kvt_pd_params", Params), ("kvt_pd_room_params", RoomParams),
                     ("kvt_pd_room_info", CRoomInfo), ("kvt_pd_bootstrap_stats", CBootstrapStats)):
    _want = lib.kvt_abi_struct_size(_cname.encode())
    if _want == 0:
        raise ImportError("kvtier: %s does not report sizeof(%s) (kvt_abi_struct_size gives 0): "
                          "it predates this binding; rebuild it" % (_lib.LIB_PATH, _cname))
    if _want != ctypes.sizeof(_pyt):
        raise ImportError("kvtier: %s has sizeof(%s) = %d but this binding expects %d; "
                          "the binding and the library are from different versions"
                          % (_lib.LIB_PATH, _cname, _want, ctypes.sizeof(_pyt)))

_H, _PH, _st = c_void_p, POINTER(c_void_p), c_int
_PROTOS = {
    "kvt_pd_bootstrap_create": (_st, [_PH, POINTER(NetParams)]),
    "kvt_pd_bootstrap_port": (_st, [_H, POINTER(c_uint16)]),
    "kvt_pd_bootstrap_stats_get": (_st, [_H, POINTER(CBootstrapStats)]),
    "kvt_pd_bootstrap_destroy": (None, [_H]),
    "kvt_pd_sender_create": (_st, [_PH, POINTER(Params)]),
    "kvt_pd_sender_port": (_st, [_H, POINTER(c_uint16)]),
    "kvt_pd_sender_room": (_st, [_H, c_uint64]),
    "kvt_pd_sender_send": (_st, [_H, c_uint64, POINTER(c_uint32), c_uint32, c_uint32]),
    "kvt_pd_sender_poll": (_st, [_H, c_uint64, POINTER(c_int)]),
    "kvt_pd_sender_wait": (_st, [_H, c_uint64, c_int64, POINTER(c_int)]),
    "kvt_pd_sender_abort": (_st, [_H, c_uint64, c_char_p]),
    "kvt_pd_sender_clear": (_st, [_H, c_uint64]),
    "kvt_pd_sender_destroy": (None, [_H]),
    "kvt_pd_receiver_create": (_st, [_PH, POINTER(Params)]),
    "kvt_pd_receiver_room": (_st, [_H, c_uint64, POINTER(RoomParams)]),
    "kvt_pd_receiver_poll": (_st, [_H, c_uint64, POINTER(c_int)]),
    "kvt_pd_receiver_wait": (_st, [_H, c_uint64, c_int64, POINTER(c_int)]),
    "kvt_pd_receiver_abort": (_st, [_H, c_uint64, c_char_p]),
    "kvt_pd_receiver_clear": (_st, [_H, c_uint64]),
    "kvt_pd_receiver_destroy": (None, [_H]),
    "kvt_pd_room_info_get": (_st, [_H, _H, c_uint64, POINTER(CRoomInfo)]),
}
for _name, (_res, _args) in _PROTOS.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError as _e:
        raise ImportError("kvtier: %s lacks %s (an older library?)" % (_lib.LIB_PATH, _name)) from _e
    _fn.restype = _res
    _fn.argtypes = _args

# ---------------------------------------------------------------------------


class KVPoll(enum.IntEnum):
    """A room's state; the same names and numbers as SGLang's
    ``sglang.srt.disaggregation.base.conn.KVPoll`` (and kvt_pd_poll). A room
    only moves forward; Failed overrides anything but Success."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


# The library names its states (kvt_pd_poll_name, SGLang's names): they
# must be these, at these numbers.
if hasattr(lib, "kvt_pd_poll_name"):
    lib.kvt_pd_poll_name.restype = c_char_p
    lib.kvt_pd_poll_name.argtypes = [c_int]
    for _p in KVPoll:
        if _lib.cstr(lib.kvt_pd_poll_name(int(_p))) != _p.name:
            raise ImportError("kvtier: %s names kvt_pd_poll %d %r, this binding %r"
                              % (_lib.LIB_PATH, int(_p), _lib.cstr(lib.kvt_pd_poll_name(int(_p))),
                                 _p.name))

#: transport names -> kvt_pd_transport
TRANSPORTS = {"tcp": 0, "ucx": 1}

BootstrapStats = namedtuple("BootstrapStats", "prefill_ranks lookups refused")
BootstrapStats.__doc__ = ("prefill_ranks registered now (live leases), lookups answered with a "
                          "topology, connections/registrations refused.")


@dataclass(frozen=True)
class RoomInfo:
    """Details of one room (kvt_pd_room_info).

    state: KVPoll; error: the kvt_status that failed it (0 unless Failed);
    bytes: payload bytes moved so far; abort_acks: peers that acknowledged
    *this side's* abort; peers: peers the room involves; message: why it
    failed ('' unless Failed)."""
    state: KVPoll
    error: int
    bytes: int
    abort_acks: int
    peers: int
    message: str

    @property
    def error_name(self):
        """'KVT_EABORTED', ... ('KVT_OK' when the room did not fail)."""
        return status_name(self.error)

    def exception(self):
        """The KvtierError a failed room stands for (None unless it failed),
        e.g. Aborted for an abort, Timeout for a missed deadline."""
        if self.error == 0:
            return None
        return make_error(self.error, self.message or "room failed")


def _secret_bytes(secret):
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise invalid("secret: expected bytes or str, got %s" % type(secret).__name__)
    b = bytes(secret)
    if not 16 <= len(b) <= 1024:
        raise invalid("secret: %d bytes; it must be 16..1024 bytes (every peer proves it holds it)"
                      % len(b))
    return b


def _host(host, what):
    if not isinstance(host, str) or not host:
        raise invalid("%s: expected a numeric IPv4 address string, got %r" % (what, host))
    b = host.encode("ascii", "replace")
    if len(b) >= 64 or b"\0" in b:
        raise invalid("%s: %r is not a numeric IPv4 address" % (what, host))
    return b


def _opt_ms(value, what):
    """An optional duration in seconds -> ms for a uint32 field (None: 0, the
    library's default)."""
    if value is None:
        return 0
    ms = timeout_ms(value, what)
    if ms < 1 or ms > 0xFFFFFFFF:
        raise invalid("%s is %r s: it must be at least 0.001 s (None: the default)" % (what, value))
    return ms


def _net_params(keep, host, port, secret, max_frame, transport, heartbeat, peer_timeout,
                insecure=False):
    """A NetParams whose pointers stay valid while `keep` lives."""
    n = NetParams()
    if not isinstance(insecure, bool):
        raise invalid("insecure is %r: True (listen beyond loopback without a secret) or False"
                      % (insecure,))
    n.allow_insecure = 1 if insecure else 0
    hb = _host(host, "host")
    keep.append(hb)
    n.bind_host = hb
    n.port = uint(port, "port", bits=16)
    sb = _secret_bytes(secret)
    if sb is not None:
        buf = ctypes.create_string_buffer(sb, len(sb))
        keep.append(buf)
        n.secret, n.secret_len = ctypes.cast(buf, c_void_p), len(sb)
    n.max_frame = uint(max_frame, "max_frame")
    if not isinstance(transport, str) or transport.lower() not in TRANSPORTS:
        raise invalid("transport: %r; expected one of %s" % (transport, ", ".join(sorted(TRANSPORTS))))
    n.transport = TRANSPORTS[transport.lower()]
    n.heartbeat_ms = _opt_ms(heartbeat, "heartbeat")
    n.peer_timeout_ms = _opt_ms(peer_timeout, "peer_timeout")
    return n


def _room_id(room):
    return uint(room, "room", bits=64)


def _reason(reason):
    if reason is None:
        return None
    return str(reason).encode("utf-8", "replace").replace(b"\0", b" ")


def parse_bootstrap(bootstrap):
    """(host, port) from a BootstrapServer, an SGLang-style "host:port"
    bootstrap address, or a (host, port) tuple."""
    if isinstance(bootstrap, BootstrapServer):
        host = bootstrap.host if bootstrap.host != "0.0.0.0" else "127.0.0.1"
        return host, bootstrap.port
    if isinstance(bootstrap, str):
        host, sep, port = bootstrap.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise invalid("bootstrap: %r is not 'host:port'" % bootstrap)
        return host, int(port)
    if isinstance(bootstrap, (tuple, list)) and len(bootstrap) == 2:
        return bootstrap[0], bootstrap[1]
    raise invalid("bootstrap: expected a BootstrapServer, 'host:port' or (host, port), got %r"
                  % (bootstrap,))


class BootstrapServer(Handle):
    """The bootstrap service (kvt_pd_bootstrap_*): prefill ranks register
    their KV descriptor and data address (renewed leases), decode ranks look
    the prefill topology up. ``port=0`` binds an ephemeral port (``.port``).
    With ``secret`` (16..1024 bytes), only peers holding it are served. A
    ``host`` that is not a 127.x address needs a secret, or ``insecure=True``
    on a trusted network (else InvalidArgument)."""

    _destroy = lib.kvt_pd_bootstrap_destroy

    def __init__(self, host="127.0.0.1", port=0, secret=None, max_frame=0, heartbeat=None,
                 peer_timeout=None, insecure=False):
        super().__init__()
        keep = []
        n = _net_params(keep, host, port, secret, max_frame, "tcp", heartbeat, peer_timeout, insecure)
        check(self._create(lib.kvt_pd_bootstrap_create, ctypes.byref(n)))
        self._keep.extend(keep)  # (copied by the library; kept for symmetry)
        self.host = host
        out = c_uint16()
        check(self._call(lib.kvt_pd_bootstrap_port, ctypes.byref(out)))
        self.port = out.value

    @property
    def address(self):
        """'host:port', as SGLang passes a bootstrap address."""
        return "%s:%d" % (self.host, self.port)

    def stats(self):
        """BootstrapStats(prefill_ranks, lookups, refused)."""
        s = CBootstrapStats()
        check(self._call(lib.kvt_pd_bootstrap_stats_get, ctypes.byref(s)))
        return BootstrapStats(s.prefill_ranks, s.lookups, s.refused)


class _Endpoint(Handle):
    """What Sender and Receiver share: per-room poll / wait / abort / clear /
    info, and creation from engine memory."""

    _create_fn = _poll = _wait = _abort = _clear = None  # the library's functions
    _role = ""

    def __init__(self, bootstrap, geometry=None, engine=None, *, num_pages=None, buffers=None,
                 base=None, tp_size=1, tp_rank=0, dcp_size=1, dcp_rank=0, kv_head_replicas=1,
                 transport="tcp", secret=None, host="127.0.0.1", port=0, max_frame=0,
                 heartbeat=None, peer_timeout=None, bootstrap_timeout=None,
                 waiting_timeout=None, transfer_timeout=None, connect_timeout=10.0,
                 checksum_threads=None, insecure=False):
        super().__init__()
        what = type(self).__name__
        bs_host, bs_port = parse_bootstrap(bootstrap)
        keep = []
        p = Params()
        p.net = _net_params(keep, host, port, secret, max_frame, transport, heartbeat, peer_timeout,
                            insecure)
        bh = _host(bs_host, "bootstrap host")
        keep.append(bh)
        p.bootstrap_host = bh
        p.bootstrap_port = uint(bs_port, "bootstrap port", bits=16, minimum=1)
        p.rank = Rank(uint(tp_size, "tp_size", minimum=1), uint(tp_rank, "tp_rank"),
                      uint(dcp_size, "dcp_size", minimum=1), uint(dcp_rank, "dcp_rank"),
                      uint(kv_head_replicas, "kv_head_replicas"))
        p.bootstrap_timeout_ms = _opt_ms(bootstrap_timeout, "bootstrap_timeout")
        p.waiting_timeout_ms = _opt_ms(waiting_timeout, "waiting_timeout")
        p.transfer_timeout_ms = _opt_ms(transfer_timeout, "transfer_timeout")
        ct = timeout_ms(connect_timeout, "connect_timeout")
        if not 1 <= ct <= 0xFFFFFFFF:
            raise invalid("connect_timeout is %r s: it must be > 0" % (connect_timeout,))
        p.connect_timeout_ms = ct
        # a bool or None, not 0/1: C's 0 means auto, and 0 == False in Python
        if not (checksum_threads is None or isinstance(checksum_threads, bool)):
            raise invalid("checksum_threads is %r: True (a thread per link), False (none) or "
                          "None (auto)" % (checksum_threads,))
        p.checksum_threads = {None: 0, True: 1, False: -1}[checksum_threads]

        # Engine memory: an EmulatedEngine (kept alive; closing it closes this
        # endpoint first), or the engine's own host buffers (kept alive here).
        # The library keeps pointers into it until this endpoint is destroyed.
        if engine is not None:
            if not isinstance(engine, EmulatedEngine):
                raise invalid("%s: engine must be a kvtier.EmulatedEngine (give an engine's own "
                              "buffers with num_pages= and buffers= / base=)" % what)
            if num_pages is not None or buffers is not None or base is not None:
                raise invalid("%s: give either engine= or num_pages= with buffers= / base=, not both"
                              % what)
            if geometry is None:
                geometry = engine.geometry
            elif not isinstance(geometry, Geometry):
                raise invalid("%s: geometry must be a kvtier.Geometry, got %s"
                              % (what, type(geometry).__name__))
            else:
                geometry.compare(engine.geometry)  # the engine's buffers are laid out for its own
            mem, mem_keep = None, []  # the engine's, once it is borrowed (below)
        else:
            if not isinstance(geometry, Geometry):
                raise invalid("%s: geometry must be a kvtier.Geometry, got %s"
                              % (what, type(geometry).__name__))
            if num_pages is None:
                raise invalid("%s: engine memory missing: pass engine= (an EmulatedEngine) or "
                              "num_pages= with buffers= (layer-first) / base= (page-first)" % what)
            mem, mem_keep = register_memory(what, geometry, num_pages, buffers, base)
        if engine is not None:
            # Borrowed before creation: from now on the engine (whose memory
            # the library will point into) is destroyed only after this endpoint.
            self._borrow(engine)
        try:
            if engine is not None:
                mem = engine.memory()
            p.mem = ctypes.pointer(mem)
            with geometry._use() as geo:  # copied by create
                p.geo = geo
                check(self._create(type(self)._create_fn, ctypes.byref(p)))
            p.geo = None
        except BaseException:
            if engine is not None:
                self._unborrow(engine)
            raise
        self._keep.extend(mem_keep)  # the engine's arrays: the library points into them
        self._keep.extend([mem, p] + keep)
        self.engine = engine
        self.num_pages = int(mem.num_pages)
        self.tp_size, self.tp_rank = p.rank.tp_size, p.rank.tp_rank
        self.dcp_size, self.dcp_rank = p.rank.dcp_size, p.rank.dcp_rank
        self.transport = transport.lower()

    def _wake(self, rooms):
        # close() while threads wait on rooms: the library has no call that
        # wakes every waiter of an endpoint, but kvt_pd_*_abort (thread-safe)
        # fails one room and wakes its waiters, which then return Failed
        # instead of sitting out their timeouts. Destroying the endpoint
        # drops the links anyway, failing these rooms on the peers; the abort
        # tells them now and why. Terminal rooms are left alone; errors (a
        # room cleared meanwhile) are ignored.
        reason = _reason("%s closed while a thread waited on the room" % type(self).__name__)
        st = c_int()
        for room in rooms:
            if type(self)._poll(self._h, room, ctypes.byref(st)) != 0:
                continue
            if st.value not in (KVPoll.Success, KVPoll.Failed):
                type(self)._abort(self._h, room, reason)

    def poll(self, room):
        """The room's KVPoll now (never blocks). NotFound for a room this
        side does not know (never opened, or cleared)."""
        out = c_int()
        check(self._call(type(self)._poll, _room_id(room), ctypes.byref(out)))
        return KVPoll(out.value)

    def wait(self, room, timeout):
        """Waits up to timeout seconds until the room is Success or Failed and
        returns that KVPoll. Raises Timeout (``.state`` = the KVPoll it was
        still in) when it is neither by then. A close() of this endpoint from
        another thread aborts the room (unless it already ended), so the wait
        returns Failed at once; see Handle."""
        out = c_int(-1)
        room = _room_id(room)
        st = self._call_waiting(room, type(self)._wait, room, timeout_ms(timeout), ctypes.byref(out))
        if st == STATUS["ETIMEDOUT"]:
            e = make_error(st)
            e.state = KVPoll(out.value) if out.value >= 0 else None
            raise e
        check(st)
        return KVPoll(out.value)

    def abort(self, room, reason=None):
        """Fails the room now (KVT_EABORTED) and tells every peer; each
        acknowledges (``info(room).abort_acks``). Once it returns, nothing
        more lands in the room's pages."""
        check(self._call(type(self)._abort, _room_id(room), _reason(reason)))

    def clear(self, room):
        """Forgets the room (any state; a live one fails first and its peers
        hear of it). The room id may be reused afterwards; late messages
        about the old one are ignored."""
        check(self._call(type(self)._clear, _room_id(room)))

    def info(self, room):
        """RoomInfo(state, error, bytes, abort_acks, peers, message)."""
        ci = CRoomInfo()
        s, r = (self, None) if self._role == "sender" else (None, self)
        check(call(lib.kvt_pd_room_info_get, s, r, _room_id(room), ctypes.byref(ci)))
        return RoomInfo(KVPoll(ci.state), ci.error, ci.bytes, ci.abort_acks, ci.peers,
                        ci.message.decode("utf-8", "replace"))


class Sender(_Endpoint):
    """A prefill rank (SGLang's KVSender side): listens for decode ranks and
    registers with the bootstrap service within ``connect_timeout`` seconds.

    ``bootstrap``: a BootstrapServer, "host:port" or (host, port).
    Engine memory: ``engine=`` (EmulatedEngine), or ``num_pages=`` with
    ``buffers=[[K, V], ...]`` (layer-first) / ``base=`` (page-first) as numpy
    arrays or CPU torch tensors; kept alive until close().
    ``tp_size``/``tp_rank``, ``dcp_size``/``dcp_rank``, ``kv_head_replicas``
    (GQA: n consecutive TP ranks hold the same KV heads) place the rank.
    ``host``/``port``: the data listener (port 0: ephemeral, ``.port``); a
    host that is not a 127.x address needs ``secret``, or ``insecure=True``.
    ``transport``: "tcp" or "ucx". ``secret``: 16..1024 bytes every peer
    must prove it holds. Room deadlines (seconds, None: the library's
    30 / 30 / 60 s): ``bootstrap_timeout``, ``waiting_timeout``,
    ``transfer_timeout``; links: ``heartbeat``, ``peer_timeout`` (0.1 / 3 s).
    ``checksum_threads``: True hashes each link's pages on a thread of its
    own (the link's thread only moves bytes: faster where cores are spare),
    False on the link's thread, None (default) picks True on hosts with at
    least 8 CPUs.
    """

    _destroy = lib.kvt_pd_sender_destroy
    _create_fn = lib.kvt_pd_sender_create
    _poll = lib.kvt_pd_sender_poll
    _wait = lib.kvt_pd_sender_wait
    _abort = lib.kvt_pd_sender_abort
    _clear = lib.kvt_pd_sender_clear
    _role = "sender"

    @property
    def port(self):
        """The data listener's bound port."""
        out = c_uint16()
        check(self._call(lib.kvt_pd_sender_port, ctypes.byref(out)))
        return out.value

    def room(self, room):
        """Claims a room (the engine has a request with this bootstrap room):
        Bootstrapping until every decode rank that needs this prefill rank
        sent its page table, then WaitingForInput. StateError if already
        claimed."""
        check(self._call(lib.kvt_pd_sender_room, _room_id(room)))

    def send(self, room, pages, num_tokens):
        """Hands the room's KV over: pages[i] holds tokens [i * tokens_per_page,
        ...) of the request's num_tokens tokens (list or uint32 array; copied).
        The pages must keep their content until the room is Success or
        Failed."""
        pg = u32_array(pages, "pages", allow_empty=True)
        check(self._call(lib.kvt_pd_sender_send, _room_id(room), u32_ptr(pg), len(pg),
                         uint(num_tokens, "num_tokens", minimum=1)))


class Receiver(_Endpoint):
    """A decode rank (SGLang's KVReceiver side): looks the prefill topology
    up (retrying until every prefill rank it needs registered, at most
    ``connect_timeout`` seconds), connects to the prefill ranks that feed it
    and registers its descriptor. GeometryMismatch, naming the entry, field
    and both values, when the plan cannot convert a prefill rank's layout to
    this one. Arguments as for Sender (``host``/``port`` are unused: a
    receiver only dials)."""

    _destroy = lib.kvt_pd_receiver_destroy
    _create_fn = lib.kvt_pd_receiver_create
    _poll = lib.kvt_pd_receiver_poll
    _wait = lib.kvt_pd_receiver_wait
    _abort = lib.kvt_pd_receiver_abort
    _clear = lib.kvt_pd_receiver_clear
    _role = "receiver"

    def room(self, room, pages, num_tokens, prefix_tokens=0):
        """Opens a room and sends this rank's page table to its prefill peers.
        pages: this rank's pages for the request (with DCP: of its local
        tokens i // dcp_size); tokens [0, prefix_tokens) are already here and
        are not sent. StateError if the room is open already."""
        pg = u32_array(pages, "pages", allow_empty=True)
        rp = RoomParams(u32_ptr(pg), len(pg), uint(num_tokens, "num_tokens", minimum=1),
                        uint(prefix_tokens, "prefix_tokens"))
        check(self._call(lib.kvt_pd_receiver_room, _room_id(room), ctypes.byref(rp)))

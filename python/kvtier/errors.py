"""Exceptions: every failed kvtier call raises a KvtierError subclass named
after its status, carrying ``.status`` (the negative kvt_status code),
``.status_name`` ("KVT_EINVAL") and the C library's message
(``kvt_last_error()``), e.g.
``KVT_EINVAL: kvt_cache_launch: pages[3] is 9000 but the engine registered 64 pages``.

Argument errors caught in Python before any C call raise ``InvalidArgument``
too (a subclass of both KvtierError and ValueError), so one ``except`` covers
both sides.
"""
from . import _lib

OK = 0
#: kvt_status codes by name, as in include/kvtier.h.
STATUS = {
    "OK": 0, "EINVAL": -1, "ENOMEM": -2, "ENOTFOUND": -3, "EAGAIN": -4, "ETIMEDOUT": -5,
    "ECANCELED": -6, "EIO": -7, "ENOSPC": -8, "EGEOMETRY": -9, "ESTATE": -10, "EBUSY": -11,
    "EFULL": -12, "ECORRUPT": -13, "EUNSUPPORTED": -14, "ESYS": -15, "EPROTO": -16,
    "ECONN": -17, "EABORTED": -18, "EAUTH": -19, "EVERSION": -20,
}
globals().update({"KVT_" + k: v for k, v in STATUS.items()})


def status_name(status):
    """The symbolic name of a kvt_status, e.g. 'KVT_ETIMEDOUT'."""
    return _lib.cstr(_lib.lib.kvt_status_name(int(status)))


def strerror(status):
    """The class description of a kvt_status, e.g. 'deadline expired'."""
    return _lib.cstr(_lib.lib.kvt_strerror(int(status)))


class KvtierError(Exception):
    """A kvtier call failed. ``status`` is the kvt_status code, ``message``
    the library's text naming the argument, field or peer that was wrong."""

    def __init__(self, status, message=""):
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.message = message or strerror(self.status)
        super().__init__("%s: %s" % (self.status_name, self.message))


class InvalidArgument(KvtierError, ValueError):
    """KVT_EINVAL: a bad argument (also raised by Python-side validation)."""


class OutOfMemory(KvtierError, MemoryError):
    """KVT_ENOMEM."""


class NotFound(KvtierError, LookupError):
    """KVT_ENOTFOUND: unknown task, rid or option."""


class NotReady(KvtierError):
    """KVT_EAGAIN: not ready yet, try again."""


class Timeout(KvtierError, TimeoutError):
    """KVT_ETIMEDOUT: a deadline expired."""


class Cancelled(KvtierError):
    """KVT_ECANCELED."""


class IOFailure(KvtierError, OSError):
    """KVT_EIO / KVT_ESYS: an I/O or system call failed."""


class NoSpace(KvtierError):
    """KVT_ENOSPC / KVT_EFULL: a tier, table or queue is full."""


class GeometryMismatch(KvtierError, ValueError):
    """KVT_EGEOMETRY: KV geometries differ (the message names the field)."""


class StateError(KvtierError):
    """KVT_ESTATE / KVT_EBUSY: not valid in the current state."""


class Corrupt(KvtierError):
    """KVT_ECORRUPT: data failed its checksum."""


class Unsupported(KvtierError):
    """KVT_EUNSUPPORTED."""


class ProtocolError(KvtierError):
    """KVT_EPROTO / KVT_EVERSION: a peer broke the protocol or runs another version."""


class ConnectionFailure(KvtierError, ConnectionError):
    """KVT_ECONN / KVT_EAUTH: a link failed, or a peer failed authentication."""


class Aborted(KvtierError):
    """KVT_EABORTED: something was aborted. From a rank group or connector:
    the group aborted and the message carries its diagnostic (recompute,
    then re-form: Connector.reform). From a PD room: either side aborted it
    (the message names which, and why)."""


GroupAborted = Aborted  # the rank-group name, kept for existing handlers


_CLASSES = {
    -1: InvalidArgument, -2: OutOfMemory, -3: NotFound, -4: NotReady, -5: Timeout,
    -6: Cancelled, -7: IOFailure, -8: NoSpace, -9: GeometryMismatch, -10: StateError,
    -11: StateError, -12: NoSpace, -13: Corrupt, -14: Unsupported, -15: IOFailure,
    -16: ProtocolError, -17: ConnectionFailure, -18: Aborted, -19: ConnectionFailure,
    -20: ProtocolError,
}


def error_class(status):
    """The KvtierError subclass raised for a status."""
    return _CLASSES.get(int(status), KvtierError)


def make_error(status, message=None):
    """An exception for status with message (default: kvt_last_error())."""
    if message is None:
        message = _lib.cstr(_lib.lib.kvt_last_error())
    return error_class(status)(status, message)


def check(status, context=None):
    """Raises the matching KvtierError when status is not KVT_OK. The
    message is read from kvt_last_error() on this thread, right away."""
    if status != OK:
        msg = _lib.cstr(_lib.lib.kvt_last_error())
        if context:
            msg = "%s: %s" % (context, msg) if msg else context
        raise error_class(status)(status, msg)
    return status


def invalid(message):
    """An InvalidArgument raised by Python-side validation."""
    return InvalidArgument(STATUS["EINVAL"], message)

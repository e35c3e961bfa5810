"""kvtier's log lines in Python's logging (kvt_set_log_handler).

The library logs what no call returns (a refused connection, a dropped
link, an SSD tier giving up) to stderr by default. route_to_logging() sends
those lines to a logging.Logger ("kvtier" by default) at the matching level;
set_log_handler(fn) to any callable. Lines arrive on kvtier's own threads
(ctypes takes the GIL for each), so fn must be thread-safe and quick, and must
not call set_log_handler itself.
"""
import logging
import threading

from ._lib import LOG_FN, cstr, lib
from .errors import check, invalid

LEVELS = ("error", "warn", "info", "debug")  # kvt_log_level 0..3
_TO_LOGGING = (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)

_mu = threading.Lock()
_installed = None  # the ctypes callback the library may call: kept alive here


def set_log_handler(fn):
    """fn(level, line) for every kvtier line, level one of LEVELS; None
    restores stderr. Once this returns, the previous fn is never called
    again."""
    global _installed

    def trampoline(_user, level, line):
        try:
            fn(LEVELS[level] if 0 <= level < len(LEVELS) else str(level), cstr(line))
        except Exception:  # a handler's failure must not reach the C thread
            pass

    with _mu:
        cb = LOG_FN(trampoline) if fn is not None else LOG_FN()
        check(lib.kvt_set_log_handler(cb, None))
        _installed = cb if fn is not None else None


def set_log_level(level):
    """Logs lines at level ("error", "warn", "info", "debug") and above."""
    if level not in LEVELS:
        raise invalid("set_log_level: level %r is not one of %s" % (level, ", ".join(LEVELS)))
    check(lib.kvt_set_log_level(LEVELS.index(level)))


def route_to_logging(logger=None):
    """Sends kvtier's lines to logger (default logging.getLogger("kvtier"))."""
    log = logger if logger is not None else logging.getLogger("kvtier")
    set_log_handler(lambda level, line: log.log(_TO_LOGGING[LEVELS.index(level)], "%s", line))

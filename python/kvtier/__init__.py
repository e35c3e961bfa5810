"""kvtier for Python engines: a ctypes binding over libkvtier.so.

- Config, Geometry: options and KV geometry.
- Cache: the cache manager (lookup / prepare_store / launch / wait / poll),
  over engine buffers given as numpy arrays or CPU torch tensors.
- Client: the same calls through a node server (`kvtier serve`), attached by
  its Unix socket; several engine processes share one server's tiers.
- EmulatedEngine: checkable paged KV for tests and demos (numpy views).
- Fabric, Net, Group, Connector: rank groups and the multi-rank connector.
- SGLangConnector: FlexKV-shaped methods, one collective step per iteration.
- OffloadingManager: vLLM OffloadingManager-shaped calls over one Cache.
- BootstrapServer, Sender, Receiver, KVPoll: the prefill -> decode hand-off,
  SGLang-shaped (kvtier.pd).
- set_log_handler, route_to_logging, set_log_level: kvtier's log lines in
  the engine's own logs (kvtier.log).
- Errors: KvtierError (.status, .status_name, .message) and one subclass per
  status family (InvalidArgument, Timeout, GroupAborted, ...).

The library is found via KVTIER_LIB, else ../build/libkvtier.so relative to
this package, else the system loader. Timeouts are seconds (>= 0).
"""
from ._lib import LIB_PATH, lib as _clib, cstr as _cstr
from .cache import PAGE_SKIP, TASK_LOAD, TASK_STORE, Cache, Match, StorePlan, TaskResult
from .client import Client, server_info, server_quotas, server_snapshot, server_tiers
from .config import LAYER_FIRST, PAGE_FIRST, Config, Geometry, options
from .connector import (EV_LOAD, EV_LOAD_DONE, EV_RESET, EV_STORE, EV_STORE_DONE,
                        Connector, Event)
from .emu import EmulatedEngine, VerifyResult
from .errors import (STATUS, Cancelled, ConnectionFailure, Corrupt, GeometryMismatch,
                     Aborted, GroupAborted, InvalidArgument, IOFailure, KvtierError, NoSpace,
                     NotFound, NotReady, OutOfMemory, ProtocolError, StateError, Timeout,
                     Unsupported, status_name, strerror)
from .group import Fabric, Group, GroupInfo, Net
from .log import route_to_logging, set_log_handler, set_log_level
from .offload import OffloadingManager, PrepareStoreOutput, block_key
from .pd import BootstrapServer, KVPoll, Receiver, RoomInfo, Sender
from .ranks import EmulatedRank
from .sglang import PendingLoad, SGLangConnector, rid64


def version():
    """The loaded library's version string, e.g. '0.1.0'."""
    return _cstr(_clib.kvt_version_string())


__all__ = [n for n in dir() if not n.startswith("_")]

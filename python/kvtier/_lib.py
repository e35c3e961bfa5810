"""Loading libkvtier.so and declaring its C API for ctypes.

The library is found, in order: the ``KVTIER_LIB`` environment variable (a
path to the .so), ``../build/libkvtier.so`` relative to this package (the
repository's default build: a checkout used in place), then the system
loader: ``libkvtier.so.0`` (the soname ``make install`` puts in the
loader's path, so a ``pip install``ed package needs no variable), then
``libkvtier.so``.
Every struct below mirrors ``include/kvtier.h`` field for field.
"""
import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint16, c_uint32, c_uint64, c_void_p)

KVT_MAX_COMPONENTS = 2
KVT_MAX_LAYERS = 1024
KVT_NET_MAX_RANKS = 256


class OptionInfo(Structure):
    """kvt_option_info."""
    _fields_ = [("name", c_char_p), ("env", c_char_p), ("type", c_char_p),
                ("default_value", c_char_p), ("help", c_char_p)]


class ComponentSpec(Structure):
    """kvt_component_spec: KV heads, head dim, bytes per element."""
    _fields_ = [("kv_heads", c_uint32), ("head_dim", c_uint32), ("elem_size", c_uint32)]


class LayerSpec(Structure):
    """kvt_layer_spec: 2 components (K, V) or 1 (MLA)."""
    _fields_ = [("num_components", c_uint32),
                ("component", ComponentSpec * KVT_MAX_COMPONENTS)]


class GeometryInfo(Structure):
    """kvt_geometry_info."""
    _fields_ = [("num_layers", c_uint32), ("tokens_per_page", c_uint32), ("layout", c_int),
                ("bytes_per_token", c_uint64), ("bytes_per_page", c_uint64),
                ("digest", c_uint64)]


class Key(Structure):
    """kvt_key."""
    _fields_ = [("data", c_void_p), ("len", c_uint32)]


MAX_KEY_LEN = 256       # KVT_MAX_KEY_LEN
MAX_KEYS = 1 << 20      # KVT_MAX_KEYS


class Request(Structure):
    """kvt_request."""
    _fields_ = [("tokens", POINTER(c_uint32)), ("num_tokens", c_uint32),
                ("ns", c_void_p), ("ns_len", c_uint32),
                ("keys", POINTER(Key)), ("num_keys", c_uint32), ("flags", c_uint32)]


REQ_INDEPENDENT_KEYS = 1  # KVT_REQ_INDEPENDENT_KEYS
REQ_VISIBLE_AT_END = 2  # KVT_REQ_VISIBLE_AT_END


class EngineMemory(Structure):
    """kvt_engine_memory."""
    _fields_ = [("num_pages", c_uint32), ("base", c_void_p),
                ("layer_bases", POINTER(c_void_p)), ("buffer_bytes", POINTER(c_uint64)),
                ("kind", ctypes.c_int), ("device", ctypes.c_int32),
                ("page_strides", POINTER(c_uint64)), ("token_strides", POINTER(c_uint64))]


KVT_MEMORY_HOST = 0
KVT_MEMORY_CUDA = 1


class Match(Structure):
    """kvt_match."""
    _fields_ = [("task", c_uint64), ("matched_tokens", c_uint32)]


class StorePlan(Structure):
    """kvt_store_plan."""
    _fields_ = [("task", c_uint64), ("first_token", c_uint32), ("num_tokens", c_uint32)]


class TaskResult(Structure):
    """kvt_task_result."""
    _fields_ = [("task", c_uint64), ("kind", c_int), ("status", c_int),
                ("first_token", c_uint32), ("num_tokens", c_uint32), ("bytes", c_uint64)]


STATS_FIELDS = [
    "lookups", "lookup_tokens", "hit_tokens", "ssd_hit_tokens", "stores", "stored_blocks",
    "stored_bytes", "loads", "loaded_blocks", "loaded_bytes", "evicted_blocks",
    "cpu_dropped_blocks", "failed_tasks", "cancelled_tasks", "expired_tasks",
    "cpu_blocks_used", "cpu_blocks_total", "block_bytes", "ssd_blocks_used",
    "ssd_blocks_total", "ssd_written_blocks", "ssd_read_blocks", "ssd_write_errors",
    "ssd_read_errors", "corrupt_blocks", "recovered_blocks", "index_blocks", "index_bytes",
    "tasks_in_flight"]


class CacheStats(Structure):
    """kvt_cache_stats, plus reserved room so a library with more fields
    appended cannot write past this buffer."""
    _fields_ = [(n, c_uint64) for n in STATS_FIELDS] + [("_reserved", c_uint64 * 64)]


class VerifyResult(Structure):
    """kvt_verify_result."""
    _fields_ = [("bytes_checked", c_uint64), ("mismatches", c_uint64),
                ("first_bad_token", c_uint32), ("first_bad_layer", c_uint32)]


class NetTcpParams(Structure):
    """kvt_net_tcp_params."""
    _fields_ = [("rank", c_uint32), ("ranks", c_uint32), ("host", c_char_p),
                ("port", c_uint16), ("secret", c_void_p), ("secret_len", c_size_t),
                ("max_msg", c_uint32), ("transport", c_int),
                ("allow_insecure", c_uint32)]


class GroupParams(Structure):
    """kvt_group_params."""
    _fields_ = [("pp", c_uint32), ("cp", c_uint32), ("tp", c_uint32),
                ("geometry_digest", c_uint64), ("config_digest", c_uint64),
                ("timeout_ms", c_int64), ("epoch", c_uint64),
                ("formation_timeout_ms", c_int64)]


class GroupInfo(Structure):
    """kvt_group_info."""
    _fields_ = [("rank", c_uint32), ("ranks", c_uint32), ("pp_rank", c_uint32),
                ("cp_rank", c_uint32), ("tp_rank", c_uint32), ("role", c_int),
                ("epoch", c_uint64), ("steps", c_uint64), ("aborted", c_int)]


class ConnEvent(Structure):
    """kvt_conn_event."""
    _fields_ = [("rid", c_uint64), ("kind", c_int), ("status", c_int), ("tokens", c_uint32),
                ("rank", c_uint32), ("counter", c_uint32), ("generation", c_uint64),
                ("step", c_uint64)]


# kvt_log_fn: (user, level, line); ctypes takes the GIL to run it.
LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_int, c_char_p)

_H = c_void_p  # every opaque handle
_PH = POINTER(c_void_p)
_st = c_int    # kvt_status

# name: (restype, argtypes)
_PROTOS = {
    "kvt_version": (c_uint, []),
    "kvt_version_string": (c_char_p, []),
    "kvt_strerror": (c_char_p, [c_int]),
    "kvt_status_name": (c_char_p, [c_int]),
    "kvt_last_error": (c_char_p, []),
    "kvt_set_log_handler": (_st, [LOG_FN, c_void_p]),
    "kvt_set_log_level": (_st, [ctypes.c_int]),
    "kvt_config_create": (_st, [_PH]),
    "kvt_config_destroy": (None, [_H]),
    "kvt_config_set": (_st, [_H, c_char_p, c_char_p]),
    "kvt_config_get": (_st, [_H, c_char_p, ctypes.c_char_p, c_size_t]),
    "kvt_config_load_json": (_st, [_H, c_char_p, c_size_t]),
    "kvt_config_load_file": (_st, [_H, c_char_p]),
    "kvt_config_load_env": (_st, [_H]),
    "kvt_config_option_count": (c_size_t, []),
    "kvt_config_option": (_st, [c_size_t, POINTER(OptionInfo)]),
    "kvt_config_digest": (_st, [_H, POINTER(c_uint64)]),
    "kvt_geometry_create": (_st, [_PH, c_uint32, c_uint32, c_int]),
    "kvt_geometry_preset": (_st, [_PH, c_char_p, c_uint32, c_uint32]),
    "kvt_geometry_destroy": (None, [_H]),
    "kvt_geometry_clone": (_st, [_H, _PH]),
    "kvt_geometry_set_layer": (_st, [_H, c_uint32, POINTER(LayerSpec)]),
    "kvt_geometry_set_layers": (_st, [_H, c_uint32, c_uint32, POINTER(LayerSpec)]),
    "kvt_geometry_validate": (_st, [_H]),
    "kvt_geometry_info_get": (_st, [_H, POINTER(GeometryInfo)]),
    "kvt_geometry_token_bytes": (_st, [_H, c_uint32, c_uint32, POINTER(c_uint64)]),
    "kvt_geometry_compare": (_st, [_H, _H]),
    "kvt_cache_create": (_st, [_PH, _H, _H]),
    "kvt_cache_destroy": (None, [_H]),
    "kvt_cache_register_memory": (_st, [_H, POINTER(EngineMemory)]),
    "kvt_cache_lookup": (_st, [_H, POINTER(Request), POINTER(Match)]),
    "kvt_cache_peek": (_st, [_H, POINTER(Request), POINTER(c_uint32)]),
    "kvt_cache_prepare_store": (_st, [_H, POINTER(Request), POINTER(StorePlan)]),
    "kvt_cache_launch": (_st, [_H, c_uint64, POINTER(c_uint32), c_uint32]),
    "kvt_cache_wait": (_st, [_H, c_uint64, c_int64, POINTER(TaskResult)]),
    "kvt_cache_try_wait": (_st, [_H, c_uint64, POINTER(TaskResult)]),
    "kvt_cache_wait_layer": (_st, [_H, c_uint64, c_uint32, c_int64]),
    "kvt_cache_layer_event": (_st, [_H, c_uint64, c_uint32, c_int64, POINTER(c_void_p)]),
    "kvt_cache_stream_wait_layer": (_st, [_H, c_uint64, c_uint32, c_void_p, c_int64]),
    "kvt_cache_cancel": (_st, [_H, c_uint64]),
    "kvt_cache_poll": (_st, [_H, POINTER(TaskResult), c_uint32, POINTER(c_uint32)]),
    "kvt_cache_stats_get": (_st, [_H, POINTER(CacheStats)]),
    "kvt_cache_flush": (_st, [_H, c_int64]),
    "kvt_client_attach": (_st, [_PH, c_char_p, _H, c_int64]),
    "kvt_client_detach": (None, [_H]),
    "kvt_client_register_memory": (_st, [_H, POINTER(EngineMemory)]),
    "kvt_client_lookup": (_st, [_H, POINTER(Request), POINTER(Match)]),
    "kvt_client_peek": (_st, [_H, POINTER(Request), POINTER(c_uint32)]),
    "kvt_client_peek_many": (_st, [_H, POINTER(Request), c_uint32, POINTER(c_uint32),
                                   POINTER(c_int)]),
    "kvt_client_prepare_store": (_st, [_H, POINTER(Request), POINTER(StorePlan)]),
    "kvt_client_launch": (_st, [_H, c_uint64, POINTER(c_uint32), c_uint32]),
    "kvt_client_wait": (_st, [_H, c_uint64, c_int64, POINTER(TaskResult)]),
    "kvt_client_wait_layer": (_st, [_H, c_uint64, c_uint32, c_int64]),
    "kvt_client_cancel": (_st, [_H, c_uint64]),
    "kvt_client_poll": (_st, [_H, POINTER(TaskResult), c_uint32, POINTER(c_uint32)]),
    "kvt_client_stats": (_st, [_H, POINTER(CacheStats)]),
    "kvt_client_flush": (_st, [_H, c_int64]),
    "kvt_server_tier_stats": (_st, [c_char_p, _H, c_int64, c_void_p, c_uint32,
                                    POINTER(c_uint32)]),
    "kvt_server_quotas": (_st, [c_char_p, c_int64, c_void_p, c_uint32, POINTER(c_uint32)]),
    "kvt_server_info_get": (_st, [c_char_p, c_int64, c_void_p]),
    "kvt_server_snapshot": (_st, [c_char_p, _H, c_int64, c_void_p, c_void_p, c_uint32,
                                  POINTER(c_uint32), c_void_p, c_uint32, POINTER(c_uint32)]),
    "kvt_client_clear": (_st, [_H, c_void_p, c_uint32, POINTER(c_uint32), POINTER(c_uint32)]),
    "kvt_emu_create": (_st, [_PH, _H, c_uint32]),
    "kvt_emu_destroy": (None, [_H]),
    "kvt_emu_set_first_head": (_st, [_H, c_uint32]),
    "kvt_emu_memory": (_st, [_H, POINTER(EngineMemory)]),
    "kvt_emu_fill": (_st, [_H, POINTER(Request), c_uint32, c_uint32, POINTER(c_uint32), c_uint32]),
    "kvt_emu_verify": (_st, [_H, POINTER(Request), c_uint32, c_uint32, POINTER(c_uint32),
                             c_uint32, POINTER(VerifyResult)]),
    "kvt_emu_poison": (_st, [_H, POINTER(c_uint32), c_uint32]),
    "kvt_fabric_create": (_st, [_PH, c_uint32, c_uint32]),
    "kvt_fabric_destroy": (None, [_H]),
    "kvt_net_inproc_create": (_st, [_PH, _H, c_uint32]),
    "kvt_net_tcp_create": (_st, [_PH, POINTER(NetTcpParams)]),
    "kvt_net_tcp_port": (_st, [_H, POINTER(c_uint16)]),
    "kvt_net_connect": (_st, [_H, c_int64]),
    "kvt_net_destroy": (None, [_H]),
    "kvt_net_interrupt": (_st, [_H]),
    "kvt_group_create": (_st, [_PH, _H, POINTER(GroupParams)]),
    "kvt_group_destroy": (None, [_H]),
    "kvt_group_abort": (_st, [_H, c_char_p]),
    "kvt_group_reform": (_st, [_H, c_int64]),
    "kvt_group_info_get": (_st, [_H, POINTER(GroupInfo)]),
    "kvt_group_diagnostic": (c_char_p, [_H]),
    "kvt_conn_create": (_st, [_PH, _H, _H]),
    "kvt_conn_destroy": (None, [_H]),
    "kvt_conn_lookup": (_st, [_H, c_uint64, POINTER(Request), POINTER(c_uint32)]),
    "kvt_conn_load": (_st, [_H, c_uint64, POINTER(c_uint32), c_uint32, c_int]),
    "kvt_conn_store": (_st, [_H, c_uint64, POINTER(Request), POINTER(c_uint32), c_uint32]),
    "kvt_conn_reset": (_st, [_H]),
    "kvt_conn_poll": (_st, [_H, POINTER(c_uint32)]),
    "kvt_conn_wait_layer": (_st, [_H, c_uint64, c_uint32, c_int64]),
    "kvt_conn_step": (_st, [_H, c_uint64]),
    "kvt_conn_events": (_st, [_H, POINTER(ConnEvent), c_uint32, POINTER(c_uint32)]),
    "kvt_conn_reform": (_st, [_H, c_int64]),
}


def _candidates():
    env = os.environ.get("KVTIER_LIB")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "..", "..", "build", "libkvtier.so"),
            "libkvtier.so.0", "libkvtier.so"], False


def library_path():
    """The path (or soname) the binding loads, without loading it."""
    paths, _ = _candidates()
    for p in paths:
        if os.sep in p and os.path.exists(p):
            return os.path.normpath(p)
    sonames = [p for p in paths if os.sep not in p]
    return sonames[0] if sonames else paths[0]


def sanitizer_of(path):
    """'address' or 'thread' when the library at path was built with that
    sanitizer (its runtime is a dependency), else None."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"libasan.so" in data:
        return "address"
    if b"libtsan.so" in data:
        return "thread"
    return None


def _load():
    paths, explicit = _candidates()
    errors = []
    for p in paths:
        if os.sep in p and not os.path.exists(p):
            errors.append("%s: no such file" % p)
            continue
        san = sanitizer_of(p) if os.sep in p else None
        if san and not os.environ.get("LD_PRELOAD"):
            raise ImportError(
                "kvtier: %s is a %s-sanitizer build; Python can load it only with the "
                "sanitizer runtime preloaded (LD_PRELOAD=$(gcc -print-file-name=lib%s.so)). "
                "Point KVTIER_LIB at a plain build instead." %
                (p, san, "asan" if san == "address" else "tsan"))
        try:
            return ctypes.CDLL(p), os.path.normpath(p) if os.sep in p else p
        except OSError as e:
            errors.append("%s: %s" % (p, e))
    hint = "" if explicit else " (set KVTIER_LIB=/path/to/libkvtier.so, or run `make build`)"
    raise ImportError("kvtier: cannot load libkvtier%s: %s" % (hint, "; ".join(errors)))


lib, LIB_PATH = _load()
for _name, (_res, _args) in _PROTOS.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError as _e:
        raise ImportError("kvtier: %s lacks %s (an older library?)" % (LIB_PATH, _name)) from _e
    _fn.restype = _res
    _fn.argtypes = _args


# The structs above mirror kvtier.h by hand: check each against the loaded
# library, so a layout change fails at import instead of corrupting memory.
lib.kvt_abi_struct_size.restype = c_size_t
lib.kvt_abi_struct_size.argtypes = [ctypes.c_char_p]
for _cname, _pyt in (("kvt_request", Request), ("kvt_key", Key),
                     ("kvt_engine_memory", EngineMemory), ("kvt_match", Match), ("kvt_store_plan", StorePlan),
                     ("kvt_task_result", TaskResult), ("kvt_verify_result", VerifyResult),
                     ("kvt_geometry_info", GeometryInfo), ("kvt_layer_spec", LayerSpec),
                     ("kvt_option_info", OptionInfo)):
    _want = lib.kvt_abi_struct_size(_cname.encode())
    if _want != ctypes.sizeof(_pyt):
        raise ImportError("kvtier: %s has sizeof(%s) = %d but this binding expects %d; "
                          "the binding and the library are from different versions"
                          % (LIB_PATH, _cname, _want, ctypes.sizeof(_pyt)))
_stats_size = lib.kvt_abi_struct_size(b"kvt_cache_stats")
if _stats_size > ctypes.sizeof(CacheStats):
    raise ImportError("kvtier: %s has a kvt_cache_stats of %d bytes, more than this binding "
                      "reserves" % (LIB_PATH, _stats_size))


class QuotaUsage(Structure):
    """kvt_quota_usage: one server_quotas rule and its use."""
    _fields_ = [("prefix", ctypes.c_char * 256), ("limit_bytes", c_uint64),
                ("used_bytes", c_uint64), ("limited_blocks", c_uint64),
                ("evicted_blocks", c_uint64)]


class TierStats(Structure):
    """kvt_tier_stats: one tier (geometry and block size) of a node server;
    its kvt_cache_stats exactly as the library lays it out (the names of
    the first len(STATS_FIELDS) words are STATS_FIELDS)."""
    _fields_ = [("geometry", ctypes.c_char * 24), ("num_layers", c_uint32),
                ("tokens_per_page", c_uint32), ("block_tokens", c_uint32),
                ("bytes_per_token", c_uint64),
                ("stats", c_uint64 * (lib.kvt_abi_struct_size(b"kvt_cache_stats") // 8))]


class ServerInfo(Structure):
    """kvt_server_info: a node server as a whole (kvtier stats' header)."""
    _fields_ = [("version", ctypes.c_char * 32), ("pid", c_uint32), ("clients", c_uint32),
                ("max_clients", c_uint32), ("geometries", c_uint32),
                ("max_geometries", c_uint32), ("metrics_port", c_uint32), ("quotas", c_uint32),
                ("uptime_ms", c_uint64), ("cpu_capacity_bytes", c_uint64)]


for _cname, _pyt in (("kvt_quota_usage", QuotaUsage), ("kvt_tier_stats", TierStats),
                     ("kvt_server_info", ServerInfo)):
    if lib.kvt_abi_struct_size(_cname.encode()) != ctypes.sizeof(_pyt):
        raise ImportError("kvtier: %s has sizeof(%s) = %d but this binding expects %d"
                          % (LIB_PATH, _cname, lib.kvt_abi_struct_size(_cname.encode()),
                             ctypes.sizeof(_pyt)))


def cstr(b):
    """Decodes a C string returned by the library ('' for NULL)."""
    return b.decode("utf-8", "replace") if b else ""

"""Argument conversion and validation shared by the wrappers: token ids and
page tables to contiguous uint32 numpy arrays, namespaces to bytes,
timeouts (seconds) to milliseconds, and numpy / torch buffers to addresses.
Everything is checked here, before any C call, so bad input raises
InvalidArgument instead of reaching the library."""
import ctypes
import math

import numpy as np

from . import _lib
from .errors import invalid

try:  # optional: torch tensors are accepted wherever arrays are
    import torch  # noqa: F401
except Exception:  # pragma: no cover - torch is not installed in the test image
    torch = None

_U32_MAX = 0xFFFFFFFF
_U32P = ctypes.POINTER(ctypes.c_uint32)


def is_torch(x):
    """True for a torch.Tensor (when torch is importable)."""
    return torch is not None and isinstance(x, torch.Tensor)


def u32_array(values, what, allow_empty=False):
    """values (list, tuple, range, numpy array or CPU torch tensor of
    integers) as a C-contiguous numpy uint32 array, every value checked to
    be in [0, 2**32)."""
    if is_torch(values):
        if values.device.type != "cpu":
            raise invalid("%s: a %s tensor; pass a CPU tensor (kvtier copies the ids)"
                          % (what, values.device.type))
        values = values.detach().numpy()
    if isinstance(values, (str, bytes, bytearray)) or values is None:
        raise invalid("%s: expected a sequence of integers, got %s" % (what, type(values).__name__))
    try:
        arr = np.asarray(values)
    except Exception as e:
        raise invalid("%s: not an integer sequence (%s)" % (what, e)) from None
    if arr.ndim == 0:
        raise invalid("%s: expected a sequence of integers, got a scalar" % what)
    if arr.ndim != 1:
        raise invalid("%s: expected a 1-D sequence, got shape %s" % (what, arr.shape))
    if arr.size == 0:
        if not allow_empty:
            raise invalid("%s is empty" % what)
        return np.zeros(0, dtype=np.uint32)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise invalid("%s: expected integers, got dtype %s" % (what, arr.dtype))
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _U32_MAX:
        bad = lo if lo < 0 else hi
        i = int(np.nonzero(arr == bad)[0][0])
        raise invalid("%s[%d] is %d, outside [0, 2**32)" % (what, i, bad))
    if len(arr) > _U32_MAX:
        raise invalid("%s: %d entries, at most 2**32 - 1" % (what, len(arr)))
    return np.ascontiguousarray(arr, dtype=np.uint32)


def u32_ptr(arr):
    """A ctypes uint32 pointer into a uint32 array (NULL when empty)."""
    if arr is None or arr.size == 0:
        return None
    return arr.ctypes.data_as(_U32P)


def ns_bytes(ns):
    """A namespace (bytes, bytearray, memoryview, str or None) as bytes."""
    if ns is None:
        return b""
    if isinstance(ns, str):
        return ns.encode("utf-8")
    if isinstance(ns, (bytes, bytearray, memoryview)):
        b = bytes(ns)
        if len(b) > _U32_MAX:
            raise invalid("ns: %d bytes is too long" % len(b))
        return b
    raise invalid("ns: expected bytes or str, got %s" % type(ns).__name__)


def timeout_ms(timeout, what="timeout"):
    """A timeout in seconds (int or float, >= 0; every wait has a deadline)
    as whole milliseconds for the C API."""
    if timeout is None:
        raise invalid("%s is None: every wait needs a deadline (seconds, >= 0)" % what)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise invalid("%s: expected seconds as a number, got %s" % (what, type(timeout).__name__))
    if math.isnan(timeout) or timeout < 0:
        raise invalid("%s is %r: it must be a number of seconds >= 0" % (what, timeout))
    if timeout > 86400 * 365:
        raise invalid("%s is %r s: too long" % (what, timeout))
    return int(math.ceil(timeout * 1000.0))


def uint(value, what, bits=32, minimum=0):
    """An integer argument checked to fit the C type (unsigned, `bits` wide)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise invalid("%s: expected an integer, got %s" % (what, type(value).__name__))
    v = int(value)
    if v < minimum or v >= (1 << bits):
        raise invalid("%s is %d, outside [%d, 2**%d)" % (what, v, minimum, bits))
    return v


def key_bytes(keys):
    """Keyed-request keys (a sequence of bytes or str; str is encoded UTF-8)
    as a list of bytes, each 1..256 bytes."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise invalid("keys: expected a sequence of keys, got one %s" % type(keys).__name__)
    try:
        items = list(keys)
    except TypeError:
        raise invalid("keys: expected a sequence of bytes or str, got %s"
                      % type(keys).__name__) from None
    if len(items) > _lib.MAX_KEYS:
        raise invalid("keys: %d keys (at most %d)" % (len(items), _lib.MAX_KEYS))
    out = []
    for i, k in enumerate(items):
        if isinstance(k, str):
            k = k.encode("utf-8")
        elif isinstance(k, (bytes, bytearray, memoryview)):
            k = bytes(k)
        else:
            raise invalid("keys[%d]: expected bytes or str, got %s" % (i, type(k).__name__))
        if not 1 <= len(k) <= _lib.MAX_KEY_LEN:
            raise invalid("keys[%d]: %d bytes (1..%d)" % (i, len(k), _lib.MAX_KEY_LEN))
        out.append(k)
    return out


class CRequest:
    """A kvt_request built from tokens (or keys) and a namespace; keeps the
    arrays it points at alive as long as the object lives."""

    def __init__(self, tokens=None, ns=None, what="tokens", keys=None, independent=False,
                 visible=False):
        if (tokens is None) == (keys is None):
            raise invalid("a request names its blocks by tokens or by keys: give exactly one")
        if independent and keys is None:
            raise invalid("independent=True applies to keyed requests (keys=), not tokens")
        self.ns = ns_bytes(ns)
        self._ns_buf = ctypes.create_string_buffer(self.ns, max(1, len(self.ns)))
        ns_ptr = ctypes.cast(self._ns_buf, ctypes.c_void_p) if self.ns else None
        if keys is None:
            self.tokens = u32_array(tokens, what)
            self.keys = None
            self.c = _lib.Request(u32_ptr(self.tokens), len(self.tokens), ns_ptr, len(self.ns),
                                  None, 0, _lib.REQ_VISIBLE_AT_END if visible else 0)
            return
        self.tokens = None
        self.keys = key_bytes(keys)
        blob = b"".join(self.keys)
        self._key_buf = ctypes.create_string_buffer(blob, max(1, len(blob)))
        self._key_arr = (_lib.Key * max(1, len(self.keys)))()
        base, off = ctypes.addressof(self._key_buf), 0
        for i, k in enumerate(self.keys):
            self._key_arr[i].data = base + off
            self._key_arr[i].len = len(k)
            off += len(k)
        self.c = _lib.Request(None, 0, ns_ptr, len(self.ns),
                              ctypes.cast(self._key_arr, ctypes.POINTER(_lib.Key)),
                              len(self.keys),
                              (_lib.REQ_INDEPENDENT_KEYS if independent else 0) |
                              (_lib.REQ_VISIBLE_AT_END if visible else 0))

    def ref(self):
        """ctypes.byref of the struct."""
        return ctypes.byref(self.c)


def as_request(tokens, ns=None, keys=None, independent=False, visible=False):
    """A CRequest, or tokens itself when it already is one."""
    if isinstance(tokens, CRequest):
        return tokens
    return CRequest(tokens, ns, keys=keys, independent=independent, visible=visible)


def cuda_device(buf):
    """The CUDA device ordinal of a CUDA tensor, else None. Duck-typed (no
    torch import needed): an object with data_ptr() and a device whose type
    is "cuda" (torch.Tensor on a GPU, or anything shaped like one)."""
    dev = getattr(buf, "device", None)
    if dev is None or not callable(getattr(buf, "data_ptr", None)):
        return None
    if getattr(dev, "type", None) != "cuda":
        return None
    index = getattr(dev, "index", None)
    return -1 if index is None else int(index)


def cuda_buffer_address(buf, what, need_bytes, contiguous=True):
    """(address, device, keep-alive object) of a contiguous CUDA tensor of at
    least need_bytes; contiguous=False: a strided view already checked by
    strided_view (its extent is need_bytes)."""
    device = cuda_device(buf)
    if device is None:
        raise invalid("%s: not a CUDA tensor" % what)
    if device < 0:
        raise invalid("%s: the CUDA tensor's device has no index" % what)
    is_contig = getattr(buf, "is_contiguous", None)
    if contiguous and callable(is_contig) and not is_contig():
        raise invalid("%s: the tensor is not contiguous" % what)
    if not contiguous:
        nbytes = need_bytes
    elif callable(getattr(buf, "numel", None)) and callable(getattr(buf, "element_size", None)):
        nbytes = int(buf.numel()) * int(buf.element_size())
    else:
        nbytes = int(getattr(buf, "nbytes", 0))
    addr = int(buf.data_ptr())
    if nbytes < need_bytes:
        raise invalid("%s holds %d bytes; the geometry needs %d" % (what, nbytes, need_bytes))
    if addr == 0:
        raise invalid("%s: null data pointer" % what)
    return addr, device, buf


def buffer_address(buf, what, need_bytes, contiguous=True):
    """(address, keep-alive object) of a writable, contiguous host buffer of
    at least need_bytes: a numpy array or a CPU torch tensor.
    contiguous=False: a strided view already checked by strided_view (its
    extent is need_bytes); the address is its first element's."""
    if is_torch(buf):
        if buf.device.type != "cpu":
            raise invalid("%s: a %s tensor; kvtier copies with the CPU, so engine memory "
                          "must be host memory (a CPU tensor, pinned or not)" % (what, buf.device.type))
        if contiguous and not buf.is_contiguous():
            raise invalid("%s: the tensor is not contiguous" % what)
        nbytes = buf.numel() * buf.element_size() if contiguous else need_bytes
        addr = buf.data_ptr()
    elif isinstance(buf, np.ndarray):
        if contiguous and not buf.flags.c_contiguous:
            raise invalid("%s: the array is not C-contiguous" % what)
        if not buf.flags.writeable:
            raise invalid("%s: the array is read-only (loads write into it)" % what)
        nbytes = buf.nbytes if contiguous else need_bytes
        addr = buf.ctypes.data
    else:
        raise invalid("%s: expected a numpy array or a torch tensor, got %s"
                      % (what, type(buf).__name__))
    if nbytes < need_bytes:
        raise invalid("%s holds %d bytes; the geometry needs %d" % (what, nbytes, need_bytes))
    if addr == 0:
        raise invalid("%s: null data pointer" % what)
    return addr, buf


def _shape_strides(buf, what):
    """(shape, byte strides, element size) of a numpy array or a tensor
    (torch, CPU or CUDA; duck-typed by stride() and element_size())."""
    if isinstance(buf, np.ndarray):
        return tuple(buf.shape), tuple(buf.strides), buf.dtype.itemsize
    if (callable(getattr(buf, "stride", None)) and callable(getattr(buf, "element_size", None))
            and hasattr(buf, "shape")):
        e = int(buf.element_size())
        return tuple(int(n) for n in buf.shape), tuple(int(s) * e for s in buf.stride()), e
    raise invalid("%s: a %s that is not contiguous and shows no strides (shape, stride(), "
                  "element_size()) to register it by" % (what, type(buf).__name__))


def _token_rows_contiguous(shape, strides, esize):
    """True when the trailing dims (one token's bytes) are C-contiguous."""
    want = esize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def is_contiguous(buf):
    """True for a C-contiguous array or tensor (the plain registration)."""
    if isinstance(buf, np.ndarray):
        return bool(buf.flags.c_contiguous)
    f = getattr(buf, "is_contiguous", None)
    return bool(f()) if callable(f) else True


def strided_view(buf, what, num_pages, tokens_per_page, token_bytes):
    """(page_stride, token_stride, extent in bytes) of a non-contiguous view
    of one (layer, component): shape (pages, tokens_per_page, ...) or
    (tokens, ...) with at least num_pages pages, any strides on those
    leading dims, and each token's token_bytes contiguous in the trailing
    dims (as SGLang's page_first pool sliced per layer is)."""
    shape, strides, esize = _shape_strides(buf, what)
    if any(s < 0 for s in strides):
        raise invalid("%s: negative strides %s are not supported" % (what, strides))

    def row_bytes(dims):
        return int(np.prod(dims, dtype=np.int64)) * esize if dims else esize

    if (len(shape) >= 2 and shape[1] == tokens_per_page and shape[0] >= num_pages
            and row_bytes(shape[2:]) == token_bytes):
        rest, ps, ts = 2, strides[0], strides[1]
    elif shape and shape[0] >= num_pages * tokens_per_page and row_bytes(shape[1:]) == token_bytes:
        rest, ts = 1, strides[0]
        ps = ts * tokens_per_page
    else:
        raise invalid("%s: a view of shape %s cannot hold %d pages of %d tokens of %d bytes: "
                      "give (pages, %d, ...) or (tokens, ...) with each token's %d bytes in the "
                      "trailing dims" % (what, shape, num_pages, tokens_per_page, token_bytes,
                                         tokens_per_page, token_bytes))
    if not _token_rows_contiguous(shape[rest:], strides[rest:], esize):
        raise invalid("%s: the trailing dims %s (one token) are not contiguous (strides %s); "
                      "kvtier copies each token's bytes as one run"
                      % (what, shape[rest:], strides[rest:]))
    extent = (num_pages - 1) * ps + (tokens_per_page - 1) * ts + token_bytes
    return ps, ts, extent

"""The emulated engine (kvt_emu_*): paged KV buffers in host memory whose
every byte is a pure function of (namespace, prefix, layer, component,
head), so a load can be verified byte for byte. Its buffers are exposed as
numpy views (``engine.buffer(layer, component)``)."""
import ctypes
from collections import namedtuple

import numpy as np

from . import _lib
from ._arrays import as_request, u32_array, u32_ptr, uint
from ._handle import Handle
from .config import LAYER_FIRST, Geometry
from .errors import check, invalid

lib = _lib.lib

VerifyResult = namedtuple("VerifyResult", "bytes_checked mismatches first_bad_token first_bad_layer")
VerifyResult.__doc__ = "What EmulatedEngine.verify found (mismatches == 0: every byte right)."


class EmulatedEngine(Handle):
    """num_pages pages of KV for a geometry, owned by the C library.

    ``first_head`` makes this rank hold global heads [first_head, ...) as a
    tensor-parallel rank does."""

    _destroy = lib.kvt_emu_destroy

    def __init__(self, geometry, num_pages, first_head=0):
        super().__init__()
        if not isinstance(geometry, Geometry):
            raise invalid("EmulatedEngine: geometry must be a kvtier.Geometry")
        check(self._create(lib.kvt_emu_create, geometry, uint(num_pages, "num_pages", minimum=1)))
        self.geometry = geometry.clone()
        self.num_pages = int(num_pages)
        if first_head:
            check(self._call(lib.kvt_emu_set_first_head, uint(first_head, "first_head")))

    def close(self):
        """Frees the buffers: numpy views of them must not be used afterwards."""
        super().close()

    def _after_close(self):
        if getattr(self, "geometry", None) is not None:
            self.geometry.close()

    def memory(self):
        """The kvt_engine_memory of the buffers (for Cache.register_engine)."""
        m = _lib.EngineMemory()
        check(self._call(lib.kvt_emu_memory, ctypes.byref(m)))
        return m

    def buffer(self, layer, component=0):
        """A numpy uint8 view (num_pages, tokens_per_page * token_bytes) of one
        layer's component buffer (layer-first), or of the whole page buffer
        (page-first, layer/component ignored). Valid until close()."""
        gi = self.geometry.info()
        m = self.memory()
        if gi["layout"] == LAYER_FIRST:
            layer = uint(layer, "layer")
            if layer >= gi["num_layers"]:
                raise invalid("buffer: layer %d of %d" % (layer, gi["num_layers"]))
            if component not in (0, 1) or component >= self.geometry.num_components(layer):
                raise invalid("buffer: layer %d has no component %r" % (layer, component))
            addr = m.layer_bases[layer * 2 + component]
            row = gi["tokens_per_page"] * self.geometry.token_bytes(layer, component)
        else:
            addr = m.base
            row = gi["bytes_per_page"]
        raw = (ctypes.c_uint8 * (row * self.num_pages)).from_address(addr)
        arr = np.frombuffer(raw, dtype=np.uint8).reshape(self.num_pages, row)
        return arr

    def buffers(self):
        """[[K, V], ...] numpy views of every layer (layer-first)."""
        nl = self.geometry.info()["num_layers"]
        return [[self.buffer(l, c) for c in range(self.geometry.num_components(l))]
                for l in range(nl)]

    def _range(self, fn, tokens, ns, first, count, pages):
        req = as_request(tokens, ns)
        pg = u32_array(pages, "pages")
        bad = np.nonzero(pg >= self.num_pages)[0]
        if len(bad):
            raise invalid("%s: pages[%d] is %d but the engine has %d pages"
                          % (fn, bad[0], pg[bad[0]], self.num_pages))
        return req, pg, uint(first, "first"), uint(count, "count")

    def fill(self, tokens, pages, first=0, count=None, ns=None):
        """Computes tokens [first, first + count) of the request (default: all)
        into its pages (pages[i] holds tokens [i * tokens_per_page, ...))."""
        if count is None:
            count = len(tokens) - first
        req, pg, first, count = self._range("fill", tokens, ns, first, count, pages)
        check(self._call(lib.kvt_emu_fill, req.ref(), first, count, u32_ptr(pg), len(pg)))

    def verify(self, tokens, pages, first=0, count=None, ns=None):
        """Checks tokens [first, first + count) in the pages against what fill
        writes; returns VerifyResult."""
        if count is None:
            count = len(tokens) - first
        req, pg, first, count = self._range("verify", tokens, ns, first, count, pages)
        v = _lib.VerifyResult()
        check(self._call(lib.kvt_emu_verify, req.ref(), first, count, u32_ptr(pg), len(pg),
                         ctypes.byref(v)))
        return VerifyResult(v.bytes_checked, v.mismatches, v.first_bad_token, v.first_bad_layer)

    def poison(self, pages):
        """Overwrites pages with a poison pattern (a missed load shows up)."""
        pg = u32_array(pages, "pages")
        bad = np.nonzero(pg >= self.num_pages)[0]
        if len(bad):
            raise invalid("poison: pages[%d] is %d but the engine has %d pages"
                          % (bad[0], pg[bad[0]], self.num_pages))
        check(self._call(lib.kvt_emu_poison, u32_ptr(pg), len(pg)))

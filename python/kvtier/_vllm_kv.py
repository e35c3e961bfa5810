"""How a vLLM worker's KV cache tensors lie in memory, for the KV connector.

vLLM's model runner allocates each layer's KV cache as one flat buffer,
views it in the attention backend's *physical* order
(get_kv_cache_shape permuted by get_kv_cache_stride_order) and hands the
connector the *logical* view, permuted back
(vllm/v1/worker/gpu_model_runner.py, _reshape_kv_cache_tensors). So a
tensor's shape names the backend's logical dims and its strides say where
the bytes are. The logical shapes (num_blocks may be any number):

  FlashAttention (and alike)             (2, num_blocks, block_size, heads, head_size)
      VLLM_KV_CACHE_LAYOUT=HND: stride order (0, 1, 3, 2, 4), head-major bytes
  CPU_ATTN (vLLM's CPU backend)          (2, num_blocks, heads, block_size, head_size)
  FlashInfer, Triton                     (num_blocks, 2, block_size, heads, head_size)
  MLA backends                           (num_blocks, block_size, head_size)
  TORCH_SDPA (older CPU backend)         (2, num_blocks, block_size * heads * head_size)

Host tensors (numpy arrays, CPU torch tensors) and CUDA tensors (torch on
a GPU, recognised by duck typing: data_ptr(), device.type == "cuda",
device.index, shape, stride(), element_size(), dtype) are read alike: for
a CUDA tensor the uint8 view below is only an address calculator over the
device pointer (numpy never reads it; DeviceView hands each component to
kvtier's registration, which registers it as KVT_MEMORY_CUDA).

kvtier takes one buffer per layer and component whose page p is block p,
dense or strided between blocks (kvt_engine_memory page_strides), and
treats a block's bytes as opaque; the connector names their order in the
namespace (NHD or HND). Supported, all without a copy: the K/V-first 5-D
layouts in either order, FlashInfer's and Triton's blocks-first layout (K
and V of a block side by side: each component is a strided view), and MLA.
Refused with a message: TORCH_SDPA (its K blocks are split by 16-byte
vectors, an order no namespace names), padded or otherwise non-dense
strides, kernel block sizes other than vLLM's block size, and any other
shape."""
import ctypes

import types

import numpy as np

from ._arrays import cuda_device

KNOWN_SHAPES = ("(2, num_blocks, block_size, num_kv_heads, head_size) (FlashAttention, any "
                "stride order), (2, num_blocks, num_kv_heads, block_size, head_size) "
                "(CPU_ATTN), (num_blocks, 2, block_size, num_kv_heads, head_size) "
                "(FlashInfer, Triton), or MLA (num_blocks, block_size, head_size)")


def dtype_info(d):
    """(name, element size) of a numpy or torch dtype."""
    if type(d).__module__.startswith("torch"):
        size = getattr(d, "itemsize", None)
        if size is None:  # torch before 2.1
            import torch  # type: ignore
            size = torch.empty((), dtype=d).element_size()
        return str(d).replace("torch.", ""), int(size)
    d = np.dtype(d)
    return d.name, d.itemsize


class HostKV:
    """One layer's tensor: its logical shape, its dims in memory order and
    a uint8 view of its memory in that order (last dim in bytes). No copy:
    the view aliases the tensor. device: None for host memory, else the
    CUDA device ordinal (the view then must never be read: device memory)."""

    def __init__(self, t, what):
        self.what = what
        self.device = cuda_device(t)
        if self.device is not None:
            if self.device < 0:
                raise ValueError("kvtier: %s is a CUDA tensor whose device has no index"
                                 % what)
            self.dtype, self.elem = str(t.dtype).replace("torch.", ""), int(t.element_size())
            shape = tuple(int(n) for n in t.shape)
            if not callable(getattr(t, "stride", None)):
                raise ValueError("kvtier: %s: a CUDA tensor without stride()" % what)
            strides = tuple(int(x) * self.elem for x in t.stride())
            ptr = int(t.data_ptr())
            if ptr == 0:
                raise ValueError("kvtier: %s: null data pointer" % what)
            self.owner = t
        elif isinstance(t, np.ndarray):
            self.dtype, self.elem = dtype_info(t.dtype)
            shape, strides = tuple(t.shape), tuple(t.strides)
            ptr = t.ctypes.data
            self.owner = t
        elif type(t).__module__.startswith("torch"):
            if t.device.type != "cpu":
                raise ValueError("kvtier: %s is a %s tensor; kvtier's connector moves host "
                                 "(CPU) and CUDA tensors only" % (what, t.device.type))
            self.dtype, self.elem = str(t.dtype).replace("torch.", ""), int(t.element_size())
            shape = tuple(t.shape)
            stride = t.stride() if callable(getattr(t, "stride", None)) else None
            if stride is None:  # duck-typed stand-ins without stride(): contiguous only
                if not t.is_contiguous():
                    raise ValueError("kvtier: %s is not contiguous" % what)
                stride = _dense_strides(shape, 1)
            strides = tuple(int(s) * self.elem for s in stride)
            ptr = t.data_ptr()
            self.owner = t
        else:
            raise ValueError("kvtier: %s: expected a numpy array or torch tensor, got %s"
                             % (what, type(t).__name__))
        self.shape = shape
        self.order = _memory_order(shape, strides, self.elem, what)
        phys = tuple(shape[i] for i in self.order)
        nbytes = int(np.prod(phys)) * self.elem
        if isinstance(t, np.ndarray):
            base = np.transpose(t, self.order)
            if not base.flags.c_contiguous:  # _memory_order said dense; belt and braces
                raise ValueError("kvtier: %s: strides %s are not dense" % (what, strides))
            if not base.flags.writeable:
                raise ValueError("kvtier: %s is read-only (loads write into it)" % what)
            raw = base.view(np.uint8)
        else:  # a torch tensor's memory (device memory: addresses only, never read)
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
        self.mem = raw.reshape(phys[:-1] + (phys[-1] * self.elem,))
        self.phys = phys

    def component(self, arr):
        """What kvtier registers for one component view from parse_layer:
        the view itself (host), or a DeviceView of it (CUDA)."""
        return arr if self.device is None else DeviceView(arr, self.device, self.owner)

    def permuted(self):
        """True when the memory order is not the logical one."""
        return self.order != tuple(range(len(self.shape)))


class DeviceView:
    """A component of a CUDA tensor as kvtier's registration reads one
    (cache.register_memory, duck-typed like a torch CUDA tensor): shape,
    stride() and element_size() of bytes, data_ptr() of its first byte, the
    device; owner (the engine's tensor) is kept alive with it. arr is the
    numpy address view parse_layer cut (never read)."""

    def __init__(self, arr, device, owner):
        self.shape = tuple(arr.shape)
        self._strides = tuple(arr.strides)
        self._ptr = int(arr.ctypes.data)
        self._contiguous = bool(arr.flags.c_contiguous)
        self._numel = int(arr.size)
        self.device = types.SimpleNamespace(type="cuda", index=device)
        self.owner = owner

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def element_size(self):
        return 1

    def numel(self):
        return self._numel

    def is_contiguous(self):
        return self._contiguous


def _dense_strides(shape, elem):
    out, s = [], elem
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def _memory_order(shape, strides, elem, what):
    """The logical dims from the outermost in memory to the innermost, for
    a tensor that covers its memory densely with positive strides (any
    permutation of a contiguous tensor: what vLLM's stride orders make).
    Dims of size 1 keep their logical place (their stride means nothing)."""
    n = len(shape)
    if any(s < 0 for s in strides):
        raise ValueError("kvtier: %s has negative strides %s" % (what, strides))
    big = sorted((i for i in range(n) if shape[i] > 1), key=lambda i: (-strides[i], i))
    order, it = [], iter(big)
    for i in range(n):  # size-1 dims where they are, the others in stride order
        order.append(i if shape[i] == 1 else next(it))
    want = elem
    for i in reversed(order):
        if shape[i] > 1 and strides[i] != want:
            raise ValueError(
                "kvtier: %s has shape %s and byte strides %s: not a dense tensor in any dim "
                "order (padded blocks, or a view of a larger tensor); kvtier's engine memory "
                "takes dense per-layer buffers" % (what, shape, strides))
        want *= shape[i]
    return tuple(order)


class Parsed:
    """What register_kv_caches needs from one layer: its components (each
    a uint8 array whose row p is block p), num_blocks, heads, head size
    (elements), block layout ("NHD" or "HND"), MLA or not."""

    def __init__(self, comps, num_blocks, heads, dim, layout, mla):
        self.comps, self.num_blocks, self.heads, self.dim = comps, num_blocks, heads, dim
        self.layout, self.mla = layout, mla


def parse_layer(kv, block_size, expect_layout, want_heads=None, want_mla=None,
                num_blocks=None, backend=None):
    """Parsed for one layer's HostKV kv. expect_layout breaks the one tie
    the bytes cannot: a contiguous (2, n, B, B, d) tensor (as many heads as
    tokens per block). want_heads, want_mla, num_blocks: what
    kv_cache_config's spec says (None: unknown). backend: the attention
    backend's name when vLLM names it."""
    shape, what = kv.shape, kv.what
    if len(shape) == 3:
        return _parse_3d(kv, block_size, want_mla, num_blocks)
    if len(shape) != 5:
        raise ValueError("kvtier: %s has shape %s; kvtier knows vLLM's %s"
                         % (what, shape, KNOWN_SHAPES))
    kv_first = shape[0] == 2 and (num_blocks is None or shape[1] == num_blocks)
    blocks_first = shape[1] == 2 and (num_blocks is None or shape[0] == num_blocks)
    if kv_first and blocks_first:  # two blocks, two components: which is which?
        kv_first = backend not in ("FLASHINFER", "TRITON_ATTN")
        blocks_first = not kv_first
    if not (kv_first or blocks_first):
        raise ValueError("kvtier: %s has shape %s; kvtier knows vLLM's %s"
                         % (what, shape, KNOWN_SHAPES))
    if kv.order[:2] != (0, 1) or kv.order[4] != 4:
        raise ValueError("kvtier: %s has shape %s in memory order %s; kvtier needs %s "
                         "outermost and head_size innermost" % (
                             what, shape, kv.order,
                             "K/V, then blocks" if kv_first else "blocks, then K/V"))
    x, y = kv.phys[2], kv.phys[3]
    nhd = x == block_size and want_heads in (None, y)
    hnd = y == block_size and want_heads in (None, x)
    if nhd and hnd:
        if kv.permuted():  # logical dim 2 is tokens (FlashAttention's shape)
            nhd = kv.order[2] == 2
        else:
            nhd = expect_layout == "NHD"
        hnd = not nhd
    if not (nhd or hnd):
        raise ValueError(
            "kvtier: %s has shape %s (in memory %s), not K/V blocks of %d tokens and %s heads "
            "in either order (cache_config.block_size is %d%s)%s" % (
                what, shape, kv.phys, block_size,
                "any" if want_heads is None else want_heads, block_size,
                "" if want_heads is None else ", kv_cache_spec.num_kv_heads %d" % want_heads,
                "" if block_size in (x, y) else
                "; a kernel block size other than vLLM's block size is not supported"))
    heads = y if nhd else x
    layout = "NHD" if nhd else "HND"
    if kv_first:
        return Parsed([kv.mem[0], kv.mem[1]], kv.phys[1], heads, kv.phys[4], layout, False)
    # FlashInfer / Triton: component c of block b is mem[b, c], so each
    # component is a view strided by two blocks' bytes; its block is opaque
    # (either order), handed over as block_size rows of one token's bytes.
    comps = [_blocks_of(kv.mem[:, c], block_size, what) for c in range(2)]
    return Parsed(comps, kv.phys[0], heads, kv.phys[4], layout, False)


def _blocks_of(view, block_size, what):
    """view (num_blocks, x, y, row bytes), each block dense, as (num_blocks,
    block_size, x * y * row / block_size) with no copy."""
    out = view.view()
    try:
        out.shape = (view.shape[0], block_size, -1)  # raises rather than copy
    except AttributeError:
        raise ValueError("kvtier: %s: a block of a component is not dense in memory"
                         % what) from None
    return out


def _parse_3d(kv, block_size, want_mla, num_blocks):
    shape, what = kv.shape, kv.what
    mla_fits = shape[1] == block_size and (num_blocks is None or shape[0] == num_blocks)
    sdpa_fits = (shape[0] == 2 and shape[2] % block_size == 0 and
                 (num_blocks is None or shape[1] == num_blocks))
    if want_mla is not None:  # the spec says which
        mla_fits, sdpa_fits = mla_fits and want_mla, sdpa_fits and not want_mla
    if sdpa_fits and not mla_fits:
        raise ValueError(
            "kvtier: %s has shape %s: TORCH_SDPA's (2, num_blocks, block_size * num_kv_heads * "
            "head_size), whose K blocks are split in 16-byte vectors (paged attention's "
            "layout), an order kvtier does not name; use the CPU_ATTN backend (recent vLLM)"
            % (what, shape))
    if mla_fits and sdpa_fits:
        raise ValueError("kvtier: %s has shape %s: MLA's (num_blocks, block_size, head_size) "
                         "or TORCH_SDPA's (2, num_blocks, ...)? kv_cache_config (its "
                         "num_blocks and spec) tells them apart; vLLM passes it to every "
                         "connector" % (what, shape))
    if not mla_fits:
        raise ValueError("kvtier: %s has shape %s, not MLA's (num_blocks, block_size, "
                         "head_size) with block_size %d (cache_config.block_size)%s"
                         % (what, shape, block_size,
                            "" if want_mla is not False else
                            "; kv_cache_config's spec is not MLA, so a 5-D K/V tensor was "
                            "expected: " + KNOWN_SHAPES))
    if kv.permuted():
        raise ValueError("kvtier: %s: an MLA tensor in memory order %s; kvtier needs "
                         "(num_blocks, block_size, head_size) contiguous" % (what, kv.order))
    return Parsed([kv.mem], shape[0], 1, shape[2], "NHD", True)

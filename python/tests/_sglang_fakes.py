"""SGLang-shaped test doubles for the HiCache backend: host pools with the
kv_buffer shapes of SGLang's MHATokenToKVPoolHost / MLATokenToKVPoolHost
(python/sglang/srt/mem_cache/pool_host/mha.py and mla.py, init_kv_buffer),
the storage config as SGLang's cache controller fills it, and construction
the way SGLang's StorageBackendFactory._create_dynamic_backend does it
(storage/backend_factory.py, sgl-project/sglang commit
001067fffe33427bee0ed2f007fb7551a1d76b44)."""
import importlib

import numpy as np

MODULE, CLASS = "kvtier.sglang_hicache", "KvtierHiCacheStorage"


class FakeHostPool:
    """numpy kv_buffer in SGLang's real shapes, random bytes.

    MHA: layer_first (2, L, size, H, D); page_first (2, size, L, H, D);
         page_first_direct (2, pages, L, page_size, H, D).
    MLA: layer_first (L, size, 1, D); page_first (size, L, 1, D);
         page_first_direct (pages, L, page_size, 1, D)."""

    def __init__(self, layout, mla=False, layers=3, pages=24, page_size=4, heads=2,
                 head_dim=8, dtype=np.float16, seed=0):
        self.layout, self.page_size, self.layer_num = layout, page_size, layers
        self.page_num, self.size, self.dtype = pages, pages * page_size, dtype
        self.mla = mla
        if mla:
            self.kv_lora_rank, self.qk_rope_head_dim = head_dim - 2, 2
            self.head_num, self.head_dim = 1, head_dim
            dims = {"layer_first": (layers, self.size, 1, head_dim),
                    "page_first": (self.size, layers, 1, head_dim),
                    "page_first_direct": (pages, layers, page_size, 1, head_dim)}[layout]
        else:
            self.head_num, self.head_dim = heads, head_dim
            dims = {"layer_first": (2, layers, self.size, heads, head_dim),
                    "page_first": (2, self.size, layers, heads, head_dim),
                    "page_first_direct": (2, pages, layers, page_size, heads, head_dim)}[layout]
        rng = np.random.default_rng(seed)
        raw = rng.integers(0, 256, int(np.prod(dims)) * np.dtype(dtype).itemsize, dtype=np.uint8)
        self.kv_buffer = raw.view(dtype).reshape(dims)

    def host_indices(self, pages):
        """Token slots of whole pages, as SGLang passes them (int64)."""
        ps = self.page_size
        return (np.asarray(pages, np.int64)[:, None] * ps + np.arange(ps)).ravel()

    def page_bytes(self, page):
        """Every byte of one page as {(component, layer): uint8 array},
        read straight from kv_buffer by the layout's definition."""
        kv, ps, out = self.kv_buffer, self.page_size, {}
        t = slice(page * ps, (page + 1) * ps)
        for layer in range(self.layer_num):
            for c in range(1 if self.mla else 2):
                if self.mla:
                    a = {"layer_first": lambda: kv[layer, t],
                         "page_first": lambda: kv[t, layer],
                         "page_first_direct": lambda: kv[page, layer]}[self.layout]()
                else:
                    a = {"layer_first": lambda: kv[c, layer, t],
                         "page_first": lambda: kv[c, t, layer],
                         "page_first_direct": lambda: kv[c, page, layer]}[self.layout]()
                out[(c, layer)] = np.ascontiguousarray(a).view(np.uint8).copy()
        return out

    def set_page_bytes(self, page, value):
        """Overwrites every byte of a page with value (a sentinel)."""
        kv, ps = self.kv_buffer.view(np.uint8), self.page_size
        e = np.dtype(self.dtype).itemsize
        del e
        t = slice(page * ps, (page + 1) * ps)
        if self.layout == "page_first_direct":
            (kv[page] if self.mla else kv[:, page])[...] = value
        elif self.layout == "page_first":
            (kv[t] if self.mla else kv[:, t])[...] = value
        else:
            (kv[:, t] if self.mla else kv[:, :, t])[...] = value


def storage_config(mla=False, tp_rank=0, tp_size=1, model="org/model-7b", extra=None,
                   layout="layer_first", metrics=False):
    from kvtier.sglang_hicache import HiCacheStorageConfig
    cfg = {"backend_name": "kvtier", "module_path": MODULE, "class_name": CLASS,
           "interface_v1": 1}
    cfg.update(extra or {})
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=layout == "page_first", model_name=model, extra_config=cfg)


def create_backend(config, pool):
    """What StorageBackendFactory does for "dynamic", then the controller's
    register_mem_pool_host."""
    from kvtier.sglang_hicache import HiCacheStorage
    backend_config = config.extra_config
    module = importlib.import_module(backend_config["module_path"])
    cls = getattr(module, backend_config["class_name"])
    if not issubclass(cls, HiCacheStorage):
        raise TypeError("Backend class %s must inherit from HiCacheStorage" % CLASS)
    backend = cls(config, {})
    backend.register_mem_pool_host(pool)
    return backend

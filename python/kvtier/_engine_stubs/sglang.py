"""Stand-ins for sglang.srt.mem_cache.hicache_storage, used when sglang is not
importable. Recorded from sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44,
python/sglang/srt/mem_cache/hicache_storage.py: the same class and method
names, parameters and defaults; the bodies only do what the base does (store
the host pool, raise NotImplementedError, the default batch_exists)."""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional

# Max pages per batched storage IO call (SGLang's STORAGE_BATCH_SIZE).
STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    """SGLang's L3 storage interface (stand-in)."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys: List[str], pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        pass

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


# sglang/srt/metrics/collector.py (same commit): what get_stats() returns
# when storage metrics are on; SGLang's StorageMetricsCollector asserts the
# type and logs each list entry into a histogram.
@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)

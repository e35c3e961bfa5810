"""An offloading manager shaped like vLLM's ``OffloadingManager`` (lookup,
prepare_load, touch, complete_load, prepare_store, complete_store,
take_events) over one Cache.

How vLLM block hashes map to kvtier keys
----------------------------------------
vLLM names each offloaded block by a hash that already commits to every
earlier token (and to its extra keys: LoRA, multimodal, cache salt), and it
looks blocks up from any start index, not only from the request's first
token. kvtier chains block hashes from a request's first token, so the
manager gives every vLLM block its own one-block kvtier request:

    namespace = manager prefix + type tag + the block hash's bytes
    tokens    = block_tokens zeros, plus one (never matched: kvtier always
                leaves a request's last token to the engine)

so block key = XXH3-128(XXH3(namespace) || zeros), a pure function of the
vLLM hash. A block is then found, pinned, stored and evicted (LRU or LFU,
leaves only - and every block is a leaf) independently of its neighbours,
as vLLM expects. ``block_tokens`` (a multiple of the engine's page tokens)
is the offloaded block size; one block spans block_tokens/tokens_per_page
engine pages.

The transfer itself is kvtier's: prepare_load / prepare_store return specs
holding kvtier tasks; the worker side calls ``transfer(spec, pages)`` with
the engine pages of each block, and complete_load / complete_store reap the
tasks (bounded by ``timeout``). A store becomes visible to lookups when its
task succeeds; complete_store(success=False) cancels it without a trace.

Gap: kvtier does not say which blocks an eviction removed, so
``PrepareStoreOutput.block_hashes_evicted`` is always empty and
take_events() yields nothing.
"""
from collections import defaultdict, namedtuple

import numpy as np

from ._arrays import CRequest, u32_array
from .cache import Cache
from .errors import STATUS, KvtierError, NotFound, Timeout, invalid

LoadSpec = namedtuple("LoadSpec", "block_hashes tasks block_tokens")
LoadSpec.__doc__ = "What prepare_load pinned: one kvtier load task per block, in order."
StoreSpec = namedtuple("StoreSpec", "block_hashes tasks block_tokens")
StoreSpec.__doc__ = "What prepare_store planned: one kvtier store task per new block."
PrepareStoreOutput = namedtuple("PrepareStoreOutput",
                                "block_hashes_to_store store_spec block_hashes_evicted")
PrepareStoreOutput.__doc__ = "vLLM's PrepareStoreOutput (block_hashes_evicted is always [])."


def block_key(block_hash, prefix=b""):
    """The kvtier namespace of one vLLM block hash (bytes, int or str)."""
    if isinstance(block_hash, (bytes, bytearray, memoryview)):
        return prefix + b"b" + bytes(block_hash)
    if isinstance(block_hash, bool):
        raise invalid("block hash: expected bytes, int or str, got bool")
    if isinstance(block_hash, (int, np.integer)):
        v = int(block_hash)
        return prefix + b"i" + v.to_bytes((v.bit_length() + 8) // 8 + 1, "little", signed=True)
    if isinstance(block_hash, str):
        return prefix + b"s" + block_hash.encode("utf-8")
    h = getattr(block_hash, "hash_value", None)  # older vLLM BlockHash namedtuples
    if h is not None:
        return block_key(h, prefix)
    raise invalid("block hash: expected bytes, int or str, got %s" % type(block_hash).__name__)


class OffloadingManager:
    """vLLM-shaped offloading over `cache` (engine memory registered).
    prefix: bytes mixed into every key (model id / cache salt).
    timeout: seconds every wait of complete_load / complete_store may take."""

    def __init__(self, cache, prefix=b"", timeout=10.0):
        if not isinstance(cache, Cache):
            raise invalid("OffloadingManager: cache must be a kvtier.Cache")
        self.cache = cache
        self.prefix = bytes(prefix)
        self.timeout = timeout
        self.block_tokens = cache.block_tokens
        tpp = cache.geometry.info()["tokens_per_page"]
        self.pages_per_block = self.block_tokens // tpp
        self._tokens = np.zeros(self.block_tokens + 1, dtype=np.uint32)
        self._loads = defaultdict(list)   # key -> [task, ...] pinned by prepare_load
        self._stores = {}                 # key -> task planned by prepare_store

    def _req(self, h):
        return CRequest(self._tokens, block_key(h, self.prefix))

    def _hashes(self, block_hashes):
        if isinstance(block_hashes, (bytes, str)):
            raise invalid("block_hashes: expected an iterable of hashes, got one %s"
                          % type(block_hashes).__name__)
        try:
            return list(block_hashes)
        except TypeError:
            raise invalid("block_hashes: not iterable (%s)" % type(block_hashes).__name__) from None

    def _reap(self, task):
        try:
            return self.cache.wait(task, self.timeout)
        except NotFound:
            return None

    def _probe(self, h):
        """Looks one block up and releases the pin at once (updates recency)."""
        m = self.cache.lookup(self._req(h))
        if m.task:
            self.cache.cancel(m.task)
            self._reap(m.task)
        return m.matched_tokens == self.block_tokens

    def lookup(self, block_hashes):
        """How many blocks, from the first, are offloaded and ready."""
        n = 0
        for h in self._hashes(block_hashes):
            if not self._probe(h):
                break
            n += 1
        return n

    def touch(self, block_hashes):
        """Marks the blocks recently used (kvtier lookups update recency)."""
        for h in self._hashes(block_hashes):
            self._probe(h)

    def prepare_load(self, block_hashes):
        """Pins every block for loading and returns a LoadSpec. Raises
        NotFound when a block is not (or no longer) offloaded."""
        hs = self._hashes(block_hashes)
        tasks = []
        try:
            for i, h in enumerate(hs):
                m = self.cache.lookup(self._req(h))
                if m.matched_tokens != self.block_tokens:
                    if m.task:
                        tasks.append(m.task)
                    raise NotFound(STATUS["ENOTFOUND"], "prepare_load: block %d (%r) is not "
                                   "offloaded" % (i, h))
                tasks.append(m.task)
        except BaseException:
            for t in tasks:
                self._drop(t)
            raise
        for h, t in zip(hs, tasks):
            self._loads[block_key(h, self.prefix)].append(t)
        return LoadSpec(hs, tasks, self.block_tokens)

    def _drop(self, task):
        try:
            self.cache.cancel(task)
        except KvtierError:
            pass
        self._reap(task)

    def transfer(self, spec, pages):
        """Worker side: starts the spec's tasks. pages: for every block of the
        spec, its pages_per_block engine pages (flat, block by block)."""
        if not isinstance(spec, (LoadSpec, StoreSpec)):
            raise invalid("transfer: spec must come from prepare_load or prepare_store")
        pg = u32_array(pages, "pages", allow_empty=True)
        need = len(spec.tasks) * self.pages_per_block
        if len(pg) != need:
            raise invalid("transfer: %d pages given; %d blocks of %d pages need %d"
                          % (len(pg), len(spec.tasks), self.pages_per_block, need))
        ppb = self.pages_per_block
        for i, t in enumerate(spec.tasks):
            self.cache.launch(t, pg[i * ppb:(i + 1) * ppb])

    def complete_load(self, block_hashes):
        """Releases the blocks a prepare_load pinned, waiting (bounded) for
        their transfers. Raises the first failed task's error."""
        err = None
        for h in self._hashes(block_hashes):
            tasks = self._loads.get(block_key(h, self.prefix))
            if not tasks:
                raise invalid("complete_load: block %r has no prepared load" % (h,))
            t = tasks.pop(0)
            if not tasks:
                del self._loads[block_key(h, self.prefix)]
            r = self.cache.try_wait(t)
            if r is None:
                try:
                    r = self.cache.wait(t, self.timeout)
                except Timeout:
                    self._drop(t)
                    raise
            if not r.ok and r.status != STATUS["ETIMEDOUT"] and err is None:
                err = r.error()
            elif r.status == STATUS["ETIMEDOUT"] and err is None:
                err = r.error()  # planned but never transferred: expired
        if err is not None:
            raise err

    def prepare_store(self, block_hashes):
        """Plans the store of the blocks not yet offloaded (evicting cold ones).
        Returns PrepareStoreOutput, or None when there is no room."""
        hs = self._hashes(block_hashes)
        to_store, tasks = [], []
        try:
            for h in hs:
                k = block_key(h, self.prefix)
                if k in self._stores:
                    continue  # already being stored
                p = self.cache.prepare_store(self._req(h))
                if p.task:
                    to_store.append(h)
                    tasks.append(p.task)
                    self._stores[k] = p.task
        except KvtierError as e:
            for h, t in zip(to_store, tasks):
                self._stores.pop(block_key(h, self.prefix), None)
                self._drop(t)
            if e.status in (STATUS["ENOSPC"], STATUS["EFULL"]):
                return None
            raise
        return PrepareStoreOutput(to_store, StoreSpec(to_store, tasks, self.block_tokens), [])

    def complete_store(self, block_hashes, success=True):
        """Ends the stores of these blocks: success=True waits (bounded) until
        their data landed, then they are visible; success=False cancels them
        (no trace). Raises the first failure."""
        err = None
        for h in self._hashes(block_hashes):
            t = self._stores.pop(block_key(h, self.prefix), None)
            if t is None:
                continue  # nothing was stored for it (already offloaded)
            if not success:
                self._drop(t)
                continue
            try:
                r = self.cache.wait(t, self.timeout)
            except Timeout:
                self._drop(t)
                raise
            if not r.ok and err is None:
                err = r.error()
        if err is not None:
            raise err

    def take_events(self):
        """vLLM's offloading events; kvtier does not report evicted keys, so none."""
        return iter(())

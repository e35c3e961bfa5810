/* copy_cuda.c - the cuda copy backend (cuda.h).
 *
 * Compiled everywhere; runs only where a CUDA runtime and device exist.
 * STATUS: the planning functions are tested on every machine
 * (tests/unit/test_cuda_plan.c); the CUDA calls are compiled, and run only
 * by tests/unit/test_cuda.c and `kvtier bench copy --device cuda` on a GPU
 * machine (scripts/gpu-check.sh). */
#include "cuda/cuda.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

#define MAX_RANGES 16
#define KERNEL_DESCS 8192 /* per worker, pinned; a full ring syncs the stream */
#define KERNEL_THREADS 256

struct kvt_cuda_backend {
    const kvt_cuda_api *api;
    int device;
    kvt_cuda_mode mode;
    kvt_cufunction kernel;
    pthread_mutex_t mu; /* ranges */
    kvt_cuda_range ranges[MAX_RANGES];
    uint32_t nranges;
    kvt_copy_ops ops;
};

typedef struct cuda_worker {
    kvt_custream stream;
    kvt_cuda_desc *descs; /* pinned, mapped: the kernel reads them */
    kvt_cuda_desc *descs_dev;
    uint32_t descs_used;
    void **dsts;
    const void **srcs;
    size_t *sizes;
} cuda_worker;

const char *kvt__cuda_mode_name(kvt_cuda_mode m)
{
    switch (m) {
    case KVT_CUDA_AUTO: return "auto";
    case KVT_CUDA_BATCH: return "batch";
    case KVT_CUDA_KERNEL: return "kernel";
    case KVT_CUDA_MEMCPY: return "memcpy";
    }
    return "?";
}

kvt_status kvt__cuda_mode_parse(const char *s, kvt_cuda_mode *out)
{
    if (!s || !*s || !strcmp(s, "auto")) *out = KVT_CUDA_AUTO;
    else if (!strcmp(s, "batch")) *out = KVT_CUDA_BATCH;
    else if (!strcmp(s, "kernel")) *out = KVT_CUDA_KERNEL;
    else if (!strcmp(s, "memcpy")) *out = KVT_CUDA_MEMCPY;
    else
        return kvt__fail(KVT_EINVAL, "CUDA copy mode \"%s\" is not auto, batch, kernel or memcpy",
                         s);
    return KVT_OK;
}

/* ---- planning (no CUDA calls) ---- */

void kvt__cuda_plan_batch(const kvt_copy_chunk *chunks, uint32_t n, int dir, int device,
                          void **dsts, const void **srcs, size_t *sizes,
                          kvt_cu_memcpy_attr *attr)
{
    for (uint32_t i = 0; i < n; i++) {
        dsts[i] = chunks[i].dst;
        srcs[i] = chunks[i].src;
        sizes[i] = (size_t)chunks[i].len;
    }
    kvt_cu_mem_location dev = {.type = KVT_CU_LOC_DEVICE, .id = device};
    kvt_cu_mem_location host = {.type = KVT_CU_LOC_HOST, .id = 0};
    memset(attr, 0, sizeof *attr);
    attr->src_access_order = KVT_CU_SRC_ORDER_STREAM;
    attr->src_loc_hint = dir == KVT_XFER_GATHER ? dev : host;
    attr->dst_loc_hint = dir == KVT_XFER_GATHER ? host : dev;
    attr->flags = 0;
}

static const kvt_cuda_range *find_range(const kvt_cuda_range *r, uint32_t nr, const void *p,
                                        uint64_t len)
{
    const uint8_t *q = p;
    for (uint32_t i = 0; i < nr; i++)
        if (q >= r[i].host && q + len <= r[i].host + r[i].len && q + len >= q) return &r[i];
    return NULL;
}

kvt_status kvt__cuda_plan_kernel(const kvt_copy_chunk *chunks, uint32_t n, int dir,
                                 const kvt_cuda_range *ranges, uint32_t nranges,
                                 kvt_cuda_desc *out, uint32_t *grid_y)
{
    uint64_t longest = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvt_copy_chunk *c = &chunks[i];
        const void *host = dir == KVT_XFER_GATHER ? c->dst : c->src;
        const kvt_cuda_range *r = find_range(ranges, nranges, host, c->len);
        if (!r)
            return kvt__fail(KVT_EINVAL, "cuda kernel copy: chunk %u's host address %p (%llu "
                             "bytes) is not in pinned memory", i, host,
                             (unsigned long long)c->len);
        uint64_t hdev = (uint64_t)(uintptr_t)r->dev + (uint64_t)((const uint8_t *)host - r->host);
        if (dir == KVT_XFER_GATHER)
            out[i] = (kvt_cuda_desc){.dst = hdev, .src = (uint64_t)(uintptr_t)c->src, .len = c->len};
        else
            out[i] = (kvt_cuda_desc){.dst = (uint64_t)(uintptr_t)c->dst, .src = hdev, .len = c->len};
        if (c->len > longest) longest = c->len;
    }
    uint64_t y = (longest + KVT_CUDA_SLICE_BYTES - 1) / KVT_CUDA_SLICE_BYTES;
    *grid_y = (uint32_t)(y == 0 ? 1 : y > KVT_CUDA_MAX_SLICES ? KVT_CUDA_MAX_SLICES : y);
    return KVT_OK;
}

/* ---- the ops (worker threads) ---- */

static kvt_status cu_fail(const kvt_cuda_backend *b, const char *what, kvt_cuerr e)
{
    return kvt__fail(KVT_EIO, "cuda copy (device %d, %s): %s failed: %s", b->device,
                     kvt__cuda_mode_name(b->mode), what, kvt__cuda_errstr(b->api, e));
}

static kvt_status worker_init(kvt_cuda_backend *b, void **wctx)
{
    const kvt_cuda_api *api = b->api;
    cuda_worker *w = calloc(1, sizeof *w);
    if (!w) return kvt__fail(KVT_ENOMEM, "cuda copy: out of memory for a worker");
    w->dsts = calloc(512, sizeof *w->dsts);
    w->srcs = calloc(512, sizeof *w->srcs);
    w->sizes = calloc(512, sizeof *w->sizes);
    kvt_cuerr e;
    kvt_status st = KVT_OK;
    if (!w->dsts || !w->srcs || !w->sizes) {
        st = kvt__fail(KVT_ENOMEM, "cuda copy: out of memory for a worker");
    } else if ((e = api->SetDevice(b->device))) {
        st = cu_fail(b, "cudaSetDevice", e);
    } else if ((e = api->StreamCreateWithFlags(&w->stream, KVT_CU_STREAM_NON_BLOCKING))) {
        st = cu_fail(b, "cudaStreamCreateWithFlags", e);
    } else if (b->mode == KVT_CUDA_KERNEL) {
        if ((e = api->HostAlloc((void **)&w->descs, KERNEL_DESCS * sizeof *w->descs,
                                KVT_CU_HOST_ALLOC_PORTABLE | KVT_CU_HOST_ALLOC_MAPPED)))
            st = cu_fail(b, "cudaHostAlloc of the kernel's descriptors", e);
        else if ((e = api->HostGetDevicePointer((void **)&w->descs_dev, w->descs, 0)))
            st = cu_fail(b, "cudaHostGetDevicePointer of the kernel's descriptors", e);
    }
    if (st) {
        if (w->descs) api->FreeHost(w->descs);
        if (w->stream) api->StreamDestroy(w->stream);
        free(w->dsts);
        free((void *)w->srcs);
        free(w->sizes);
        free(w);
        return st;
    }
    *wctx = w;
    return KVT_OK;
}

static void worker_exit(void *ctx, void *wctx)
{
    kvt_cuda_backend *b = ctx;
    cuda_worker *w = wctx;
    if (!w) return;
    if (w->stream) {
        b->api->StreamSynchronize(w->stream);
        b->api->StreamDestroy(w->stream);
    }
    if (w->descs) b->api->FreeHost(w->descs);
    free(w->dsts);
    free((void *)w->srcs);
    free(w->sizes);
    free(w);
}

typedef kvt_cuerr (*batch13_fn)(void *const *, const void *const *, const size_t *, size_t,
                                kvt_cu_memcpy_attr *, size_t *, size_t, kvt_custream);
typedef kvt_cuerr (*batch12_fn)(void *const *, const void *const *, const size_t *, size_t,
                                kvt_cu_memcpy_attr *, size_t *, size_t, size_t *, kvt_custream);

static kvt_status copy_batch(kvt_cuda_backend *b, cuda_worker *w, int dir,
                             const kvt_copy_chunk *ch, uint32_t n)
{
    kvt_cu_memcpy_attr attr;
    kvt__cuda_plan_batch(ch, n, dir, b->device, w->dsts, w->srcs, w->sizes, &attr);
    size_t idx = 0, fail_idx = 0;
    kvt_cuerr e;
    if (b->api->runtime_version >= 13000)
        e = ((batch13_fn)b->api->MemcpyBatchAsync)(w->dsts, w->srcs, w->sizes, n, &attr, &idx, 1,
                                                    w->stream);
    else
        e = ((batch12_fn)b->api->MemcpyBatchAsync)(w->dsts, w->srcs, w->sizes, n, &attr, &idx, 1,
                                                    &fail_idx, w->stream);
    return e ? cu_fail(b, "cudaMemcpyBatchAsync", e) : KVT_OK;
}

static kvt_status copy_memcpy(kvt_cuda_backend *b, cuda_worker *w, int dir,
                              const kvt_copy_chunk *ch, uint32_t n)
{
    int kind = dir == KVT_XFER_GATHER ? KVT_CU_MEMCPY_D2H : KVT_CU_MEMCPY_H2D;
    for (uint32_t i = 0; i < n; i++) {
        kvt_cuerr e = b->api->MemcpyAsync(ch[i].dst, ch[i].src, ch[i].len, kind, w->stream);
        if (e) return cu_fail(b, "cudaMemcpyAsync", e);
    }
    return KVT_OK;
}

static kvt_status copy_kernel(kvt_cuda_backend *b, cuda_worker *w, int dir,
                              const kvt_copy_chunk *ch, uint32_t n)
{
    if (w->descs_used + n > KERNEL_DESCS) { /* the ring is full: wait for the kernels */
        kvt_cuerr e = b->api->StreamSynchronize(w->stream);
        if (e) return cu_fail(b, "cudaStreamSynchronize", e);
        w->descs_used = 0;
    }
    uint32_t grid_y;
    pthread_mutex_lock(&b->mu);
    kvt_status st = kvt__cuda_plan_kernel(ch, n, dir, b->ranges, b->nranges,
                                          w->descs + w->descs_used, &grid_y);
    pthread_mutex_unlock(&b->mu);
    if (st) return copy_memcpy(b, w, dir, ch, n); /* not pinned after all: as ops_copy_async */
    kvt_cuda_desc *d = w->descs_dev + w->descs_used;
    unsigned cnt = n;
    void *args[] = {&d, &cnt};
    int r = b->api->cuLaunchKernel(b->kernel, n, grid_y, 1, KERNEL_THREADS, 1, 1, 0, w->stream,
                                   args, NULL);
    if (r) {
        const char *s = NULL;
        if (b->api->cuGetErrorString) b->api->cuGetErrorString(r, &s);
        return kvt__fail(KVT_EIO, "cuda copy (device %d, kernel): cuLaunchKernel failed: %s (%d)",
                         b->device, s ? s : "?", r);
    }
    w->descs_used += n;
    return KVT_OK;
}

/* Whether every chunk's host side lies in a pinned range. A node server's
 * tier shared across geometries is not pinned (kvt__cuda_backend_pin's
 * callers): pinning would back all of it and keep pages the server later
 * punches out to give memory to another geometry. */
static bool host_pinned(kvt_cuda_backend *b, int dir, const kvt_copy_chunk *ch, uint32_t n)
{
    bool all = true;
    pthread_mutex_lock(&b->mu);
    for (uint32_t i = 0; i < n && all; i++)
        all = find_range(b->ranges, b->nranges, dir == KVT_XFER_GATHER ? ch[i].dst : ch[i].src,
                         ch[i].len) != NULL;
    pthread_mutex_unlock(&b->mu);
    return all;
}

static kvt_status ops_copy_async(void *ctx, void **wctx, int dir, const kvt_copy_chunk *ch,
                                 uint32_t n)
{
    kvt_cuda_backend *b = ctx;
    if (!*wctx) {
        kvt_status st = worker_init(b, wctx);
        if (st) return st;
    }
    cuda_worker *w = *wctx;
    if (n > 512) return kvt__fail(KVT_EINVAL, "cuda copy: %u chunks in one call (at most 512)", n);
    /* Pageable host memory: cudaMemcpyAsync, which stages it through the
     * driver's own pinned buffers (a copy from the device has ended when
     * it returns; one to the device has read its source). The batch API's
     * stream-ordered source and the kernel's mapped pointers need pinned
     * memory. */
    if (b->mode != KVT_CUDA_MEMCPY && !host_pinned(b, dir, ch, n))
        return copy_memcpy(b, w, dir, ch, n);
    switch (b->mode) {
    case KVT_CUDA_BATCH: return copy_batch(b, w, dir, ch, n);
    case KVT_CUDA_KERNEL: return copy_kernel(b, w, dir, ch, n);
    default: return copy_memcpy(b, w, dir, ch, n);
    }
}

static kvt_status ops_record(void *ctx, void **wctx, void **event)
{
    kvt_cuda_backend *b = ctx;
    cuda_worker *w = *wctx;
    if (!event || !w) return KVT_OK;
    kvt_cuerr e;
    if (!*event && (e = b->api->EventCreateWithFlags(event, KVT_CU_EVENT_DISABLE_TIMING))) {
        *event = NULL;
        return cu_fail(b, "cudaEventCreateWithFlags", e);
    }
    e = b->api->EventRecord(*event, w->stream);
    return e ? cu_fail(b, "cudaEventRecord", e) : KVT_OK;
}

static kvt_status ops_sync(void *ctx, void **wctx)
{
    kvt_cuda_backend *b = ctx;
    cuda_worker *w = *wctx;
    if (!w) return KVT_OK;
    kvt_cuerr e = b->api->StreamSynchronize(w->stream);
    w->descs_used = 0;
    return e ? cu_fail(b, "cudaStreamSynchronize", e) : KVT_OK;
}

static kvt_status ops_copy_unused(void *ctx, const kvt_copy_chunk *ch, uint32_t n)
{
    return kvt__fail(KVT_ESTATE, "cuda copy: the synchronous copy op is not used");
}

/* ---- the backend ---- */

/* Picks the mode (want may be AUTO) and loads the kernel when it needs it.
 * b->device's context is current. */
static kvt_status load_mode(kvt_cuda_backend *b, const char *fn, kvt_cuda_mode want)
{
    const kvt_cuda_api *api = b->api;
    int device = b->device;
    bool can_kernel = kvt__cuda_fatbin_len > 0 && api->cuModuleLoadData;
    if (want == KVT_CUDA_AUTO)
        want = api->MemcpyBatchAsync ? KVT_CUDA_BATCH : can_kernel ? KVT_CUDA_KERNEL : KVT_CUDA_MEMCPY;
    if (want == KVT_CUDA_BATCH && !api->MemcpyBatchAsync) {
        int rv = api->runtime_version;
        return kvt__fail(KVT_EUNSUPPORTED, "%s: CUDA copy mode batch needs cudaMemcpyBatchAsync "
                         "(CUDA >= 12.8; this runtime is %d.%d)", fn, rv / 1000, (rv % 1000) / 10);
    }
    if (want == KVT_CUDA_KERNEL) {
        if (!can_kernel) {
            return kvt__fail(KVT_EUNSUPPORTED, "%s: CUDA copy mode kernel needs %s", fn,
                             kvt__cuda_fatbin_len == 0
                                 ? "a library built with nvcc (this one has no kernel)"
                                 : api->driver_error ? api->driver_error : "the CUDA driver API");
        }
        kvt_cumodule mod;
        int r = api->cuModuleLoadData(&mod, kvt__cuda_fatbin);
        if (!r) r = api->cuModuleGetFunction(&b->kernel, mod, "kvt_gather_scatter");
        if (r) {
            const char *s = NULL;
            if (api->cuGetErrorString) api->cuGetErrorString(r, &s);
            return kvt__fail(KVT_EUNSUPPORTED, "%s: loading the copy kernel on CUDA device %d "
                             "failed: %s (%d)", fn, device, s ? s : "?", r);
        }
    }
    b->mode = want;
    return KVT_OK;
}

kvt_status kvt__cuda_backend_create(kvt_cuda_backend **out, const char *fn, int device,
                                    kvt_cuda_mode want)
{
    const kvt_cuda_api *api;
    kvt_status st = kvt__cuda_check_device(fn, device, &api);
    if (st) return st;
    if (want == KVT_CUDA_AUTO) {
        st = kvt__cuda_mode_parse(getenv("KVTIER_CUDA_COPY"), &want);
        if (st) return kvt__wrap_error(st, "KVTIER_CUDA_COPY");
    }
    kvt_cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return kvt__fail(KVT_ENOMEM, "%s: out of memory", fn);
    b->api = api;
    b->device = device;
    pthread_mutex_init(&b->mu, NULL);
    /* The caller's thread (the engine's) keeps its current device. */
    int prev = -1;
    if (api->GetDevice(&prev)) prev = -1;
    kvt_cuerr e = api->SetDevice(device);
    if (!e) e = api->Free(NULL); /* creates the primary context */
    st = e ? KVT_OK : load_mode(b, fn, want);
    /* The kernel module was loaded into the device's primary context, which
     * is current until here. */
    if (prev >= 0 && prev != device) api->SetDevice(prev);
    if (st) {
        kvt__cuda_backend_destroy(b);
        return st;
    }
    if (e) {
        kvt__cuda_backend_destroy(b);
        return kvt__fail(KVT_EUNSUPPORTED, "%s: CUDA device %d cannot be used: %s", fn, device,
                         kvt__cuda_errstr(api, e));
    }
    want = b->mode;
    b->ops = (kvt_copy_ops){.name = want == KVT_CUDA_BATCH    ? "cuda-batch"
                                    : want == KVT_CUDA_KERNEL ? "cuda-kernel"
                                                              : "cuda-memcpy",
                            .copy = ops_copy_unused,
                            .ctx = b,
                            .copy_async = ops_copy_async,
                            .record = ops_record,
                            .sync = ops_sync,
                            .worker_exit = worker_exit};
    *out = b;
    return KVT_OK;
}

void kvt__cuda_backend_destroy(kvt_cuda_backend *b)
{
    if (!b) return;
    for (uint32_t i = 0; i < b->nranges; i++) b->api->HostUnregister(b->ranges[i].host);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

const kvt_copy_ops *kvt__cuda_backend_ops(kvt_cuda_backend *b) { return &b->ops; }
kvt_cuda_mode kvt__cuda_backend_mode(const kvt_cuda_backend *b) { return b->mode; }
const kvt_cuda_api *kvt__cuda_backend_api(const kvt_cuda_backend *b) { return b->api; }
int kvt__cuda_backend_device(const kvt_cuda_backend *b) { return b->device; }

kvt_status kvt__cuda_backend_pin(kvt_cuda_backend *b, const char *fn, void *p, uint64_t len)
{
    pthread_mutex_lock(&b->mu);
    kvt_status st = KVT_OK;
    if (b->nranges == MAX_RANGES) {
        st = kvt__fail(KVT_EFULL, "%s: more than %d pinned host ranges", fn, MAX_RANGES);
    } else {
        kvt_cuerr e = b->api->HostRegister(p, len, KVT_CU_HOST_REGISTER_PORTABLE |
                                                       KVT_CU_HOST_REGISTER_MAPPED);
        void *dev = NULL;
        if (!e) e = b->api->HostGetDevicePointer(&dev, p, 0);
        if (e)
            st = kvt__fail(KVT_ESYS, "%s: cudaHostRegister of %llu bytes at %p failed: %s", fn,
                           (unsigned long long)len, p, kvt__cuda_errstr(b->api, e));
        else
            b->ranges[b->nranges++] = (kvt_cuda_range){.host = p, .dev = dev, .len = len};
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

void kvt__cuda_backend_unpin(kvt_cuda_backend *b, void *p)
{
    pthread_mutex_lock(&b->mu);
    for (uint32_t i = 0; i < b->nranges; i++)
        if (b->ranges[i].host == p) {
            b->api->HostUnregister(p);
            b->ranges[i] = b->ranges[--b->nranges];
            break;
        }
    pthread_mutex_unlock(&b->mu);
}

kvt_status kvt__cuda_backend_check_ptr(kvt_cuda_backend *b, const char *fn, const char *what,
                                       const void *p)
{
    kvt_cu_ptr_attr_buf a;
    memset(&a, 0, sizeof a);
    kvt_cuerr e = b->api->PointerGetAttributes(&a, p);
    if (e)
        return kvt__fail(KVT_EINVAL, "%s: %s (%p): cudaPointerGetAttributes failed: %s", fn, what,
                         p, kvt__cuda_errstr(b->api, e));
    if (a.a.type != KVT_CU_MEMTYPE_DEVICE && a.a.type != KVT_CU_MEMTYPE_MANAGED)
        return kvt__fail(KVT_EINVAL, "%s: %s (%p) is %s memory, not CUDA device memory", fn, what,
                         p, a.a.type == KVT_CU_MEMTYPE_HOST ? "pinned host" : "unregistered host");
    if (a.a.type == KVT_CU_MEMTYPE_DEVICE && a.a.device != b->device)
        return kvt__fail(KVT_EINVAL, "%s: %s (%p) is memory of CUDA device %d, not device %d", fn,
                         what, p, a.a.device, b->device);
    return KVT_OK;
}

kvt_status kvt__cuda_backend_stream_wait(kvt_cuda_backend *b, const char *fn, void *stream,
                                         void *event)
{
    kvt_cuerr e = b->api->StreamWaitEvent(stream, event, 0);
    if (e)
        return kvt__fail(KVT_EIO, "%s: cudaStreamWaitEvent(stream %p) failed: %s", fn, stream,
                         kvt__cuda_errstr(b->api, e));
    return KVT_OK;
}

void kvt__cuda_backend_free_events(kvt_cuda_backend *b, void **events, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (events[i]) {
            b->api->EventDestroy(events[i]);
            events[i] = NULL;
        }
}

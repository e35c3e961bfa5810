/* fake_cudart.c - a stand-in CUDA runtime over host memory, for machines
 * without a GPU: KVTIER_CUDART=libfake_cudart.so makes kvtier's device path
 * (registration checks, pinning, per-worker streams, batched copies, events,
 * kvt_cache_layer_event, the bench) run here end to end. It is NOT a GPU
 * test: "device" memory is host memory. What it does check is kvtier's own
 * plumbing: every copy is queued on its stream and happens only when that
 * stream is synchronized (or an event recorded on it is waited for), so a
 * missing sync or a wrong event shows up as unverified bytes; batched copies
 * must carry one stream-ordered attribute whose location hints match the
 * memory each side really is (device allocations vs pinned host); a
 * cudaMemcpyAsync on pageable host memory behaves as the runtime's (from
 * the device: done on return; to it: source read on return). The copy
 * kernel needs libcuda and is not faked. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int err;
enum { OK = 0, E_INVALID_VALUE = 1, E_INVALID_DEVICE = 101, E_BAD_HANDLE = 400, E_ALREADY = 712,
       E_NOT_REG = 713 };

typedef struct range { uint8_t *p; size_t len; int type; } range; /* 1 host, 2 device, 3 stream */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static range g_ranges[4096];
static int g_nranges;

static void add_range(void *p, size_t len, int type)
{
    pthread_mutex_lock(&g_mu);
    if (g_nranges < 4096) g_ranges[g_nranges++] = (range){p, len, type};
    pthread_mutex_unlock(&g_mu);
}
static int del_range(void *p, int type)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nranges; i++)
        if (g_ranges[i].p == p && g_ranges[i].type == type) {
            g_ranges[i] = g_ranges[--g_nranges];
            pthread_mutex_unlock(&g_mu);
            return 1;
        }
    pthread_mutex_unlock(&g_mu);
    return 0;
}
static int type_of(const void *p)
{
    const uint8_t *q = p;
    int t = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_nranges; i++)
        if (q >= g_ranges[i].p && q < g_ranges[i].p + g_ranges[i].len) t = g_ranges[i].type;
    pthread_mutex_unlock(&g_mu);
    return t;
}

typedef struct op { void *dst; const void *src; size_t len; void *own; } op;
typedef struct stream { pthread_mutex_t mu; op *q; size_t n, cap; } stream;
static void enqueue_own(stream *s, void *dst, const void *src, size_t len, void *own)
{
    pthread_mutex_lock(&s->mu);
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->q = realloc(s->q, s->cap * sizeof *s->q);
    }
    s->q[s->n++] = (op){dst, src, len, own};
    pthread_mutex_unlock(&s->mu);
}
static void enqueue(stream *s, void *dst, const void *src, size_t len)
{
    enqueue_own(s, dst, src, len, NULL);
}
static void flush(stream *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        memcpy(s->q[i].dst, s->q[i].src, s->q[i].len);
        free(s->q[i].own);
    }
    s->n = 0;
    pthread_mutex_unlock(&s->mu);
}
typedef struct event { stream *s; } event;

const char *cudaGetErrorString(err e)
{
    static __thread char b[48];
    snprintf(b, sizeof b, "fake CUDA error %d", e);
    return b;
}
err cudaRuntimeGetVersion(int *v) { *v = 13000; return OK; }
err cudaDriverGetVersion(int *v) { *v = 13000; return OK; }
err cudaGetDeviceCount(int *n) { *n = 1; return OK; }
err cudaSetDevice(int d) { return d == 0 ? OK : E_INVALID_DEVICE; }
err cudaGetDevice(int *d) { *d = 0; return OK; }
err cudaMalloc(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    if (!*p) return 2;
    add_range(*p, n, 2);
    return OK;
}
err cudaFree(void *p)
{
    if (!p) return OK;
    if (!del_range(p, 2)) return E_INVALID_VALUE;
    free(p);
    return OK;
}
err cudaMemcpy(void *d, const void *s, size_t n, int kind) { memcpy(d, s, n); return OK; }
err cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return OK; }
err cudaMemcpyAsync(void *d, const void *s, size_t n, int kind, void *st)
{
    if (!st) { memcpy(d, s, n); return OK; }
    if ((kind == 2 && type_of(s) != 2) || (kind == 1 && type_of(d) != 2)) return E_INVALID_VALUE;
    /* Pageable (unregistered) host memory, as the runtime treats it: a
     * copy from the device has ended when the call returns (after the
     * stream's earlier work); one to the device has read its source into
     * a staging buffer by then. */
    if (kind == 2 && type_of(d) == 0) {
        flush(st);
        memcpy(d, s, n);
        return OK;
    }
    if (kind == 1 && type_of(s) == 0) {
        void *stage = malloc(n ? n : 1);
        if (!stage) return 2;
        memcpy(stage, s, n);
        enqueue_own(st, d, stage, n, stage);
        return OK;
    }
    enqueue(st, d, s, n);
    return OK;
}
err cudaStreamCreateWithFlags(void **s, unsigned f)
{
    stream *x = calloc(1, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    add_range(x, 1, 3);
    *s = x;
    return OK;
}
/* A handle is a live stream, or one of the runtime's own: NULL (legacy
 * default), cudaStreamLegacy (1), cudaStreamPerThread (2). Another (a
 * destroyed stream) is cudaErrorInvalidResourceHandle, as the runtime says. */
static int live_stream(void *s)
{
    return (uintptr_t)s <= 2 || type_of(s) == 3;
}
err cudaStreamDestroy(void *s)
{
    stream *x = s;
    if ((uintptr_t)s <= 2 || !del_range(s, 3)) return E_BAD_HANDLE;
    flush(x);
    free(x->q);
    pthread_mutex_destroy(&x->mu);
    free(x);
    return OK;
}
err cudaStreamSynchronize(void *s) { flush(s); return OK; }
err cudaEventCreateWithFlags(void **e, unsigned f) { *e = calloc(1, sizeof(event)); return OK; }
err cudaEventDestroy(void *e) { free(e); return OK; }
err cudaEventRecord(void *e, void *s) { ((event *)e)->s = s; return OK; }
err cudaEventQuery(void *e) { return ((event *)e)->s && ((event *)e)->s->n ? 600 : OK; }
err cudaEventSynchronize(void *e) { flush(((event *)e)->s); return OK; }
err cudaStreamWaitEvent(void *s, void *e, unsigned f)
{
    if (!live_stream(s)) return E_BAD_HANDLE;
    flush(((event *)e)->s);
    return OK;
}
err cudaHostRegister(void *p, size_t n, unsigned f)
{
    if (type_of(p)) return E_ALREADY;
    add_range(p, n, 1);
    return OK;
}
err cudaHostUnregister(void *p) { return del_range(p, 1) ? OK : E_NOT_REG; }
err cudaHostAlloc(void **p, size_t n, unsigned f)
{
    *p = malloc(n);
    add_range(*p, n, 1);
    return OK;
}
err cudaFreeHost(void *p)
{
    del_range(p, 1);
    free(p);
    return OK;
}
err cudaHostGetDevicePointer(void **d, void *p, unsigned f)
{
    if (type_of(p) != 1) return E_INVALID_VALUE;
    *d = p;
    return OK;
}
err cudaPointerGetAttributes(void *attr, const void *p)
{
    int *a = attr; /* type, device, then pointers */
    a[0] = type_of(p);
    a[1] = 0;
    return OK;
}
typedef struct loc { int type, id; } loc;
typedef struct mattr { int order; loc src, dst; unsigned flags; } mattr;
err cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes,
                         size_t count, mattr *attrs, size_t *idxs, size_t nattrs, void *st)
{
    if (nattrs != 1 || idxs[0] != 0 || attrs[0].order != 1 || !st || count == 0)
        return E_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        /* The hints must name what each side is: 1 device, 2 host. */
        int ts = type_of(srcs[i]), td = type_of(dsts[i]);
        if ((attrs[0].src.type == 1) != (ts == 2) || (attrs[0].dst.type == 1) != (td == 2))
            return E_INVALID_VALUE;
        enqueue(st, dsts[i], srcs[i], sizes[i]);
    }
    return OK;
}

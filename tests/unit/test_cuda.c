/* test_cuda.c - engine KV in CUDA device memory.
 *
 * Everywhere: the refusals, with their exact messages (no CUDA runtime; a
 * runtime but no driver or device; bad kind or ordinal), and that a refused
 * device registration leaves the cache working on host memory.
 * On a machine with a CUDA device (scripts/gpu-check.sh): byte-verified
 * store and load for every copy mode this runtime offers (batch, kernel,
 * memcpy), layerwise loads whose per-layer CUDA events an engine stream
 * waits on, page-first and layer-first layouts, and a host-memory cache
 * working beside the device one. Without a device those print
 * "skipped: no CUDA device (reason)" and are reported as skipped.
 * ctest also runs this file over tests/fake_cudart.c (KVTIER_CUDART), which
 * exercises kvtier's side of the device path without a GPU (not the GPU). */
#include "support.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cuda/cuda.h"

#define WAIT_MS 20000
#define BT 16

static const char *g_no_device; /* why the device tests skip, or NULL */
static const kvt_cuda_api *g_api;

static kvt_cache *new_cache(kvt_geometry *g, kvt_config **cfg)
{
    assert_ok(kvt_config_create(cfg));
    assert_ok(kvt_config_set(*cfg, "cpu_capacity", "16MiB"));
    assert_ok(kvt_config_set(*cfg, "block_tokens", "16"));
    assert_ok(kvt_config_set(*cfg, "huge_pages", "false"));
    kvt_cache *c;
    assert_ok(kvt_cache_create(&c, *cfg, g));
    return c;
}

static int skip_no_device(void)
{
    if (!g_no_device) return 0;
    printf("skipped: no CUDA device (%s)\n", g_no_device);
    fflush(stdout);
    return 1;
}

/* ---- refusals (every machine) ---- */

/* Run as a fresh process (the runtime is loaded once per process): with
 * KVTIER_CUDART naming a missing file, device memory is refused naming the
 * file and dlerror, and the same cache then takes host memory. */
static int child_no_runtime(void)
{
    kvt_geometry *g = kvt_test_geometry(2, 1, 8, 4, KVT_LAYOUT_LAYER_FIRST);
    kvt_config *cfg;
    kvt_cache *c = new_cache(g, &cfg);
    kvt_emu *emu;
    if (kvt_emu_create(&emu, g, 16)) return 10;
    kvt_engine_memory mem;
    kvt_emu_memory(emu, &mem);
    mem.kind = KVT_MEMORY_CUDA;
    kvt_status st = kvt_cache_register_memory(c, &mem);
    const char *want = "kvt_cache_register_memory: CUDA device memory needs the CUDA "
                       "runtime: the CUDA runtime could not be loaded from "
                       "KVTIER_CUDART=/nonexistent/libcudart.so.13 "
                       "(/nonexistent/libcudart.so.13: cannot open shared object file: No "
                       "such file or directory)";
    if (st != KVT_EUNSUPPORTED || strcmp(kvt_last_error(), want) != 0) {
        fprintf(stderr, "got %s: %s\nwant KVT_EUNSUPPORTED: %s\n", kvt_status_name(st),
                kvt_last_error(), want);
        return 11;
    }
    printf("refusal checked: %s\n", want);
    mem.kind = KVT_MEMORY_HOST;
    if (kvt_cache_register_memory(c, &mem) != KVT_OK) return 12;
    kvt_cache_destroy(c);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    return 0;
}

static void refuse_without_runtime(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = kvt_test_fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("KVTIER_CUDART", "/nonexistent/libcudart.so.13", 1);
        execl("/proc/self/exe", "test_cuda", "--child-no-runtime", (char *)NULL);
        _exit(127);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* This process's runtime (found or not): without a device the refusal names
 * the runtime's own error; the cache then works on host memory and has no
 * layer events. */
static void refuse_without_device(void **state)
{
    (void)state;
    kvt_geometry *g = kvt_test_geometry(2, 1, 8, 4, KVT_LAYOUT_LAYER_FIRST);
    kvt_config *cfg;
    kvt_cache *c = new_cache(g, &cfg);
    kvt_emu *emu;
    assert_ok(kvt_emu_create(&emu, g, 16));
    kvt_engine_memory mem;
    assert_ok(kvt_emu_memory(emu, &mem));
    mem.kind = KVT_MEMORY_CUDA;
    if (g_no_device) {
        assert_status(kvt_cache_register_memory(c, &mem), KVT_EUNSUPPORTED);
        char want[1024];
        const char *why = NULL;
        const kvt_cuda_api *api = kvt__cuda_load(&why);
        if (!api) {
            snprintf(want, sizeof want, "kvt_cache_register_memory: CUDA device memory needs "
                     "the CUDA runtime: %s", why);
        } else {
            int n = 0, dv = 0, rv = api->runtime_version;
            kvt_cuerr e = api->GetDeviceCount(&n);
            api->DriverGetVersion(&dv);
            snprintf(want, sizeof want, "kvt_cache_register_memory: no usable CUDA device: "
                     "cudaGetDeviceCount says %s (CUDA runtime %d.%d from %s, driver %s)",
                     e ? api->GetErrorString(e) : "0 devices", rv / 1000, (rv % 1000) / 10,
                     api->cudart_path, dv ? "present" : "absent (no libcuda.so.1 or no GPU)");
        }
        assert_string_equal(kvt_last_error(), want);
        printf("refusal checked: %s\n", want);
    } else {
        /* A device exists: host memory named as device memory is refused. */
        assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
        assert_non_null(strstr(kvt_last_error(), "layer_bases[0]"));
        assert_non_null(strstr(kvt_last_error(), "not CUDA device memory"));
    }
    /* Bad kind, bad ordinal: named. */
    mem.kind = (kvt_memory_kind)3;
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_string_equal(kvt_last_error(), "kvt_cache_register_memory: kind is 3 "
                                          "(KVT_MEMORY_HOST or KVT_MEMORY_CUDA)");
    mem.kind = KVT_MEMORY_CUDA;
    mem.device = -1;
    assert_status(kvt_cache_register_memory(c, &mem), KVT_EINVAL);
    assert_string_equal(kvt_last_error(), "kvt_cache_register_memory: device is -1 (a CUDA "
                                          "device ordinal is >= 0)");
    void *ev = (void *)1;
    assert_status(kvt_cache_layer_event(c, 1, 0, 0, &ev), KVT_EUNSUPPORTED);
    assert_ptr_equal(ev, (void *)1); /* out-parameters are written only on success */
    assert_string_equal(kvt_last_error(), "kvt_cache_layer_event: the engine memory is not "
                                          "registered yet; layer events exist only for CUDA "
                                          "device memory (use kvt_cache_wait_layer)");
    /* Host memory still registers, and host tasks run. */
    mem.kind = KVT_MEMORY_HOST;
    mem.device = 0;
    assert_ok(kvt_cache_register_memory(c, &mem));
    assert_status(kvt_cache_layer_event(c, 1, 0, 0, &ev), KVT_EUNSUPPORTED);
    assert_non_null(strstr(kvt_last_error(), "the engine memory is host memory"));
    assert_status(kvt_cache_stream_wait_layer(c, 1, 0, NULL, 0), KVT_EUNSUPPORTED);
    uint32_t tokens[65], pages[16];
    kvt_test_tokens(tokens, 65, 9);
    for (uint32_t i = 0; i < 16; i++) pages[i] = i;
    kvt_request r = {.tokens = tokens, .num_tokens = 65};
    assert_ok(kvt_emu_fill(emu, &r, 0, 64, pages, 16));
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(c, &r, &p));
    assert_ok(kvt_cache_launch(c, p.task, pages, 16));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(c, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    kvt_cache_destroy(c);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

/* ---- on a device ---- */

typedef int (*stream_wait_fn)(void *stream, void *event, unsigned flags);

/* Device copies of an emu's buffers. */
typedef struct dev_mem {
    kvt_engine_memory host, dev;
    void *bufs[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint64_t bytes[KVT_MAX_LAYERS * KVT_MAX_COMPONENTS];
    uint32_t n;
} dev_mem;

#define CU_OK(call)                                                                  \
    do {                                                                             \
        kvt_cuerr e_ = (call);                                                       \
        if (e_) fail_msg("%s: %s", #call, g_api->GetErrorString(e_));                \
    } while (0)

static void dev_alloc(dev_mem *d, kvt_emu *emu)
{
    memset(d, 0, sizeof *d);
    assert_ok(kvt_emu_memory(emu, &d->host));
    d->dev = d->host;
    d->dev.kind = KVT_MEMORY_CUDA;
    d->dev.device = 0;
    if (d->host.base) {
        d->n = 1;
        d->bytes[0] = d->host.buffer_bytes[0];
        CU_OK(g_api->Malloc(&d->bufs[0], d->bytes[0]));
        d->dev.base = d->bufs[0];
    } else {
        d->n = KVT_MAX_LAYERS * KVT_MAX_COMPONENTS;
        for (uint32_t u = 0; u < d->n; u++) {
            if (!d->host.layer_bases[u]) continue;
            d->bytes[u] = d->host.buffer_bytes[u];
            CU_OK(g_api->Malloc(&d->bufs[u], d->bytes[u]));
        }
        d->dev.layer_bases = d->bufs;
    }
    d->dev.buffer_bytes = d->bytes;
}

static void *host_buf(const dev_mem *d, uint32_t u)
{
    return d->host.base ? d->host.base : d->host.layer_bases[u];
}

static void dev_copy(dev_mem *d, int to_device)
{
    for (uint32_t u = 0; u < d->n; u++) {
        if (!d->bufs[u]) continue;
        if (to_device)
            CU_OK(g_api->Memcpy(d->bufs[u], host_buf(d, u), d->bytes[u], KVT_CU_MEMCPY_H2D));
        else
            CU_OK(g_api->Memcpy(host_buf(d, u), d->bufs[u], d->bytes[u], KVT_CU_MEMCPY_D2H));
    }
}

static void dev_poison(dev_mem *d)
{
    for (uint32_t u = 0; u < d->n; u++)
        if (d->bufs[u]) CU_OK(g_api->Memset(d->bufs[u], 0xEE, d->bytes[u]));
}

static void dev_free(dev_mem *d)
{
    for (uint32_t u = 0; u < d->n; u++)
        if (d->bufs[u]) g_api->Free(d->bufs[u]);
}

/* Store from device pages, poison them, load back layer by layer: the
 * engine stream waits on each layer's event and then copies that layer out
 * (the bytes it sees were loaded), kvt_cache_wait_layer agrees, and every
 * byte is verified. */
static void device_roundtrip(kvt_layout layout, const char *mode)
{
    printf("device roundtrip: %s, copy mode %s\n",
           layout == KVT_LAYOUT_PAGE_FIRST ? "page-first" : "layer-first", mode);
    setenv("KVTIER_CUDA_COPY", mode, 1);
    const uint32_t L = 8, TPP = 16, NP = 64;
    kvt_geometry *g = kvt_test_geometry(L, 4, 64, TPP, layout);
    kvt_config *cfg;
    kvt_cache *c = new_cache(g, &cfg);
    kvt_emu *emu;
    assert_ok(kvt_emu_create(&emu, g, NP));
    dev_mem d;
    dev_alloc(&d, emu);
    assert_ok(kvt_cache_register_memory(c, &d.dev));

    uint32_t ntok = 40 * TPP + 1, np = 41, store_pages[64], load_pages[64];
    for (uint32_t i = 0; i < np; i++) {
        store_pages[i] = (i * 5) % NP; /* scattered pages */
        load_pages[i] = (i * 3 + 7) % NP;
    }
    uint32_t tokens[41 * 16];
    kvt_test_tokens(tokens, ntok, 77);
    kvt_request r = {.tokens = tokens, .num_tokens = ntok};
    assert_ok(kvt_emu_fill(emu, &r, 0, ntok - 1, store_pages, np));
    dev_copy(&d, 1);
    kvt_store_plan p;
    assert_ok(kvt_cache_prepare_store(c, &r, &p));
    assert_int_equal(p.num_tokens, 40 * TPP);
    assert_ok(kvt_cache_launch(c, p.task, store_pages, np));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(c, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);

    dev_poison(&d);
    assert_ok(kvt_emu_poison(emu, load_pages, np));
    kvt_match m;
    assert_ok(kvt_cache_lookup(c, &r, &m));
    assert_int_equal(m.matched_tokens, 40 * TPP);
    assert_ok(kvt_cache_launch(c, m.task, load_pages, np));

    void *h = dlopen(g_api->cudart_path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    stream_wait_fn wait_event = (stream_wait_fn)dlsym(h, "cudaStreamWaitEvent");
    assert_non_null(wait_event);
    void *engine_stream;
    CU_OK(g_api->StreamCreateWithFlags(&engine_stream, KVT_CU_STREAM_NON_BLOCKING));
    for (uint32_t l = 0; l < L; l++) {
        if (l % 2) { /* odd layers: kvtier makes the stream wait */
            assert_ok(kvt_cache_stream_wait_layer(c, m.task, l, engine_stream, WAIT_MS));
        } else {     /* even layers: the engine waits on the event itself */
            void *ev = NULL;
            assert_ok(kvt_cache_layer_event(c, m.task, l, WAIT_MS, &ev));
            assert_non_null(ev);
            CU_OK(wait_event(engine_stream, ev, 0));
        }
        /* Layer l's buffers (layer-first) are copied out behind the event. */
        if (layout == KVT_LAYOUT_LAYER_FIRST)
            for (uint32_t k = 0; k < 2; k++) {
                uint32_t u = l * KVT_MAX_COMPONENTS + k;
                CU_OK(g_api->MemcpyAsync(host_buf(&d, u), d.bufs[u], d.bytes[u],
                                         KVT_CU_MEMCPY_D2H, engine_stream));
            }
    }
    CU_OK(g_api->StreamSynchronize(engine_stream));
    if (layout == KVT_LAYOUT_LAYER_FIRST) {
        /* Verified before kvt_cache_wait: only the events ordered the copies. */
        kvt_verify_result v;
        assert_ok(kvt_emu_verify(emu, &r, 0, m.matched_tokens, load_pages, np, &v));
        assert_int_equal(v.mismatches, 0);
    }
    for (uint32_t l = 0; l < L; l++) assert_ok(kvt_cache_wait_layer(c, m.task, l, WAIT_MS));
    assert_ok(kvt_cache_wait(c, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    dev_copy(&d, 0);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(emu, &r, 0, m.matched_tokens, load_pages, np, &v));
    assert_int_equal(v.mismatches, 0);
    assert_true(v.bytes_checked > 0);
    printf("  verified %llu bytes\n", (unsigned long long)v.bytes_checked);
    g_api->StreamDestroy(engine_stream);
    kvt_cache_destroy(c);
    dev_free(&d);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    unsetenv("KVTIER_CUDA_COPY");
}

/* Strided device memory (a token-major pool of every layer, as SGLang's
 * page_first pool would be on a GPU; kvt_engine_memory page_strides /
 * token_strides): store from it, poison it, load into other pages, then
 * check every byte of the pool: the loaded tokens against the emulator's
 * KV, every other byte unchanged. A page's tokens are one chunk each. */
static void device_strided_roundtrip(const char *mode)
{
    printf("device strided roundtrip: copy mode %s\n", mode);
    setenv("KVTIER_CUDA_COPY", mode, 1);
    enum { L = 4, TPP = 16, NP = 24, TB = 4 * 64 * 2, UNITS = L * 2, BPT = UNITS * TB };
    const size_t bytes = (size_t)NP * TPP * BPT;
    kvt_geometry *g = kvt_test_geometry(L, 4, 64, TPP, KVT_LAYOUT_LAYER_FIRST);
    kvt_config *cfg;
    kvt_cache *c = new_cache(g, &cfg);
    kvt_emu *emu; /* the reference KV only */
    assert_ok(kvt_emu_create(&emu, g, 1));
    uint8_t *want = malloc(bytes), *got = malloc(bytes);
    assert_true(want && got);
    void *dev = NULL, *bases[UNITS];
    uint64_t ps[UNITS], ts[UNITS], sizes[UNITS];
    CU_OK(g_api->Malloc(&dev, bytes));
    for (uint32_t u = 0; u < UNITS; u++) {
        bases[u] = (uint8_t *)dev + u * TB;
        ps[u] = (uint64_t)TPP * BPT;
        ts[u] = BPT;
        sizes[u] = bytes - u * TB;
    }
    kvt_engine_memory mem = {.num_pages = NP, .layer_bases = bases, .buffer_bytes = sizes,
                             .kind = KVT_MEMORY_CUDA, .device = 0, .page_strides = ps,
                             .token_strides = ts};
    assert_ok(kvt_cache_register_memory(c, &mem));

    uint32_t tokens[8 * TPP + 1], src[8], dst[8];
    kvt_test_tokens(tokens, 8 * TPP + 1, 31);
    kvt_request r = {.tokens = tokens, .num_tokens = 8 * TPP + 1};
    for (uint32_t i = 0; i < 8; i++) {
        src[i] = i * 3 % NP;
        dst[i] = NP - 1 - 2 * i;
    }
    /* token t of page p, unit u: p * TPP * BPT + t * BPT + u * TB */
    memset(want, 0x5A, bytes);
    for (uint32_t i = 0; i < 8 * TPP; i++)
        for (uint32_t u = 0; u < UNITS; u++)
            assert_ok(kvt_emu_token_kv(emu, &r, i, u / 2, u % 2,
                                       want + ((size_t)src[i / TPP] * TPP + i % TPP) * BPT + u * TB, TB));
    CU_OK(g_api->Memcpy(dev, want, bytes, KVT_CU_MEMCPY_H2D));
    kvt_store_plan p;
    kvt_task_result res;
    assert_ok(kvt_cache_prepare_store(c, &r, &p));
    assert_int_equal(p.num_tokens, 8 * TPP);
    assert_ok(kvt_cache_launch(c, p.task, src, 8));
    assert_ok(kvt_cache_wait(c, p.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);

    memset(want, 0x5A, bytes);
    CU_OK(g_api->Memset(dev, 0x5A, bytes));
    for (uint32_t i = 0; i < 8 * TPP; i++)
        for (uint32_t u = 0; u < UNITS; u++)
            assert_ok(kvt_emu_token_kv(emu, &r, i, u / 2, u % 2,
                                       want + ((size_t)dst[i / TPP] * TPP + i % TPP) * BPT + u * TB, TB));
    kvt_match m;
    assert_ok(kvt_cache_lookup(c, &r, &m));
    assert_int_equal(m.matched_tokens, 8 * TPP);
    assert_ok(kvt_cache_launch(c, m.task, dst, 8));
    assert_ok(kvt_cache_wait(c, m.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    CU_OK(g_api->Memcpy(got, dev, bytes, KVT_CU_MEMCPY_D2H));
    for (size_t i = 0; i < bytes; i++)
        if (got[i] != want[i])
            fail_msg("pool byte %zu (page %zu) is 0x%02x, want 0x%02x", i, i / (TPP * BPT), got[i],
                     want[i]);
    printf("  verified %zu bytes\n", bytes);
    kvt_cache_destroy(c);
    g_api->Free(dev);
    free(want);
    free(got);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
    unsetenv("KVTIER_CUDA_COPY");
}

static void device_roundtrip_all_modes(void **state)
{
    (void)state;
    if (skip_no_device()) {
        skip();
        return;
    }
    device_roundtrip(KVT_LAYOUT_LAYER_FIRST, "auto");
    device_roundtrip(KVT_LAYOUT_PAGE_FIRST, "auto");
    device_roundtrip(KVT_LAYOUT_LAYER_FIRST, "memcpy");
    device_strided_roundtrip("auto");
    device_strided_roundtrip("memcpy");
    if (g_api->MemcpyBatchAsync) {
        device_roundtrip(KVT_LAYOUT_LAYER_FIRST, "batch");
        device_strided_roundtrip("batch");
    } else
        printf("batch mode: skipped (runtime %d has no cudaMemcpyBatchAsync)\n",
               g_api->runtime_version);
    if (getenv("KVTIER_TEST_FAKE_CUDA")) {
        printf("kernel mode: skipped (the fake runtime has no driver API)\n");
    } else if (kvt__cuda_fatbin_len && g_api->cuModuleLoadData) {
        device_roundtrip(KVT_LAYOUT_LAYER_FIRST, "kernel");
        device_roundtrip(KVT_LAYOUT_PAGE_FIRST, "kernel");
        device_strided_roundtrip("kernel");
    } else {
        printf("kernel mode: skipped (%s)\n",
               kvt__cuda_fatbin_len ? g_api->driver_error : "built without nvcc");
    }
}

/* A device cache and a host cache in one process, interleaved. */
static void device_and_host_mixed(void **state)
{
    (void)state;
    if (skip_no_device()) {
        skip();
        return;
    }
    kvt_geometry *g = kvt_test_geometry(4, 2, 32, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_config *cfg1, *cfg2;
    kvt_cache *cd = new_cache(g, &cfg1), *ch = new_cache(g, &cfg2);
    kvt_emu *ed, *eh;
    assert_ok(kvt_emu_create(&ed, g, 32));
    assert_ok(kvt_emu_create(&eh, g, 32));
    dev_mem d;
    dev_alloc(&d, ed);
    assert_ok(kvt_cache_register_memory(cd, &d.dev));
    kvt_engine_memory hm;
    assert_ok(kvt_emu_memory(eh, &hm));
    assert_ok(kvt_cache_register_memory(ch, &hm));
    uint32_t tokens[16 * 16 + 1], pages[17], lpages[17];
    kvt_test_tokens(tokens, 16 * 16 + 1, 5);
    for (uint32_t i = 0; i < 17; i++) {
        pages[i] = i;
        lpages[i] = 31 - i;
    }
    kvt_request r = {.tokens = tokens, .num_tokens = 16 * 16 + 1};
    assert_ok(kvt_emu_fill(ed, &r, 0, 256, pages, 17));
    assert_ok(kvt_emu_fill(eh, &r, 0, 256, pages, 17));
    dev_copy(&d, 1);
    kvt_store_plan pd, ph;
    assert_ok(kvt_cache_prepare_store(cd, &r, &pd));
    assert_ok(kvt_cache_prepare_store(ch, &r, &ph));
    assert_ok(kvt_cache_launch(cd, pd.task, pages, 17));
    assert_ok(kvt_cache_launch(ch, ph.task, pages, 17));
    kvt_task_result res;
    assert_ok(kvt_cache_wait(cd, pd.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_ok(kvt_cache_wait(ch, ph.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    dev_poison(&d);
    assert_ok(kvt_emu_poison(ed, lpages, 17));
    assert_ok(kvt_emu_poison(eh, lpages, 17));
    kvt_match md, mh;
    assert_ok(kvt_cache_lookup(cd, &r, &md));
    assert_ok(kvt_cache_lookup(ch, &r, &mh));
    assert_ok(kvt_cache_launch(cd, md.task, lpages, 17));
    assert_ok(kvt_cache_launch(ch, mh.task, lpages, 17));
    assert_ok(kvt_cache_wait(cd, md.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    assert_ok(kvt_cache_wait(ch, mh.task, WAIT_MS, &res));
    assert_int_equal(res.status, KVT_OK);
    dev_copy(&d, 0);
    kvt_verify_result v;
    assert_ok(kvt_emu_verify(ed, &r, 0, md.matched_tokens, lpages, 17, &v));
    assert_int_equal(v.mismatches, 0);
    assert_ok(kvt_emu_verify(eh, &r, 0, mh.matched_tokens, lpages, 17, &v));
    assert_int_equal(v.mismatches, 0);
    kvt_cache_destroy(cd);
    kvt_cache_destroy(ch);
    dev_free(&d);
    kvt_emu_destroy(ed);
    kvt_emu_destroy(eh);
    kvt_config_destroy(cfg1);
    kvt_config_destroy(cfg2);
    kvt_geometry_destroy(g);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--child-no-runtime")) return child_no_runtime();
    static char why[1024];
    kvt_status st = kvt__cuda_check_device("CUDA", 0, &g_api);
    if (st) {
        snprintf(why, sizeof why, "%s", kvt_last_error());
        g_no_device = why;
        printf("skipped: no CUDA device (%s): the device tests below are skipped; the "
               "refusals are checked\n", why);
    } else {
        int n = 0;
        g_api->GetDeviceCount(&n);
        printf("CUDA%s: runtime %d from %s, %d device(s), cudaMemcpyBatchAsync %s, kernel %s\n",
               getenv("KVTIER_TEST_FAKE_CUDA") ? " (FAKE runtime over host memory: kvtier's "
                                                 "plumbing only, not a GPU test)" : "",
               g_api->runtime_version, g_api->cudart_path, n,
               g_api->MemcpyBatchAsync ? "yes" : "no",
               kvt__cuda_fatbin_len ? "embedded" : "not built");
    }
    fflush(stdout);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(refuse_without_runtime),
        cmocka_unit_test(refuse_without_device),
        cmocka_unit_test(device_roundtrip_all_modes),
        cmocka_unit_test(device_and_host_mixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

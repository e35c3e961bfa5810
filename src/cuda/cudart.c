/* cudart.c - loading the CUDA runtime and driver at run time (cudart.h). */
#include "cuda/cudart.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

static kvt_cuda_api g_api;
static const kvt_cuda_api *g_ok;
static char g_why[768];
static char g_driver_why[384];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Tried in order; KVTIER_CUDART (a path or a soname) first when set. */
static const char *const cudart_names[] = {
    "libcudart.so.13", "libcudart.so.12", "libcudart.so",
    "/usr/local/cuda/lib64/libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.12",
};

#define SYM(h, field, name)                                        \
    do {                                                           \
        *(void **)(&g_api.field) = dlsym(h, name);                 \
        if (!g_api.field) {                                        \
            snprintf(g_why, sizeof g_why, "%s lacks %s", path, name); \
            return;                                                \
        }                                                          \
    } while (0)

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(g_driver_why, sizeof g_driver_why, "libcuda.so.1: %s", e ? e : "not found");
        g_api.driver_error = g_driver_why;
        return;
    }
    *(void **)&g_api.cuModuleLoadData = dlsym(h, "cuModuleLoadData");
    *(void **)&g_api.cuModuleGetFunction = dlsym(h, "cuModuleGetFunction");
    *(void **)&g_api.cuLaunchKernel = dlsym(h, "cuLaunchKernel");
    *(void **)&g_api.cuGetErrorString = dlsym(h, "cuGetErrorString");
    if (!g_api.cuModuleLoadData || !g_api.cuModuleGetFunction || !g_api.cuLaunchKernel) {
        g_api.cuModuleLoadData = NULL;
        g_api.cuModuleGetFunction = NULL;
        g_api.cuLaunchKernel = NULL;
        snprintf(g_driver_why, sizeof g_driver_why,
                 "libcuda.so.1 lacks cuModuleLoadData/cuModuleGetFunction/cuLaunchKernel");
        g_api.driver_error = g_driver_why;
    }
}

static void load_once(void)
{
    const char *env = getenv("KVTIER_CUDART");
    const char *names[8];
    size_t n = 0;
    if (env && *env) /* exclusive: a test or a deployment names the one file */
        names[n++] = env;
    else
        for (size_t i = 0; i < sizeof cudart_names / sizeof *cudart_names; i++)
            names[n++] = cudart_names[i];
    void *h = NULL;
    const char *path = NULL;
    char last[384] = "";
    for (size_t i = 0; i < n && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            path = names[i];
        } else {
            const char *e = dlerror();
            snprintf(last, sizeof last, "%s", e ? e : names[i]);
        }
    }
    if (!h) {
        if (env && *env)
            snprintf(g_why, sizeof g_why, "the CUDA runtime could not be loaded from "
                     "KVTIER_CUDART=%s (%s)", env, last);
        else
            snprintf(g_why, sizeof g_why,
                     "the CUDA runtime could not be loaded (tried libcudart.so.13, "
                     "libcudart.so.12, libcudart.so and /usr/local/cuda/lib64; last error: %s)",
                     last);
        return;
    }
    g_api.cudart_path = path;
    SYM(h, GetErrorString, "cudaGetErrorString");
    SYM(h, RuntimeGetVersion, "cudaRuntimeGetVersion");
    SYM(h, DriverGetVersion, "cudaDriverGetVersion");
    SYM(h, GetDeviceCount, "cudaGetDeviceCount");
    SYM(h, SetDevice, "cudaSetDevice");
    SYM(h, GetDevice, "cudaGetDevice");
    SYM(h, Free, "cudaFree");
    SYM(h, Malloc, "cudaMalloc");
    SYM(h, Memcpy, "cudaMemcpy");
    SYM(h, Memset, "cudaMemset");
    SYM(h, MemcpyAsync, "cudaMemcpyAsync");
    SYM(h, StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    SYM(h, StreamDestroy, "cudaStreamDestroy");
    SYM(h, StreamSynchronize, "cudaStreamSynchronize");
    SYM(h, EventCreateWithFlags, "cudaEventCreateWithFlags");
    SYM(h, EventDestroy, "cudaEventDestroy");
    SYM(h, EventRecord, "cudaEventRecord");
    SYM(h, EventQuery, "cudaEventQuery");
    SYM(h, EventSynchronize, "cudaEventSynchronize");
    SYM(h, StreamWaitEvent, "cudaStreamWaitEvent");
    SYM(h, HostRegister, "cudaHostRegister");
    SYM(h, HostUnregister, "cudaHostUnregister");
    SYM(h, HostAlloc, "cudaHostAlloc");
    SYM(h, FreeHost, "cudaFreeHost");
    SYM(h, HostGetDevicePointer, "cudaHostGetDevicePointer");
    SYM(h, PointerGetAttributes, "cudaPointerGetAttributes");
    g_api.MemcpyBatchAsync = dlsym(h, "cudaMemcpyBatchAsync");
    if (g_api.RuntimeGetVersion(&g_api.runtime_version) != 0) g_api.runtime_version = 0;
    if (g_api.runtime_version < 12080) g_api.MemcpyBatchAsync = NULL;
    load_driver();
    g_ok = &g_api;
}

const kvt_cuda_api *kvt__cuda_load(const char **why)
{
    pthread_once(&g_once, load_once);
    if (!g_ok && why) *why = g_why;
    return g_ok;
}

const char *kvt__cuda_errstr(const kvt_cuda_api *api, kvt_cuerr e)
{
    static _Thread_local char buf[32];
    if (api && api->GetErrorString) {
        const char *s = api->GetErrorString(e);
        if (s) return s;
    }
    snprintf(buf, sizeof buf, "CUDA error %d", e);
    return buf;
}

kvt_status kvt__cuda_check_device(const char *fn, int device, const kvt_cuda_api **out)
{
    const char *why = NULL;
    const kvt_cuda_api *api = kvt__cuda_load(&why);
    if (!api)
        return kvt__fail(KVT_EUNSUPPORTED, "%s: CUDA device memory needs the CUDA runtime: %s",
                         fn, why);
    int rv = api->runtime_version, dv = 0;
    api->DriverGetVersion(&dv);
    int count = 0;
    kvt_cuerr e = api->GetDeviceCount(&count);
    if (e != 0 || count == 0)
        return kvt__fail(KVT_EUNSUPPORTED,
                         "%s: no usable CUDA device: cudaGetDeviceCount says %s (CUDA runtime "
                         "%d.%d from %s, driver %s)",
                         fn, e ? kvt__cuda_errstr(api, e) : "0 devices", rv / 1000,
                         (rv % 1000) / 10, api->cudart_path,
                         dv ? "present" : "absent (no libcuda.so.1 or no GPU)");
    if (device < 0 || device >= count)
        return kvt__fail(KVT_EINVAL, "%s: CUDA device %d does not exist (%d device%s visible)",
                         fn, device, count, count == 1 ? "" : "s");
    if (out) *out = api;
    return KVT_OK;
}

/* cudart.h - the CUDA runtime (and, for the copy kernel, the driver), loaded
 * at run time with dlopen: kvtier has no link-time CUDA dependency and
 * builds without CUDA headers. Only the functions kvtier calls are resolved;
 * the types below mirror the CUDA headers' (tests/unit/test_cuda_abi.c
 * checks them against the real headers when the toolkit is installed).
 *
 * kvt__cuda_load() is called once per process (thread-safe); the table it
 * fills stays valid until exit (the libraries are never closed). */
#ifndef KVT_CUDA_CUDART_H
#define KVT_CUDA_CUDART_H

#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

typedef int kvt_cuerr;       /* cudaError_t; 0 is cudaSuccess */
typedef void *kvt_custream;  /* cudaStream_t (== CUstream) */
typedef void *kvt_cuevent;   /* cudaEvent_t */
typedef void *kvt_cumodule;  /* CUmodule */
typedef void *kvt_cufunction;/* CUfunction */

enum {
    KVT_CU_MEMCPY_H2H = 0, KVT_CU_MEMCPY_H2D = 1, KVT_CU_MEMCPY_D2H = 2,
    KVT_CU_MEMCPY_D2D = 3, KVT_CU_MEMCPY_DEFAULT = 4, /* cudaMemcpyKind */
};
enum { KVT_CU_MEMTYPE_UNREGISTERED = 0, KVT_CU_MEMTYPE_HOST = 1, KVT_CU_MEMTYPE_DEVICE = 2,
       KVT_CU_MEMTYPE_MANAGED = 3 }; /* cudaMemoryType */
enum { KVT_CU_HOST_REGISTER_PORTABLE = 1, KVT_CU_HOST_REGISTER_MAPPED = 2 };
enum { KVT_CU_HOST_ALLOC_PORTABLE = 1, KVT_CU_HOST_ALLOC_MAPPED = 2 };
enum { KVT_CU_STREAM_NON_BLOCKING = 1 };
enum { KVT_CU_EVENT_DISABLE_TIMING = 2 };
enum { KVT_CU_ERROR_NOT_READY = 600 };
enum { KVT_CU_LOC_DEVICE = 1, KVT_CU_LOC_HOST = 2 };      /* cudaMemLocationType */
enum { KVT_CU_SRC_ORDER_STREAM = 1 };                     /* cudaMemcpySrcAccessOrder */

/* cudaPointerAttributes (CUDA >= 11); CUDA 13 appends reserved words, so
 * callers pass a kvt_cu_ptr_attr_buf, big enough for either. */
typedef struct kvt_cu_ptr_attr {
    int type;
    int device;
    void *device_pointer;
    void *host_pointer;
} kvt_cu_ptr_attr;
typedef union kvt_cu_ptr_attr_buf {
    kvt_cu_ptr_attr a;
    unsigned char pad[256];
} kvt_cu_ptr_attr_buf;

typedef struct kvt_cu_mem_location { /* cudaMemLocation */
    int type;
    int id;
} kvt_cu_mem_location;

typedef struct kvt_cu_memcpy_attr { /* cudaMemcpyAttributes (CUDA >= 12.8) */
    int src_access_order;
    kvt_cu_mem_location src_loc_hint;
    kvt_cu_mem_location dst_loc_hint;
    unsigned int flags;
} kvt_cu_memcpy_attr;

typedef struct kvt_cuda_api {
    /* Runtime. */
    const char *cudart_path;  /* the file that was loaded */
    int runtime_version;      /* cudaRuntimeGetVersion: 13000 is 13.0 */
    const char *(*GetErrorString)(kvt_cuerr);
    kvt_cuerr (*RuntimeGetVersion)(int *);
    kvt_cuerr (*DriverGetVersion)(int *);
    kvt_cuerr (*GetDeviceCount)(int *);
    kvt_cuerr (*SetDevice)(int);
    kvt_cuerr (*GetDevice)(int *);
    kvt_cuerr (*Free)(void *);
    kvt_cuerr (*Malloc)(void **, size_t);
    kvt_cuerr (*Memcpy)(void *, const void *, size_t, int);
    kvt_cuerr (*Memset)(void *, int, size_t);
    kvt_cuerr (*MemcpyAsync)(void *, const void *, size_t, int, kvt_custream);
    kvt_cuerr (*StreamCreateWithFlags)(kvt_custream *, unsigned);
    kvt_cuerr (*StreamDestroy)(kvt_custream);
    kvt_cuerr (*StreamSynchronize)(kvt_custream);
    kvt_cuerr (*EventCreateWithFlags)(kvt_cuevent *, unsigned);
    kvt_cuerr (*EventDestroy)(kvt_cuevent);
    kvt_cuerr (*EventRecord)(kvt_cuevent, kvt_custream);
    kvt_cuerr (*EventQuery)(kvt_cuevent);
    kvt_cuerr (*EventSynchronize)(kvt_cuevent);
    kvt_cuerr (*StreamWaitEvent)(kvt_custream, kvt_cuevent, unsigned);
    kvt_cuerr (*HostRegister)(void *, size_t, unsigned);
    kvt_cuerr (*HostUnregister)(void *);
    kvt_cuerr (*HostAlloc)(void **, size_t, unsigned);
    kvt_cuerr (*FreeHost)(void *);
    kvt_cuerr (*HostGetDevicePointer)(void **, void *, unsigned);
    kvt_cuerr (*PointerGetAttributes)(void *, const void *);
    /* Optional: NULL before CUDA 12.8. Two signatures: 12.8/12.9 take a
     * failIdx pointer before the stream, 13.x does not (memcpy_batch()
     * in copy_cuda.c picks by runtime_version). */
    void *MemcpyBatchAsync;

    /* Driver (optional: only the copy kernel needs it). NULL when
     * libcuda.so.1 could not be loaded. */
    const char *driver_error; /* why the driver part is missing, or NULL */
    int (*cuModuleLoadData)(kvt_cumodule *, const void *);
    int (*cuModuleGetFunction)(kvt_cufunction *, kvt_cumodule, const char *);
    int (*cuLaunchKernel)(kvt_cufunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, unsigned, kvt_custream, void **, void **);
    int (*cuGetErrorString)(int, const char **);
} kvt_cuda_api;

/* Loads the runtime once. On failure returns NULL and, when why is not
 * NULL, points it at a static message naming every file tried and the last
 * dlerror(). */
const kvt_cuda_api *kvt__cuda_load(const char **why);

/* cudaGetErrorString, or "CUDA error N" when the API is not loaded. */
const char *kvt__cuda_errstr(const kvt_cuda_api *api, kvt_cuerr e);

/* Checks that `device` is usable: the runtime loads, a driver and at least
 * device+1 devices exist. KVT_OK, or KVT_EUNSUPPORTED (no runtime, no
 * driver, no device) / KVT_EINVAL (ordinal out of range) with a message
 * starting with fn. */
kvt_status kvt__cuda_check_device(const char *fn, int device, const kvt_cuda_api **out);

/* The embedded gather/scatter kernel (a fatbin from src/cuda/kernels.cu),
 * or NULL/0 when the library was built without nvcc. */
extern const unsigned char kvt__cuda_fatbin[];
extern const size_t kvt__cuda_fatbin_len;

#endif

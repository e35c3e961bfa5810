/* cuda.h - the cuda copy backend of the transfer engine (copy_cuda.c).
 *
 * One backend per cache whose engine memory is CUDA device memory. It pins
 * host ranges (the CPU tier) with cudaHostRegister and moves each unit (one
 * layer, one direction) with one batched call on a stream owned by the
 * transfer worker:
 *   batch:  cudaMemcpyBatchAsync (CUDA >= 12.8) over the unit's chunks;
 *   kernel: the gather/scatter kernel of kernels.cu (embedded fatbin,
 *           launched through the driver API) over a descriptor array in
 *           pinned host memory; needs every host address pinned;
 *   memcpy: one cudaMemcpyAsync per chunk (the fallback).
 * KVTIER_CUDA_COPY=auto|batch|kernel|memcpy picks (auto: batch, else
 * kernel, else memcpy). The planning functions below are pure (no CUDA
 * call) so that every machine tests them. */
#ifndef KVT_CUDA_CUDA_H
#define KVT_CUDA_CUDA_H

#include "cuda/cudart.h"
#include "xfer/xfer.h"

typedef enum kvt_cuda_mode {
    KVT_CUDA_AUTO = 0,
    KVT_CUDA_BATCH = 1,
    KVT_CUDA_KERNEL = 2,
    KVT_CUDA_MEMCPY = 3,
} kvt_cuda_mode;

const char *kvt__cuda_mode_name(kvt_cuda_mode m);
/* "auto", "batch", "kernel", "memcpy" (NULL or "" is auto); KVT_EINVAL otherwise. */
kvt_status kvt__cuda_mode_parse(const char *s, kvt_cuda_mode *out);

/* A pinned host range and its device-side address (cudaHostGetDevicePointer). */
typedef struct kvt_cuda_range {
    uint8_t *host;
    uint8_t *dev;
    uint64_t len;
} kvt_cuda_range;

/* A copy for the kernel: device-visible addresses. Mirrors kernels.cu. */
typedef struct kvt_cuda_desc {
    uint64_t dst, src, len;
} kvt_cuda_desc;

#define KVT_CUDA_SLICE_BYTES (64u * 1024u) /* bytes per thread block per slice */
#define KVT_CUDA_MAX_SLICES 64u

/* Batch planning: the arrays of one cudaMemcpyBatchAsync call for n chunks
 * of direction dir (KVT_XFER_GATHER: device -> host; SCATTER: host ->
 * device) and the one attribute they share (stream-ordered source access,
 * location hints for device `device` and the host). */
void kvt__cuda_plan_batch(const kvt_copy_chunk *chunks, uint32_t n, int dir, int device,
                          void **dsts, const void **srcs, size_t *sizes,
                          kvt_cu_memcpy_attr *attr);

/* Kernel planning: descriptors for n chunks, translating the host side of
 * each through the pinned ranges. *grid_y gets the slices per descriptor
 * (ceil(longest chunk / KVT_CUDA_SLICE_BYTES), at most KVT_CUDA_MAX_SLICES).
 * KVT_EINVAL when a host address is in no range (then the caller copies
 * those chunks another way). */
kvt_status kvt__cuda_plan_kernel(const kvt_copy_chunk *chunks, uint32_t n, int dir,
                                 const kvt_cuda_range *ranges, uint32_t nranges,
                                 kvt_cuda_desc *out, uint32_t *grid_y);

typedef struct kvt_cuda_backend kvt_cuda_backend;

/* Checks the device (kvt__cuda_check_device), initialises its primary
 * context, picks the mode (want, or KVTIER_CUDA_COPY when want is AUTO) and
 * loads the kernel when needed. Messages start with fn. */
kvt_status kvt__cuda_backend_create(kvt_cuda_backend **out, const char *fn, int device,
                                    kvt_cuda_mode want);
void kvt__cuda_backend_destroy(kvt_cuda_backend *b); /* unpins every range */
/* The ops table to hand the transfer engine (valid while b lives). */
const kvt_copy_ops *kvt__cuda_backend_ops(kvt_cuda_backend *b);
kvt_cuda_mode kvt__cuda_backend_mode(const kvt_cuda_backend *b);
const kvt_cuda_api *kvt__cuda_backend_api(const kvt_cuda_backend *b);
int kvt__cuda_backend_device(const kvt_cuda_backend *b);
/* Pins [p, p+len) (cudaHostRegister portable|mapped); at most 16 ranges. */
kvt_status kvt__cuda_backend_pin(kvt_cuda_backend *b, const char *fn, void *p, uint64_t len);
/* Unpins the range pinned at p (cudaHostUnregister), if any: before it is
 * unmapped. No copy may be using it. */
void kvt__cuda_backend_unpin(kvt_cuda_backend *b, void *p);
/* KVT_OK when [p, p+len) is device memory of the backend's device (or
 * managed memory); else KVT_EINVAL naming what (e.g. "layer_bases[3]"). */
kvt_status kvt__cuda_backend_check_ptr(kvt_cuda_backend *b, const char *fn, const char *what,
                                       const void *p);
/* cudaStreamWaitEvent(stream, event, 0); KVT_EIO naming the CUDA error. */
kvt_status kvt__cuda_backend_stream_wait(kvt_cuda_backend *b, const char *fn, void *stream,
                                         void *event);
/* Destroys events created by record() (cudaEventDestroy), n slots. */
void kvt__cuda_backend_free_events(kvt_cuda_backend *b, void **events, size_t n);

#endif

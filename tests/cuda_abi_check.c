/* cuda_abi_check.c - src/cuda/cudart.h mirrors a few CUDA types and
 * constants so that kvtier builds without CUDA headers. Where the toolkit's
 * headers are installed (CMake finds cuda_runtime_api.h), this test checks
 * the mirror against them at compile time; running it just says so. */
#include <stddef.h>
#include <stdio.h>
#include <cuda_runtime_api.h>
#include "cuda/cudart.h"

#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " != " #b)
SAME(KVT_CU_MEMCPY_H2D, cudaMemcpyHostToDevice);
SAME(KVT_CU_MEMCPY_D2H, cudaMemcpyDeviceToHost);
SAME(KVT_CU_MEMCPY_DEFAULT, cudaMemcpyDefault);
SAME(KVT_CU_MEMTYPE_HOST, cudaMemoryTypeHost);
SAME(KVT_CU_MEMTYPE_DEVICE, cudaMemoryTypeDevice);
SAME(KVT_CU_MEMTYPE_MANAGED, cudaMemoryTypeManaged);
SAME(KVT_CU_HOST_REGISTER_PORTABLE, cudaHostRegisterPortable);
SAME(KVT_CU_HOST_REGISTER_MAPPED, cudaHostRegisterMapped);
SAME(KVT_CU_HOST_ALLOC_PORTABLE, cudaHostAllocPortable);
SAME(KVT_CU_HOST_ALLOC_MAPPED, cudaHostAllocMapped);
SAME(KVT_CU_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
SAME(KVT_CU_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
SAME(KVT_CU_ERROR_NOT_READY, cudaErrorNotReady);
SAME(KVT_CU_LOC_DEVICE, cudaMemLocationTypeDevice);
SAME(KVT_CU_LOC_HOST, cudaMemLocationTypeHost);
SAME(KVT_CU_SRC_ORDER_STREAM, cudaMemcpySrcAccessOrderStream);
_Static_assert(sizeof(kvt_cu_memcpy_attr) == sizeof(struct cudaMemcpyAttributes), "attr size");
_Static_assert(offsetof(kvt_cu_memcpy_attr, src_loc_hint) ==
               offsetof(struct cudaMemcpyAttributes, srcLocHint), "srcLocHint");
_Static_assert(offsetof(kvt_cu_memcpy_attr, dst_loc_hint) ==
               offsetof(struct cudaMemcpyAttributes, dstLocHint), "dstLocHint");
_Static_assert(offsetof(kvt_cu_memcpy_attr, flags) == offsetof(struct cudaMemcpyAttributes, flags),
               "flags");
_Static_assert(sizeof(kvt_cu_mem_location) == sizeof(struct cudaMemLocation), "memloc");
_Static_assert(offsetof(kvt_cu_ptr_attr, device) == offsetof(struct cudaPointerAttributes, device),
               "device");
_Static_assert(offsetof(kvt_cu_ptr_attr, device_pointer) ==
               offsetof(struct cudaPointerAttributes, devicePointer), "devicePointer");
_Static_assert(sizeof(kvt_cu_ptr_attr_buf) >= sizeof(struct cudaPointerAttributes), "attr buf");
_Static_assert(sizeof(kvt_custream) == sizeof(cudaStream_t), "stream");
_Static_assert(sizeof(kvt_cuerr) == sizeof(cudaError_t), "error");

int main(void)
{
    printf("cudart.h mirrors CUDA %d's types and constants\n", CUDART_VERSION);
    return 0;
}

// kernels.cu - the gather/scatter copy kernel of the cuda copy backend.
//
// Built by CMake with nvcc into a fatbin (SASS for sm_80 and sm_90, PTX for
// compute_90) embedded in libkvtier as kvt__cuda_fatbin, loaded at run time
// with cuModuleLoadData and launched with cuLaunchKernel (copy_cuda.c).
// STATUS: compiled here; runs only on a GPU machine (scripts/gpu-check.sh).
//
// grid.x: one descriptor per block row; grid.y: slices of a descriptor, so a
// few long chunks still fill the device. Each slice copies 16 bytes per
// thread per step when the descriptor's addresses and length allow, else
// bytes. The host side of every descriptor is pinned, mapped memory.
#include <stdint.h>

struct kvt_cuda_desc {
    unsigned long long dst, src, len;
};

extern "C" __global__ void kvt_gather_scatter(const kvt_cuda_desc *descs, unsigned n)
{
    unsigned i = blockIdx.x;
    if (i >= n) return;
    kvt_cuda_desc d = descs[i];
    unsigned long long slices = gridDim.y;
    unsigned long long per = (d.len + slices - 1) / slices;
    per = (per + 15) & ~15ull;
    unsigned long long begin = per * blockIdx.y;
    if (begin >= d.len) return;
    unsigned long long end = begin + per < d.len ? begin + per : d.len;
    char *dst = (char *)d.dst;
    const char *src = (const char *)d.src;
    if (((d.dst | d.src | begin | end) & 15) == 0) {
        uint4 *dv = (uint4 *)(dst + begin);
        const uint4 *sv = (const uint4 *)(src + begin);
        unsigned long long nv = (end - begin) / 16;
        for (unsigned long long k = threadIdx.x; k < nv; k += blockDim.x) dv[k] = sv[k];
    } else {
        for (unsigned long long k = begin + threadIdx.x; k < end; k += blockDim.x) dst[k] = src[k];
    }
}

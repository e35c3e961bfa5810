/* bench_ucx_raw.h - UCX's own limit for the PD hand-off's job (see .c). */
#ifndef KVT_BENCH_UCX_RAW_H
#define KVT_BENCH_UCX_RAW_H

#include <stdint.h>

/* Buffers a raw stream moves, src[i] into dst[i] (len[i] bytes each). */
typedef struct raw_bufs {
    int n;
    uint8_t *src[2048], *dst[2048];
    uint64_t len[2048];
} raw_bufs;

/* GB/s of a raw UCX tag stream of b (UCX_TLS from the environment), or -1
 * with the reason on stderr. */
double kvt_bench_raw_ucx_gbps(const raw_bufs *b);

#endif

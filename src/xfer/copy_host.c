/* copy_host.c - the host memcpy backend of the transfer engine. */
#include <string.h>
#include "xfer/xfer.h"

static kvt_status host_copy(void *ctx, const kvt_copy_chunk *chunks, uint32_t n)
{
    (void)ctx;
    for (uint32_t i = 0; i < n; i++) memcpy(chunks[i].dst, chunks[i].src, chunks[i].len);
    return KVT_OK;
}

const kvt_copy_ops kvt__host_copy_ops = {.name = "host", .copy = host_copy, .ctx = NULL,
                                         .plain_memcpy = true};

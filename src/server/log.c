/* log.c - the server's log lines (through the library's logger, util/log.h)
 * and block checksums (server.h). */
#include <stdarg.h>
#include <stdio.h>

#include "layout/layout.h"
#include "server/server.h"
#include "util/hash.h"
#include "util/log.h"

void kvt__srv_log(kvt_log_level level, const char *fmt, ...)
{
    if (!kvt__log_on(level)) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    kvt__log(level, "server: %s", line);
}

uint64_t kvt__srv_sum_combine(const uint64_t *layer_sums, uint32_t num_layers, uint64_t offset)
{
    return kvt__hash64(layer_sums, (size_t)num_layers * sizeof *layer_sums, offset ^ 0x6b767473u);
}

uint64_t kvt__srv_block_sum(const uint8_t *block, const kvt_geometry *g, uint32_t block_tokens,
                            uint64_t offset)
{
    uint64_t sums[KVT_MAX_LAYERS];
    for (uint32_t l = 0; l < g->num_layers; l++) {
        const uint8_t *seg = block + kvt__geo_block_offset(g, block_tokens, l, 0);
        uint64_t len = (uint64_t)block_tokens * kvt__geo_layer_token_bytes(g, l);
        sums[l] = kvt__hash64(seg, (size_t)len, l);
    }
    return kvt__srv_sum_combine(sums, g->num_layers, offset);
}

/* log.c - the server's log lines (through the library's logger, util/log.h)
 * and block checksums (server.h). */
#include <stdarg.h>
#include <stdio.h>

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

uint64_t kvt__srv_block_sum(const void *block, uint64_t bytes, uint64_t offset)
{
    return kvt__hash64(block, (size_t)bytes, offset ^ 0x6b767473u);
}

/* log.c - the server's log lines and block checksums (server.h). */
#include <stdarg.h>
#include <stdio.h>

#include "server/server.h"
#include "util/hash.h"

void kvt__srv_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvtier serve: %s\n", line);
}

uint64_t kvt__srv_block_sum(const void *block, uint64_t bytes, uint64_t offset)
{
    return kvt__hash64(block, (size_t)bytes, offset ^ 0x6b767473u);
}

/* stream_ucx.c - placeholder replaced below */
#include "net/stream.h"
#include "util/err.h"

kvt_status kvt__stream_ucx_upgrade(kvt_stream **s, int server, uint64_t deadline_ns)
{
    (void)s; (void)server; (void)deadline_ns;
    return kvt__fail(KVT_EUNSUPPORTED, "stream: UCX transport not built");
}

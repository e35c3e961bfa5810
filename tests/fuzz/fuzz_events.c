/* fuzz_events.c - what the KV events publisher reads from outside
 * (src/events): a replay request's start-sequence frame from any peer on
 * the replay endpoint, and the endpoint options an operator writes. Beyond
 * "no crash, leak or UB": a frame decodes exactly when it is 8 bytes, to
 * its big-endian value; a refused endpoint has a message naming the
 * option, an accepted one is confined to this host. */
#include <stdint.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include "events/events.h"
#include "kvtier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t start = 0;
    kvt_status st = kvt__events_replay_decode(data, size, &start);
    if ((st == KVT_OK) != (size == 8)) abort();
    if (st == KVT_OK) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++) v = v << 8 | data[i];
        if (v != start) abort();
    }
    char ep[300];
    size_t n = size < sizeof ep - 1 ? size : sizeof ep - 1;
    memcpy(ep, data, n);
    ep[n] = '\0';
    bool here = kvt__events_endpoint_check(ep, "events_endpoint", false) == KVT_OK;
    if (here) {
        if (strncmp(ep, "ipc://", 6) && strncmp(ep, "tcp://127.0.0.1:", 16) &&
            strncmp(ep, "tcp://localhost:", 16) && strncmp(ep, "tcp://[::1]:", 12))
            abort();
    } else if (!strstr(kvt_last_error(), "events_endpoint")) {
        abort();
    }
    /* with a secret (or events_insecure): anything on this host still, and
     * only ipc:// or tcp://HOST:PORT besides */
    if (kvt__events_endpoint_check(ep, "events_endpoint", true) == KVT_OK) {
        if (strncmp(ep, "ipc://", 6) && strncmp(ep, "tcp://", 6)) abort();
    } else if (here || !strstr(kvt_last_error(), "events_endpoint")) {
        abort();
    }
    return 0;
}

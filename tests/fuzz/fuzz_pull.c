/* fuzz_pull.c - the cluster's peer pull frames (src/cluster/pull.h), which
 * a node decodes from any peer that passed the handshake: a FETCH, REPORT
 * or UCX header (a FETCH's or REPORT's request body is the node server's
 * request, fuzz_server_proto) and an ANSWER header. Beyond "no crash, leak
 * or UB": a decoded FETCH or REPORT asks for 1..KVT_PULL_MAX_BLOCKS blocks
 * whose range fits in 32 bits and a body of 1..KVT_PULL_MAX_REQ bytes, a
 * UCX request carries nothing but its op, and each re-encodes to the same
 * bytes; a decoded ANSWER never promises more blocks than were
 * asked, carries blocks only with KVT_OK and only of this node's size. A
 * refusal always has a message naming the sender. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/pull.h"
#include "util/le.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[KVT_PULL_REQ_HDR] = {0};
    memcpy(buf, data, size < sizeof buf ? size : sizeof buf);
    kvt_pull_fetch f;
    if (kvt__pull_fetch_decode(buf, "peer-x", &f) == KVT_OK) {
        if (f.op == KVT_PULL_UCX && (f.count || f.req_len || f.first || f.space)) abort();
        if (f.op != KVT_PULL_UCX && (f.count == 0 || f.count > KVT_PULL_MAX_BLOCKS)) abort();
        if (f.op != KVT_PULL_UCX && (f.req_len == 0 || f.req_len > KVT_PULL_MAX_REQ)) abort();
        if ((uint64_t)f.first + f.count > UINT32_MAX) abort();
        uint8_t again[KVT_PULL_REQ_HDR];
        kvt__pull_fetch_encode(again, &f);
        if (memcmp(again, buf, sizeof again)) abort();
    } else if (!strstr(kvt_last_error(), "peer-x")) {
        abort();
    }
    uint8_t rep[KVT_PULL_REP_HDR] = {0};
    memcpy(rep, data, size < sizeof rep ? size : sizeof rep);
    uint32_t asked = size >= 28 ? kvt__get32(data + 24) % (KVT_PULL_MAX_BLOCKS + 1) : 4;
    uint64_t bb = 4096;
    kvt_pull_answer a;
    if (kvt__pull_answer_decode(rep, asked, bb, "peer-y", &a) == KVT_OK) {
        if (a.n > asked) abort();
        if (a.n && (a.status != KVT_OK || a.block_bytes != bb)) abort();
    } else if (!strstr(kvt_last_error(), "peer-y")) {
        abort();
    }
    return 0;
}

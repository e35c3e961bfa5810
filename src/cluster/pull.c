/* pull.c - the peer pull protocol's frames (pull.h). */
#include "cluster/pull.h"

#include <string.h>

#include "util/hash.h"
#include "util/le.h"
#include "util/err.h"

void kvt__pull_fetch_encode(uint8_t out[KVT_PULL_REQ_HDR], const kvt_pull_fetch *f)
{
    kvt__put32(out, KVT_PULL_MAGIC);
    kvt__put16(out + 4, KVT_PULL_VERSION);
    kvt__put16(out + 6, f->op);
    kvt__put64(out + 8, f->space);
    kvt__put32(out + 16, f->first);
    kvt__put32(out + 20, f->count);
    kvt__put32(out + 24, f->req_len);
    kvt__put32(out + 28, 0);
}

kvt_status kvt__pull_fetch_decode(const uint8_t in[KVT_PULL_REQ_HDR], const char *from,
                                  kvt_pull_fetch *out)
{
    if (kvt__get32(in) != KVT_PULL_MAGIC)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s sent a FETCH with magic 0x%08x (not "
                         "a kvtier peer)", from, kvt__get32(in));
    if (kvt__get16(in + 4) != KVT_PULL_VERSION)
        return kvt__fail(KVT_EVERSION, "cluster pull: %s speaks version %u, this node %u",
                         from, kvt__get16(in + 4), KVT_PULL_VERSION);
    out->op = kvt__get16(in + 6);
    if (out->op != KVT_PULL_FETCH && out->op != KVT_PULL_REPORT && out->op != KVT_PULL_UCX)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s sent op %u (FETCH 1, REPORT 2 and UCX 3 "
                         "are known)", from, out->op);
    out->space = kvt__get64(in + 8);
    out->first = kvt__get32(in + 16);
    out->count = kvt__get32(in + 20);
    out->req_len = kvt__get32(in + 24);
    if (out->op == KVT_PULL_UCX) {
        if (out->space || out->first || out->count || out->req_len || kvt__get32(in + 28))
            return kvt__fail(KVT_EPROTO, "cluster pull: %s sent a UCX request with fields set "
                             "(all but op must be 0)", from);
        return KVT_OK;
    }
    if (out->count == 0 || out->count > KVT_PULL_MAX_BLOCKS)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s asked for %u blocks (1..%u)", from,
                         out->count, KVT_PULL_MAX_BLOCKS);
    if (out->first > UINT32_MAX - out->count)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s asked for blocks from %u, count %u: "
                         "past 2^32", from, out->first, out->count);
    if (out->req_len == 0 || out->req_len > KVT_PULL_MAX_REQ)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s sent a request of %u bytes (1..%u)",
                         from, out->req_len, KVT_PULL_MAX_REQ);
    if (kvt__get32(in + 28) != 0)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s set the reserved field of a FETCH",
                         from);
    return KVT_OK;
}

void kvt__pull_answer_encode(uint8_t out[KVT_PULL_REP_HDR], const kvt_pull_answer *a)
{
    kvt__put32(out, KVT_PULL_MAGIC);
    kvt__put32(out + 4, (uint32_t)a->status);
    kvt__put32(out + 8, a->n);
    kvt__put32(out + 12, 0);
    kvt__put64(out + 16, a->block_bytes);
}

kvt_status kvt__pull_answer_decode(const uint8_t in[KVT_PULL_REP_HDR], uint32_t count,
                                   uint64_t block_bytes, const char *from,
                                   kvt_pull_answer *out)
{
    if (kvt__get32(in) != KVT_PULL_MAGIC)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s answered with magic 0x%08x", from,
                         kvt__get32(in));
    out->status = (int32_t)kvt__get32(in + 4);
    out->n = kvt__get32(in + 8);
    out->block_bytes = kvt__get64(in + 16);
    if (out->status > 0 || out->status < KVT_EVERSION)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s answered status %d (not a kvtier "
                         "status)", from, out->status);
    if (out->status != KVT_OK && out->n != 0)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s answered %s with %u blocks", from,
                         kvt_status_name((kvt_status)out->status), out->n);
    if (out->n > count)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s answered %u blocks to a FETCH of %u",
                         from, out->n, count);
    if (out->n && out->block_bytes != block_bytes)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s sends blocks of %llu bytes, this node's "
                         "are %llu", from, (unsigned long long)out->block_bytes,
                         (unsigned long long)block_bytes);
    if (kvt__get32(in + 12) != 0)
        return kvt__fail(KVT_EPROTO, "cluster pull: %s set the reserved field of an answer",
                         from);
    return KVT_OK;
}

uint64_t kvt__pull_sum(const uint64_t *layer_sums, uint32_t num_layers, uint32_t idx)
{
    return kvt__hash64(layer_sums, (size_t)num_layers * sizeof *layer_sums,
                       0x6b76747075ull ^ idx);
}

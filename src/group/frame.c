/* frame.c - encoding and checking of frames and the handshake payloads.
 * Everything here parses bytes from the network: it never trusts a length,
 * never reads past len, and is the target of tests/fuzz/fuzz_frame.c. */
#include "group/frame.h"

#include <string.h>
#include "util/err.h"
#include "util/hash.h"

static uint64_t checksum(const uint8_t *hdr, const void *payload, uint32_t len)
{
    uint64_t h = kvt__hash64(hdr, 40, 0x6b7674677270ull);
    return kvt__hash64(payload ? payload : "", len, h);
}

void kvt__frame_encode(uint8_t hdr[KVT_FRAME_HDR], const kvt_frame *f, const void *payload)
{
    kvt__put32(hdr, KVT_FRAME_MAGIC);
    kvt__put16(hdr + 4, f->version);
    kvt__put16(hdr + 6, f->op);
    kvt__put64(hdr + 8, f->epoch);
    kvt__put64(hdr + 16, f->seq);
    kvt__put32(hdr + 24, f->channel);
    kvt__put32(hdr + 28, f->sender);
    kvt__put32(hdr + 32, f->receiver);
    kvt__put32(hdr + 36, f->len);
    kvt__put64(hdr + 40, checksum(hdr, payload, f->len));
}

static void parse_header(const uint8_t *b, kvt_frame *f)
{
    f->version = kvt__get16(b + 4);
    f->op = kvt__get16(b + 6);
    f->epoch = kvt__get64(b + 8);
    f->seq = kvt__get64(b + 16);
    f->channel = kvt__get32(b + 24);
    f->sender = kvt__get32(b + 28);
    f->receiver = kvt__get32(b + 32);
    f->len = kvt__get32(b + 36);
    f->checksum = kvt__get64(b + 40);
    f->payload = b + KVT_FRAME_HDR;
}

kvt_status kvt__frame_decode(const uint8_t *buf, size_t len, uint16_t version, kvt_frame *out)
{
    if (!buf || len < KVT_FRAME_HDR)
        return kvt__fail(KVT_EPROTO, "frame of %zu bytes is shorter than its %d-byte header",
                         len, KVT_FRAME_HDR);
    if (kvt__get32(buf) != KVT_FRAME_MAGIC)
        return kvt__fail(KVT_EPROTO, "frame magic 0x%08x is not \"KVTG\"", kvt__get32(buf));
    kvt_frame f;
    parse_header(buf, &f);
    if (f.version != version) {
        *out = f;
        return kvt__fail(KVT_EVERSION, "frame from rank %u speaks protocol version %u, this "
                         "rank %u", f.sender, f.version, version);
    }
    if ((uint64_t)f.len != len - KVT_FRAME_HDR)
        return kvt__fail(KVT_EPROTO, "frame from rank %u says %u payload bytes, carries %zu",
                         f.sender, f.len, len - KVT_FRAME_HDR);
    if (f.op == 0 || f.op >= KVT_OP_MAX || f.channel == 0 || f.channel >= KVT_CH_COUNT)
        return kvt__fail(KVT_EPROTO, "frame from rank %u has unknown op %u or channel %u",
                         f.sender, f.op, f.channel);
    if (checksum(buf, f.payload, f.len) != f.checksum)
        return kvt__fail(KVT_ECORRUPT, "frame from rank %u (channel %s seq %llu op %s) failed "
                         "its checksum", f.sender, kvt__channel_name(f.channel),
                         (unsigned long long)f.seq, kvt__op_name(f.op));
    *out = f;
    return KVT_OK;
}

const char *kvt__op_name(uint32_t op)
{
    static const char *n[] = {"?", "HELLO", "WELCOME", "REFUSE", "STEP_UP", "STEP_DOWN", "ABORT",
                             "STEP_ACK", "JOIN", "FORMED", "GIVEUP"};
    return op < KVT_OP_MAX ? n[op] : "UNKNOWN";
}

const char *kvt__channel_name(uint32_t ch)
{
    static const char *n[] = {"?", "handshake", "step", "control"};
    return ch < KVT_CH_COUNT ? n[ch] : "unknown";
}

void kvt__hello_encode(uint8_t out[KVT_HELLO_LEN], const kvt_hello *h)
{
    const uint32_t w[] = {h->lib_version, h->pp, h->cp, h->tp, h->rank,
                          h->pp_rank, h->cp_rank, h->tp_rank, h->role, 0};
    for (int i = 0; i < 10; i++) kvt__put32(out + 4 * i, w[i]);
    kvt__put64(out + 40, h->geometry_digest);
    kvt__put64(out + 48, h->config_digest);
    kvt__put64(out + 56, h->epoch);
    kvt__put64(out + 64, h->attempt);
}

kvt_status kvt__hello_decode(const uint8_t *p, size_t len, kvt_hello *out)
{
    if (!p || len != KVT_HELLO_LEN)
        return kvt__fail(KVT_EPROTO, "hello payload is %zu bytes, want %d", len, KVT_HELLO_LEN);
    uint32_t *w[] = {&out->lib_version, &out->pp, &out->cp, &out->tp, &out->rank,
                     &out->pp_rank, &out->cp_rank, &out->tp_rank, &out->role};
    for (int i = 0; i < 9; i++) *w[i] = kvt__get32(p + 4 * i);
    if (kvt__get32(p + 36) != 0)
        return kvt__fail(KVT_EPROTO, "hello reserved word is %u, want 0", kvt__get32(p + 36));
    out->geometry_digest = kvt__get64(p + 40);
    out->config_digest = kvt__get64(p + 48);
    out->epoch = kvt__get64(p + 56);
    out->attempt = kvt__get64(p + 64);
    return KVT_OK;
}

size_t kvt__note_encode(uint8_t *out, size_t cap, uint32_t word, const char *text)
{
    size_t n = text ? strlen(text) : 0;
    if (n > KVT_NOTE_TEXT_MAX) n = KVT_NOTE_TEXT_MAX;
    if (n + 4 > cap) n = cap - 4;
    kvt__put32(out, word);
    if (n) memcpy(out + 4, text, n);
    return n + 4;
}

kvt_status kvt__note_decode(const uint8_t *p, size_t len, uint32_t *word, char *text, size_t cap)
{
    if (!p || len < 4 || len > 4 + KVT_NOTE_TEXT_MAX)
        return kvt__fail(KVT_EPROTO, "note payload of %zu bytes is outside 4..%d", len,
                         4 + KVT_NOTE_TEXT_MAX);
    *word = kvt__get32(p);
    size_t n = len - 4;
    if (n >= cap) n = cap - 1;
    for (size_t i = 0; i < n; i++) {
        /* Printable ASCII only: the text ends up in logs and messages. */
        char c = (char)p[4 + i];
        text[i] = (c >= 32 && c < 127) ? c : '?';
    }
    text[n] = '\0';
    return KVT_OK;
}

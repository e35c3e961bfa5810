/* fuzz_frame.c - libFuzzer target for every decoder of group bytes from the
 * network: the frame header, the handshake HELLO, the REFUSE/ABORT note,
 * and the connector's step payloads. The first input byte picks the
 * decoder so one corpus covers all of them. A valid frame is re-encoded and
 * must decode to the same fields (round trip). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "connector/wire.h"
#include "group/frame.h"

static void roundtrip(const kvt_frame *f)
{
    uint8_t hdr[KVT_FRAME_HDR];
    kvt__frame_encode(hdr, f, f->payload);
    uint8_t *buf = malloc(KVT_FRAME_HDR + (size_t)f->len + 1);
    if (!buf) return;
    memcpy(buf, hdr, KVT_FRAME_HDR);
    memcpy(buf + KVT_FRAME_HDR, f->payload, f->len);
    kvt_frame g;
    if (kvt__frame_decode(buf, KVT_FRAME_HDR + f->len, f->version, &g) != KVT_OK ||
        g.seq != f->seq || g.epoch != f->epoch || g.op != f->op || g.len != f->len)
        abort();
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t which = data[0];
    data++;
    size--;
    kvt_frame f;
    kvt_hello h;
    uint32_t word;
    char text[64];
    switch (which % 4) {
    case 0:
        if (kvt__frame_decode(data, size, KVT_PROTO_VERSION, &f) == KVT_OK) roundtrip(&f);
        break;
    case 1:
        (void)kvt__hello_decode(data, size, &h);
        break;
    case 2:
        (void)kvt__note_decode(data, size, &word, text, sizeof text);
        break;
    default:
        kvt__wire_fuzz(data, size);
        break;
    }
    return 0;
}

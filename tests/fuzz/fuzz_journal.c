/* fuzz_journal.c - the SSD store's on-disk decoders on arbitrary bytes
 * (journal and metadata files are read back from disk, which may hold
 * anything after a crash or bit rot). The first byte picks the decoder:
 * even -> the rest is a journal image scanned against a fixed epoch and slot
 * count; odd -> the rest is a metadata file. Beyond "no crash, no UB" it
 * checks the contracts: records come in sequence order, each names a slot in
 * range, the journal ends after the last one and every whole record is
 * either good or bad; a metadata file that
 * decodes re-encodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "store/ssd_format.h"

#define EPOCH 0x0123456789abcdefull
#define SLOTS 64u

typedef struct seen_recs {
    uint32_t n;
    uint64_t next_seq; /* records come in order; a skipped one leaves a gap */
} seen_recs;

static void check_rec(void *arg, const kvt_ssd_rec *r)
{
    seen_recs *s = arg;
    if (r->slot >= SLOTS || r->seq < s->next_seq) abort();
    s->next_seq = r->seq + 1;
    s->n++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        kvt_ssd_scan sc;
        seen_recs seen = {0, 0};
        kvt__ssd_journal_scan(p, n, EPOCH, SLOTS, check_rec, &seen, &sc);
        if (seen.n != sc.good_records || sc.good_bytes > n || sc.good_bytes % KVT_SSD_REC_BYTES ||
            sc.torn != (sc.good_bytes < n) || sc.good_bytes != seen.next_seq * KVT_SSD_REC_BYTES ||
            sc.skipped_records > sc.bad_records ||
            (uint64_t)sc.good_records + sc.bad_records != n / KVT_SSD_REC_BYTES)
            abort();
        return 0;
    }
    kvt_ssd_meta m;
    if (kvt__ssd_meta_decode(p, n, &m) != KVT_OK) return 0;
    uint8_t again[KVT_SSD_META_BYTES];
    kvt__ssd_meta_encode(&m, again);
    kvt_ssd_meta m2;
    if (kvt__ssd_meta_decode(again, sizeof again, &m2) != KVT_OK) abort();
    if (m2.digest != m.digest || m2.slots != m.slots || strcmp(m2.describe, m.describe) != 0) abort();
    return 0;
}

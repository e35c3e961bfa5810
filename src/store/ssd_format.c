/* ssd_format.c - encode/decode of the SSD store's metadata and journal
 * records (see ssd_format.h). */
#include "store/ssd_format.h"

#include <string.h>
#include "util/err.h"

static const char META_MAGIC[8] = {'K', 'V', 'T', 'S', 'S', 'D', 'M', '1'};
#define META_CSUM_OFF (KVT_SSD_META_BYTES - 8)
#define REC_CSUM_OFF (KVT_SSD_REC_BYTES - 8)
#define META_SEED 0x6b767473736d6574ull /* "kvtssmet" */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint64_t kvt__ssd_block_csum(const void *data, uint64_t len, kvt_hash128 key)
{
    return kvt__hash64(data, (size_t)len, key.lo ^ (key.hi * 0x9e3779b97f4a7c15ull));
}

void kvt__ssd_meta_encode(const kvt_ssd_meta *m, uint8_t out[KVT_SSD_META_BYTES])
{
    memset(out, 0, KVT_SSD_META_BYTES);
    memcpy(out, META_MAGIC, sizeof META_MAGIC);
    put32(out + 8, m->version);
    put32(out + 12, m->dir_index);
    put32(out + 16, m->ndirs);
    put32(out + 20, m->slots);
    put64(out + 24, m->total_slots);
    put64(out + 32, m->digest);
    put64(out + 40, m->block_bytes);
    put64(out + 48, m->slot_bytes);
    put64(out + 56, m->epoch);
    size_t n = strnlen(m->describe, KVT_SSD_DESCRIBE_MAX - 1);
    memcpy(out + 64, m->describe, n);
    put64(out + META_CSUM_OFF, kvt__hash64(out, META_CSUM_OFF, META_SEED));
}

static kvt_status meta_check_fields(const kvt_ssd_meta *m)
{
    if (m->version != KVT_SSD_FORMAT_VERSION)
        return kvt__fail(KVT_ECORRUPT, "format version %u (this build reads %u)", m->version,
                         KVT_SSD_FORMAT_VERSION);
    if (m->ndirs == 0 || m->ndirs > KVT_SSD_MAX_DIRS || m->dir_index >= m->ndirs)
        return kvt__fail(KVT_ECORRUPT, "directory %u of %u is out of range", m->dir_index,
                         m->ndirs);
    if (m->block_bytes == 0 || m->block_bytes > KVT_SSD_MAX_BLOCK ||
        m->slot_bytes != (m->block_bytes + KVT_SSD_SLOT_ALIGN - 1) / KVT_SSD_SLOT_ALIGN *
                             KVT_SSD_SLOT_ALIGN)
        return kvt__fail(KVT_ECORRUPT, "block_bytes %llu / slot_bytes %llu are inconsistent",
                         (unsigned long long)m->block_bytes, (unsigned long long)m->slot_bytes);
    if (m->total_slots == 0 || m->total_slots > KVT_SSD_MAX_SLOTS ||
        m->slots != kvt__ssd_dir_slots(m->total_slots, m->ndirs, m->dir_index))
        return kvt__fail(KVT_ECORRUPT, "slots %u of total %llu are inconsistent", m->slots,
                         (unsigned long long)m->total_slots);
    return KVT_OK;
}

kvt_status kvt__ssd_meta_decode(const uint8_t *buf, size_t len, kvt_ssd_meta *out)
{
    if (len < KVT_SSD_META_BYTES)
        return kvt__fail(KVT_ECORRUPT, "metadata is %zu bytes, want %u", len, KVT_SSD_META_BYTES);
    if (memcmp(buf, META_MAGIC, sizeof META_MAGIC) != 0)
        return kvt__fail(KVT_ECORRUPT, "bad magic (not a kvtier cache directory)");
    if (get64(buf + META_CSUM_OFF) != kvt__hash64(buf, META_CSUM_OFF, META_SEED))
        return kvt__fail(KVT_ECORRUPT, "metadata checksum mismatch");
    kvt_ssd_meta m;
    memset(&m, 0, sizeof m);
    m.version = get32(buf + 8);
    m.dir_index = get32(buf + 12);
    m.ndirs = get32(buf + 16);
    m.slots = get32(buf + 20);
    m.total_slots = get64(buf + 24);
    m.digest = get64(buf + 32);
    m.block_bytes = get64(buf + 40);
    m.slot_bytes = get64(buf + 48);
    m.epoch = get64(buf + 56);
    if (memchr(buf + 64, '\0', KVT_SSD_DESCRIBE_MAX) == NULL)
        return kvt__fail(KVT_ECORRUPT, "describe string is not terminated");
    memcpy(m.describe, buf + 64, KVT_SSD_DESCRIBE_MAX);
    kvt_status st = meta_check_fields(&m);
    if (st != KVT_OK) return st;
    *out = m;
    return KVT_OK;
}

void kvt__ssd_rec_encode(const kvt_ssd_rec *r, uint64_t epoch, uint8_t out[KVT_SSD_REC_BYTES])
{
    put32(out, (uint32_t)r->type | ((uint32_t)r->has_parent << 16));
    put32(out + 4, r->slot);
    put64(out + 8, r->seq);
    put64(out + 16, r->key.lo);
    put64(out + 24, r->key.hi);
    put64(out + 32, r->parent.lo);
    put64(out + 40, r->parent.hi);
    put64(out + 48, r->csum);
    put64(out + REC_CSUM_OFF, kvt__hash64(out, REC_CSUM_OFF, epoch));
}

bool kvt__ssd_rec_decode(const uint8_t *in, uint64_t epoch, kvt_ssd_rec *out)
{
    if (get64(in + REC_CSUM_OFF) != kvt__hash64(in, REC_CSUM_OFF, epoch)) return false;
    uint32_t w = get32(in);
    kvt_ssd_rec r;
    r.type = (uint16_t)(w & 0xffff);
    r.has_parent = (uint16_t)(w >> 16);
    if ((r.type != KVT_SSD_REC_PUT && r.type != KVT_SSD_REC_DEL) || r.has_parent > 1) return false;
    r.slot = get32(in + 4);
    r.seq = get64(in + 8);
    r.key.lo = get64(in + 16);
    r.key.hi = get64(in + 24);
    r.parent.lo = get64(in + 32);
    r.parent.hi = get64(in + 40);
    r.csum = get64(in + 48);
    *out = r;
    return true;
}

static bool rec_valid_at(const uint8_t *p, uint64_t epoch, uint32_t slots, uint64_t seq,
                         kvt_ssd_rec *r)
{
    return kvt__ssd_rec_decode(p, epoch, r) && r->seq == seq && r->slot < slots;
}

void kvt__ssd_journal_scan(const uint8_t *buf, size_t len, uint64_t epoch, uint32_t slots,
                           kvt_ssd_rec_fn fn, void *arg, kvt_ssd_scan *out)
{
    kvt_ssd_scan sc;
    memset(&sc, 0, sizeof sc);
    size_t nrec = len / KVT_SSD_REC_BYTES, end = 0;
    kvt_ssd_rec r;
    /* Every record names its own position (seq), so one that fails does not
     * make the next ones doubtful: each valid record is applied in order and
     * a damaged one is skipped. The journal ends after the last valid record;
     * what follows is a torn tail. */
    for (size_t i = 0; i < nrec; i++) {
        if (!rec_valid_at(buf + i * KVT_SSD_REC_BYTES, epoch, slots, i, &r)) {
            sc.bad_records++;
            continue;
        }
        sc.skipped_records = sc.bad_records;
        sc.good_records++;
        end = i + 1;
        if (fn) fn(arg, &r);
    }
    sc.good_bytes = (uint64_t)end * KVT_SSD_REC_BYTES;
    sc.torn = sc.good_bytes < len;
    *out = sc;
}

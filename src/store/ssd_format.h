/* ssd_format.h - the SSD store's on-disk formats: the per-directory
 * metadata file and the journal records. Pure encode/decode functions over
 * byte buffers (no I/O), shared by the store, fsck and the fuzz target.
 * All integers are little-endian; every structure carries an XXH3 checksum,
 * so a decoder never trusts a byte it has not verified. */
#ifndef KVT_STORE_SSD_FORMAT_H
#define KVT_STORE_SSD_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"
#include "util/hash.h"

#define KVT_SSD_FORMAT_VERSION 1u
#define KVT_SSD_META_BYTES 512u
#define KVT_SSD_REC_BYTES 64u
#define KVT_SSD_DESCRIBE_MAX 256u   /* bytes including the NUL */
#define KVT_SSD_MAX_DIRS 64u
#define KVT_SSD_SLOT_ALIGN 4096ull  /* slot size and O_DIRECT buffer alignment */
#define KVT_SSD_MAX_SLOTS (1u << 31)
#define KVT_SSD_MAX_BLOCK (1ull << 30) /* one I/O per block: its length fits an int */

/* The metadata file of one directory ("kvtier.meta"). */
typedef struct kvt_ssd_meta {
    uint32_t version;
    uint32_t dir_index, ndirs;  /* this directory's place in the stripe set */
    uint32_t slots;             /* slots in this directory's data file */
    uint64_t total_slots;       /* over all directories */
    uint64_t digest, block_bytes, slot_bytes;
    uint64_t epoch;             /* random per creation: seeds journal checksums */
    char describe[KVT_SSD_DESCRIBE_MAX];
} kvt_ssd_meta;

/* Slots of directory d when total slots are striped over ndirs (slot g
 * lives in directory g % ndirs at local index g / ndirs). */
static inline uint32_t kvt__ssd_dir_slots(uint64_t total, uint32_t ndirs, uint32_t d)
{
    return (uint32_t)(total / ndirs + (d < total % ndirs ? 1 : 0));
}

void kvt__ssd_meta_encode(const kvt_ssd_meta *m, uint8_t out[KVT_SSD_META_BYTES]);
/* KVT_OK, or KVT_ECORRUPT with a message naming what is wrong (magic,
 * checksum, version, a field out of range). */
kvt_status kvt__ssd_meta_decode(const uint8_t *buf, size_t len, kvt_ssd_meta *out);

typedef enum kvt_ssd_rec_type { KVT_SSD_REC_PUT = 1, KVT_SSD_REC_DEL = 2 } kvt_ssd_rec_type;

/* One journal record. Record i of a journal file has seq == i, so a record
 * left over from an older file or a misplaced one never validates. */
typedef struct kvt_ssd_rec {
    uint16_t type;       /* kvt_ssd_rec_type */
    uint16_t has_parent; /* 0 or 1 */
    uint32_t slot;       /* local slot index in its directory */
    uint64_t seq;
    kvt_hash128 key, parent;
    uint64_t csum;       /* of the block's data (see kvt__ssd_block_csum) */
} kvt_ssd_rec;

void kvt__ssd_rec_encode(const kvt_ssd_rec *r, uint64_t epoch, uint8_t out[KVT_SSD_REC_BYTES]);
/* true when the record's checksum, type and flags are valid. */
bool kvt__ssd_rec_decode(const uint8_t *in, uint64_t epoch, kvt_ssd_rec *out);

typedef void (*kvt_ssd_rec_fn)(void *arg, const kvt_ssd_rec *r);
typedef struct kvt_ssd_scan {
    uint64_t good_bytes;      /* up to the end of the last valid record */
    uint32_t good_records;    /* valid records, applied */
    uint32_t bad_records;     /* whole records that fail validation, anywhere */
    uint32_t skipped_records; /* of those, the ones before the last valid record: damaged
                                 records skipped while the records after them were kept */
    bool torn;                /* anything after good_bytes (bad records or a partial one) */
} kvt_ssd_scan;
/* Walks a journal image: calls fn (may be NULL) for each valid record in
 * order, skipping any record that fails its checksum, is out of sequence
 * (record i must have seq i) or names a slot >= slots. A skipped record
 * loses at most the one block it described. Never reads past len. */
void kvt__ssd_journal_scan(const uint8_t *buf, size_t len, uint64_t epoch, uint32_t slots,
                           kvt_ssd_rec_fn fn, void *arg, kvt_ssd_scan *out);

/* The checksum a block carries: XXH3-64 of its data seeded with its key, so
 * the right bytes under the wrong key fail too. */
uint64_t kvt__ssd_block_csum(const void *data, uint64_t len, kvt_hash128 key);

#endif

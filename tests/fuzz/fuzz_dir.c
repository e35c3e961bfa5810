/* fuzz_dir.c - the cluster directory's decoders of what Redis hands back
 * (src/cluster/dir.h): a node's lease value "<epoch> <host:port>", a block
 * entry's value "<epoch> cpu|ssd" (or version 1's "<epoch>"), and a
 * node's holding "<blocks> <bytes> [<cpu_blocks> <ssd_blocks>]". Any client of the Redis may write those keys,
 * so their bytes are untrusted. Beyond "no crash, leak or UB" it checks
 * the contract: a failure is KVT_EPROTO with a message; a success has an
 * epoch below 2^63 written as 1..19 digits, an address that is exactly
 * the bytes after the first space and fits the buffer, and reads back the
 * same when printed again. The lease is also decoded into a buffer of
 * data[0] % 24 bytes, so the does-not-fit refusal is reached. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cluster/dir.h"

static void refused(kvt_status st)
{
    if (st != KVT_EPROTO || kvt_last_error()[0] == '\0') abort();
}

static void epoch_case(const char *s, size_t n)
{
    uint64_t e = UINT64_MAX;
    kvt_status st = kvt__dir_epoch_decode(s, n, &e);
    if (st != KVT_OK) {
        refused(st);
        return;
    }
    if (n == 0 || n > 19 || e >= (1ull << 63)) abort();
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') abort();
    char back[24];
    int k = snprintf(back, sizeof back, "%" PRIu64, e);
    size_t z = 0; /* leading zeros are the only difference allowed */
    while (z + 1 < n && s[z] == '0') z++;
    if ((size_t)k != n - z || memcmp(back, s + z, n - z) != 0) abort();
}

static void lease_case(const char *s, size_t n, size_t cap)
{
    uint64_t e = UINT64_MAX;
    char addr[KVT_DIR_ADDR_MAX + 8];
    memset(addr, 0x5a, sizeof addr);
    kvt_status st = kvt__dir_lease_decode(s, n, &e, cap ? addr : NULL, cap);
    if (st != KVT_OK) {
        refused(st);
        return;
    }
    const char *sp = memchr(s, ' ', n);
    if (!sp || e >= (1ull << 63)) abort();
    size_t an = n - (size_t)(sp + 1 - s);
    if (an == 0 || an >= cap || an >= KVT_DIR_ADDR_MAX || strlen(addr) != an || memcmp(addr, sp + 1, an) != 0)
        abort();
    if (cap < sizeof addr && (unsigned char)addr[cap] != 0x5a) abort(); /* nothing past the buffer */
    char again[96], addr2[KVT_DIR_ADDR_MAX];
    uint64_t e2;
    int k = snprintf(again, sizeof again, "%" PRIu64 " %s", e, addr);
    if (k <= 0 || (size_t)k >= sizeof again) abort();
    if (kvt__dir_lease_decode(again, (size_t)k, &e2, addr2, sizeof addr2) != KVT_OK || e2 != e ||
        strcmp(addr2, addr) != 0)
        abort();
}

/* A holding value decodes exactly when it is two (version 1) or four
 * (version 2: tiers set) epoch-like numbers one space apart, to those
 * numbers; and prints back to a value that decodes the same. */
static void holding_case(const char *s, size_t n)
{
    kvt_dir_holding h;
    memset(&h, 0x5a, sizeof h);
    kvt_status st = kvt__dir_holding_decode(s, n, &h);
    if (st != KVT_OK) {
        refused(st);
        return;
    }
    uint64_t v[4] = {h.blocks, h.bytes, h.cpu_blocks, h.ssd_blocks}, w;
    size_t k = 0, at = 0, want = h.tiers ? 4 : 2;
    for (; k < want; k++) {
        const char *sp = memchr(s + at, ' ', n - at);
        size_t fl = sp ? (size_t)(sp - (s + at)) : n - at;
        if ((k + 1 < want) != (sp != NULL)) abort(); /* exactly want - 1 spaces */
        if (kvt__dir_epoch_decode(s + at, fl, &w) || w != v[k] || w >= (1ull << 63)) abort();
        at += fl + 1;
    }
    if (!h.tiers && (h.cpu_blocks || h.ssd_blocks)) abort(); /* version 1: zero */
    char again[96];
    int m = h.tiers ? snprintf(again, sizeof again, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64,
                               v[0], v[1], v[2], v[3])
                    : snprintf(again, sizeof again, "%" PRIu64 " %" PRIu64, v[0], v[1]);
    kvt_dir_holding h2;
    if (m <= 0 || kvt__dir_holding_decode(again, (size_t)m, &h2) || h2.tiers != h.tiers ||
        h2.blocks != h.blocks || h2.bytes != h.bytes || h2.cpu_blocks != h.cpu_blocks ||
        h2.ssd_blocks != h.ssd_blocks)
        abort();
}

/* A block entry decodes exactly when it is an epoch, alone (tier unknown)
 * or followed by one space and "cpu" or "ssd". */
static void entry_case(const char *s, size_t n)
{
    uint64_t e = UINT64_MAX, e2;
    uint8_t t = 0xee;
    kvt_status st = kvt__dir_entry_decode(s, n, &e, &t);
    if (st != KVT_OK) {
        refused(st);
        return;
    }
    const char *sp = memchr(s, ' ', n);
    size_t en = sp ? (size_t)(sp - s) : n;
    if (kvt__dir_epoch_decode(s, en, &e2) || e2 != e) abort();
    if (!sp && t != KVT_DIR_TIER_UNKNOWN) abort();
    if (sp && !(n - en == 4 && ((t == KVT_DIR_TIER_CPU && !memcmp(sp + 1, "cpu", 3)) ||
                                (t == KVT_DIR_TIER_SSD && !memcmp(sp + 1, "ssd", 3)))))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    epoch_case(s, size);
    holding_case(s, size);
    entry_case(s, size);
    lease_case(s, size, KVT_DIR_ADDR_MAX);
    if (size > 0) lease_case(s + 1, size - 1, data[0] % 24);
    return 0;
}

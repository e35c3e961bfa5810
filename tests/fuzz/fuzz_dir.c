/* fuzz_dir.c - the cluster directory's decoders of what Redis hands back
 * (src/cluster/dir.h): a node's lease value "<epoch> <host:port>" and a
 * block entry's epoch field. Any client of the Redis may write those keys,
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

/* A holding value decodes exactly when it is two epoch-like numbers
 * around one space, to those numbers. */
static void holding_case(const char *s, size_t n)
{
    uint64_t b = UINT64_MAX, y = UINT64_MAX;
    kvt_status st = kvt__dir_holding_decode(s, n, &b, &y);
    if (st != KVT_OK) {
        refused(st);
        return;
    }
    const char *sp = memchr(s, ' ', n);
    uint64_t b2, y2;
    if (!sp || b >= (1ull << 63) || y >= (1ull << 63)) abort();
    if (kvt__dir_epoch_decode(s, (size_t)(sp - s), &b2) || b2 != b) abort();
    if (kvt__dir_epoch_decode(sp + 1, n - (size_t)(sp + 1 - s), &y2) || y2 != y) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    epoch_case(s, size);
    holding_case(s, size);
    lease_case(s, size, KVT_DIR_ADDR_MAX);
    if (size > 0) lease_case(s + 1, size - 1, data[0] % 24);
    return 0;
}

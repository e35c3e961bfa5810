/* fuzz_dir_replies.c - the cluster directory's readers of Redis reply
 * trees (src/cluster/dir_decode.h) on whatever a Redis, a Sentinel, a
 * Cluster node or someone answering in their place sends: the input is
 * RESP bytes, parsed by hiredis's own reader (as the directory's
 * connections parse them) into up to 8 replies, and every reader runs on
 * every reply and on each array element below it (8 levels at most).
 * Beyond "no crash, leak or UB" it checks each reader's contract:
 * - a redirection names an address kvt__dir_addr_split accepts;
 * - a sentinel's primary is such an address, and refusals are the five
 *   statuses the header lists;
 * - a slot map names only primaries it lists, each a valid address, at most
 *   KVT_DIR_PRIMARIES_MAX, and a refusal has a message naming the node;
 * - a holder is a valid node id other than self with a decodable entry;
 * - a SCAN page's cursor is NUL-terminated inside its buffer.
 * The reader carries the directory's bound on declared arrays
 * (kvt__dir_reader_cap): without it, one header of 2^28 elements made
 * hiredis allocate 2 GiB. */
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cluster/dir_decode.h"

#define ASKED "10.0.0.7:7001"
#define SELF "node-a"

static kvt_dir_slot_map g_map;

static bool addr_ok(const char *a)
{
    size_t n = strnlen(a, KVT_DIR_ADDR_MAX);
    return n < KVT_DIR_ADDR_MAX && kvt__dir_addr_split(a, n, NULL, 0, NULL);
}

static void kind_case(const redisReply *r)
{
    char addr[KVT_DIR_ADDR_MAX] = "";
    int k = kvt__dir_reply_kind(r, addr);
    if (k < KVT_DIR_REPLY_OK || k > KVT_DIR_REPLY_UNAVAIL) abort();
    if ((k == KVT_DIR_REPLY_MOVED || k == KVT_DIR_REPLY_ASK) && !addr_ok(addr)) abort();
    if (k != KVT_DIR_REPLY_OK && r->type != REDIS_REPLY_ERROR) abort();
}

static void sentinel_case(const redisReply *r)
{
    char addr[KVT_DIR_ADDR_MAX];
    memset(addr, 0x5a, sizeof addr);
    const char *err = (const char *)1;
    kvt_status st = kvt__dir_sentinel_reply(r, addr, &err);
    if (err && (r->type != REDIS_REPLY_ERROR || err != r->str)) abort();
    switch (st) {
    case KVT_OK:
        if (!addr_ok(addr) || r->type != REDIS_REPLY_ARRAY) abort();
        break;
    case KVT_EINVAL:
        if (addr[0] != '\0') abort();
        break;
    case KVT_ENOTFOUND:
        if (r->type != REDIS_REPLY_NIL) abort();
        break;
    case KVT_EAUTH:
        if (!err || strncmp(err, "NOAUTH", 6) != 0) abort();
        break;
    case KVT_EPROTO:
        break;
    default:
        abort();
    }
}

static void slots_case(const redisReply *r)
{
    kvt_status st = kvt__dir_slots_reply(r, ASKED, &g_map);
    if (st != KVT_OK) {
        if ((st != KVT_EPROTO && st != KVT_EFULL) || !strstr(kvt_last_error(), ASKED)) abort();
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || g_map.n > KVT_DIR_PRIMARIES_MAX) abort();
    for (uint32_t i = 0; i < g_map.n; i++)
        if (!addr_ok(g_map.addr[i])) abort();
    for (uint32_t k = 0; k < KVT_DIR_SLOTS; k++)
        if (g_map.slot[k] != KVT_DIR_NO_PRIMARY && g_map.slot[k] >= g_map.n) abort();
}

static void holders_case(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY) return;
    for (size_t i = 0; i + 1 < r->elements; i++) {
        const char *node = NULL;
        uint64_t epoch = UINT64_MAX;
        uint8_t tier = 0xee;
        if (!kvt__dir_holder_reply(r->element[i], r->element[i + 1], SELF, &node, &epoch, &tier))
            continue;
        if (node != r->element[i]->str || !kvt__dir_node_ok(node) || strcmp(node, SELF) == 0) abort();
        if (epoch >= (1ull << 63)) abort();
        if (tier != KVT_DIR_TIER_CPU && tier != KVT_DIR_TIER_SSD && tier != KVT_DIR_TIER_UNKNOWN)
            abort();
    }
}

static void scan_case(const redisReply *r)
{
    char cursor[KVT_DIR_CURSOR_MAX + 8];
    memset(cursor, 0x5a, sizeof cursor);
    const redisReply *keys = NULL;
    kvt_status st = kvt__dir_scan_reply(r, cursor, &keys);
    if (st != KVT_OK) {
        if (st != KVT_EPROTO || kvt_last_error()[0] == '\0') abort();
        return;
    }
    size_t n = strnlen(cursor, sizeof cursor);
    if (n >= KVT_DIR_CURSOR_MAX || (unsigned char)cursor[KVT_DIR_CURSOR_MAX] != 0x5a) abort();
    if (!keys || keys->type != REDIS_REPLY_ARRAY) abort();
}

static void every_reader(const redisReply *r, int depth)
{
    kind_case(r);
    sentinel_case(r);
    slots_case(r);
    holders_case(r);
    scan_case(r);
    if (r->type != REDIS_REPLY_ARRAY || depth == 8) return;
    for (size_t i = 0; i < r->elements; i++) every_reader(r->element[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *rd = redisReaderCreate();
    if (!rd) return 0;
    kvt__dir_reader_cap(rd); /* as every connection of the directory */
    if (redisReaderFeed(rd, (const char *)data, size) == REDIS_OK) {
        for (int i = 0; i < 8; i++) {
            void *reply = NULL;
            if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply) break;
            every_reader(reply, 0);
            freeReplyObject(reply);
        }
    }
    redisReaderFree(rd);
    return 0;
}

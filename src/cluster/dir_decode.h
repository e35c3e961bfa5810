/* dir_decode.h - what the cluster directory reads back from Redis: the
 * values of its keys (declared in dir.h: epoch, lease, holding, block
 * entry) and the reply trees hiredis builds from the server's bytes (here:
 * a redirection or "not now" error, a Sentinel's primary, a CLUSTER SLOTS
 * map, a block entry's holder, a SCAN page). Anyone who can write the keys
 * or answer in the server's place chooses these bytes, so every reader
 * checks each element's type and size before it reads it and refuses what
 * it does not expect; none keeps a pointer past the reply's life but the
 * ones it hands back. No locks, no I/O: tests/fuzz/fuzz_dir_replies.c
 * feeds them trees hiredis parsed from any bytes. */
#ifndef KVT_CLUSTER_DIR_DECODE_H
#define KVT_CLUSTER_DIR_DECODE_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/dir.h"

#define KVT_DIR_SLOTS 16384        /* Redis Cluster's hash slots */
#define KVT_DIR_PRIMARIES_MAX 64   /* primaries one slot map may name */
#define KVT_DIR_NO_PRIMARY 0xff    /* a slot no primary serves */
#define KVT_DIR_CURSOR_MAX 24      /* a SCAN cursor (a 64-bit number), with its NUL */

/* "host:port" or "[v6]:port" of len bytes (no NUL needed), host of
 * [A-Za-z0-9._-] (or hex digits, ':' and '.' inside brackets), port
 * 1..65535: host (without brackets, when host_len fits it) and port out
 * when they are given. */
bool kvt__dir_addr_split(const char *s, size_t len, char *host, size_t host_len, uint16_t *port);
/* A node id: 1..KVT_DIR_NODE_MAX-1 bytes of [A-Za-z0-9._-]. */
bool kvt__dir_node_ok(const char *s);

/* Arrays a reply may declare, in elements. hiredis allocates a declared
 * array's element table before any element arrives (0.14: no bound of its
 * own), so one header of 2^28 elements from a hostile server cost 2 GiB;
 * past this bound the reader fails the connection as out of memory. The
 * directory's largest answers are CLUSTER SLOTS (at most 16384 ranges) and
 * a SCAN page (about COUNT 1000 keys). */
#define KVT_DIR_REPLY_ELEMENTS_MAX (1 << 20)
/* Puts that bound on reader r (a redisContext's c->reader): its reply
 * functions become hiredis's own with the array check in front. */
void kvt__dir_reader_cap(redisReader *r);

enum { KVT_DIR_REPLY_OK, KVT_DIR_REPLY_MOVED, KVT_DIR_REPLY_ASK, KVT_DIR_REPLY_UNAVAIL };
/* What an answer asks of us: a redirection (MOVED or ASK, addr filled), a
 * retry once the topology is read again (READONLY, LOADING, MASTERDOWN,
 * CLUSTERDOWN, TRYAGAIN), or nothing (any other reply; a redirection to
 * an address that is not host:port is a plain error). */
int kvt__dir_reply_kind(const redisReply *r, char addr[KVT_DIR_ADDR_MAX]);

/* SENTINEL get-master-addr-by-name's answer: KVT_OK with addr the
 * primary's "host:port" ("[v6]:port"); KVT_EINVAL when the address it
 * names is not one (addr ""); KVT_ENOTFOUND for nil (no primary of that
 * name); KVT_EAUTH for a NOAUTH error; KVT_EPROTO for anything else. *err: an error reply's text, else NULL. Sets no message: the
 * caller names the sentinel. */
kvt_status kvt__dir_sentinel_reply(const redisReply *r, char addr[KVT_DIR_ADDR_MAX],
                                   const char **err);

/* A CLUSTER SLOTS answer read: each slot's primary as an index into
 * addr[0..n), or KVT_DIR_NO_PRIMARY. */
typedef struct kvt_dir_slot_map {
    uint8_t slot[KVT_DIR_SLOTS];
    char addr[KVT_DIR_PRIMARIES_MAX][KVT_DIR_ADDR_MAX];
    uint32_t n;
} kvt_dir_slot_map;
/* Reads the CLUSTER SLOTS reply r of node asked ("host:port": a range
 * whose primary has an empty host is asked's) into *m. KVT_EPROTO (no
 * array, a malformed range: bounds outside 0..16383 or reversed, a primary
 * that is not [host, port, ...]), KVT_EFULL (more than
 * KVT_DIR_PRIMARIES_MAX primaries), each with a message naming asked. */
kvt_status kvt__dir_slots_reply(const redisReply *r, const char *asked, kvt_dir_slot_map *m);

/* Field f and value v of a block entry's HGETALL answer: true when f is a
 * node id other than self and v a valid entry (kvt__dir_entry_decode);
 * *node then points into f. */
bool kvt__dir_holder_reply(const redisReply *f, const redisReply *v, const char *self,
                           const char **node, uint64_t *epoch, uint8_t *tier);

/* SCAN's [cursor, keys] answer: the cursor copied (NUL-terminated) and
 * *keys the keys' array (inside r; its elements are not checked here).
 * KVT_EPROTO with a message for any other shape. */
kvt_status kvt__dir_scan_reply(const redisReply *r, char cursor[KVT_DIR_CURSOR_MAX],
                               const redisReply **keys);

#endif

/* quota.h - byte quotas on the CPU tier by namespace prefix (the node
 * server's server_quotas option): one busy tenant or model cannot take
 * the capacity everyone else's prefixes live in.
 *
 * A rule is PREFIX=SIZE; a namespace belongs to the rule with the longest
 * prefix it starts with ("-" matches only the default, empty, namespace;
 * "*" every namespace no other rule matches, all of them together). A
 * namespace no rule matches has no quota. Each rule is one owner of the
 * pool's slots (kvt_pool_quotas): its blocks' CPU copies count against
 * its SIZE across every cache given the same kvt_quota. */
#ifndef KVT_CACHE_QUOTA_H
#define KVT_CACHE_QUOTA_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvtier.h"
#include "store/pool.h"

#define KVT_QUOTA_PREFIX_MAX 256

typedef struct kvt_quota_rule {
    char prefix[KVT_QUOTA_PREFIX_MAX]; /* as written ("-" and "*" kept) */
    uint32_t len;
} kvt_quota_rule;

typedef struct kvt_quota {
    uint32_t n; /* rules; rule i is owner i + 1 */
    kvt_quota_rule rule[KVT_POOL_MAX_OWNERS];
    kvt_pool_quotas pool;
    _Atomic uint64_t limited[KVT_POOL_MAX_OWNERS + 1]; /* blocks a store did not get */
    _Atomic uint64_t evicted[KVT_POOL_MAX_OWNERS + 1]; /* own blocks evicted for room */
} kvt_quota;

/* Parses text (option opt: for messages) into q. Empty text: no rules.
 * KVT_EINVAL naming the rule for a malformed one, a duplicate prefix, a
 * size of 0, or more than KVT_POOL_MAX_OWNERS rules. */
kvt_status kvt__quota_parse(const char *text, const char *opt, kvt_quota *q);
/* The owner (1..n) whose rule ns[0..len) falls under, 0 for none. */
uint8_t kvt__quota_owner(const kvt_quota *q, const void *ns, uint32_t len);

#endif

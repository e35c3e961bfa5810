/* fuzz_options.c - the option values with a grammar of their own, on
 * arbitrary bytes (they come from config files and the environment, which
 * an operator or a deploy script writes): server_quotas
 * (kvt__quota_parse), server_namespaces (kvt__srv_ns_parse) and
 * cluster_redis (kvt__dir_check_redis). The first byte picks the parser,
 * the rest (up to its first NUL) is the value. Beyond "no crash, leak or
 * UB" it checks the contract: a refusal is KVT_EINVAL with a message naming
 * the option; what is accepted stays within the parser's bounds (a 33rd
 * quota rule was once written past the rule array, inside the struct,
 * where ASan cannot see it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cache/quota.h"
#include "cluster/dir.h"
#include "server/auth.h"

static void refused_well(kvt_status st, const char *name)
{
    if (st != KVT_EINVAL || !strstr(kvt_last_error(), name)) abort();
}

static void quotas(const char *text)
{
    kvt_quota *q = malloc(sizeof *q);
    if (!q) return;
    kvt_status st = kvt__quota_parse(text, "server_quotas", q);
    if (st) {
        refused_well(st, "server_quotas");
    } else {
        if (q->n > KVT_POOL_MAX_OWNERS) abort();
        for (uint32_t i = 0; i < q->n; i++) {
            const kvt_quota_rule *r = &q->rule[i];
            if (!r->prefix[0] || r->len != strlen(r->prefix) || q->pool.limit[i + 1] == 0)
                abort();
        }
        /* The owner of a namespace is a rule or none. */
        if (kvt__quota_owner(q, text, (uint32_t)strlen(text)) > q->n) abort();
    }
    free(q);
}

static void namespaces(const char *text)
{
    kvt_srv_ns_rules *r = malloc(sizeof *r);
    if (!r) return;
    kvt_status st = kvt__srv_ns_parse(text, r);
    if (st) {
        refused_well(st, "server_namespaces");
    } else {
        if (r->nrules > KVT_SRV_MAX_NS_RULES || r->nnames > KVT_SRV_MAX_NS_NAMES) abort();
        for (uint32_t i = 0; i < r->nrules; i++)
            if (r->rule[i].first + r->rule[i].count > r->nnames) abort();
        kvt_srv_peer peer = {0};
        (void)kvt__srv_ns_allowed(r, &peer, "ns", 2);
        kvt__srv_ns_free(r);
    }
    free(r);
}

static void redis(const char *text)
{
    kvt_status st = kvt__dir_check_redis(text);
    if (st) refused_well(st, "cluster directory: redis");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192) return 0;
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    switch (data[0] % 3) {
    case 0: quotas(text); break;
    case 1: namespaces(text); break;
    default: redis(text); break;
    }
    free(text);
    return 0;
}

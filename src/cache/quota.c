/* quota.c - parsing server_quotas and matching namespaces to its rules
 * (quota.h). Operator input: every malformed rule is an error naming it. */
#include "cache/quota.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "util/err.h"
#include "util/parse.h"

/* text[0..len) without surrounding blanks, into out (cap bytes). */
static bool trimmed(const char *text, size_t len, char *out, size_t cap)
{
    while (len && isspace((unsigned char)*text)) text++, len--;
    while (len && isspace((unsigned char)text[len - 1])) len--;
    if (len >= cap) return false;
    memcpy(out, text, len);
    out[len] = '\0';
    return true;
}

static kvt_status parse_rule(const char *r, size_t len, const char *opt, kvt_quota *q)
{
    char rule[KVT_QUOTA_PREFIX_MAX + 64], size[64];
    if (!trimmed(r, len, rule, sizeof rule))
        return kvt__fail(KVT_EINVAL, "%s: a rule is longer than %u bytes", opt,
                         KVT_QUOTA_PREFIX_MAX + 63);
    if (!rule[0]) return KVT_OK; /* "a=1G;" */
    char *eq = strrchr(rule, '=');
    if (!eq)
        return kvt__fail(KVT_EINVAL, "%s: rule \"%s\" has no '=' (PREFIX=SIZE, e.g. tenant-a=4GiB)",
                         opt, rule);
    /* Before taking a rule slot: past the last one is outside the array. */
    if (q->n == KVT_POOL_MAX_OWNERS)
        return kvt__fail(KVT_EINVAL, "%s: more than %u rules", opt, KVT_POOL_MAX_OWNERS);
    kvt_quota_rule *qr = &q->rule[q->n];
    uint64_t bytes = 0;
    if (!trimmed(eq + 1, strlen(eq + 1), size, sizeof size) || !kvt__parse_size(size, &bytes) ||
        bytes == 0)
        return kvt__fail(KVT_EINVAL, "%s: rule \"%s\": \"%s\" is not a size above 0 (4GiB, 512M)",
                         opt, rule, eq + 1);
    if (!trimmed(rule, (size_t)(eq - rule), qr->prefix, sizeof qr->prefix) || !qr->prefix[0])
        return kvt__fail(KVT_EINVAL, "%s: rule \"%s\" has no prefix (use - for the default "
                         "namespace, * for all others)", opt, rule);
    for (uint32_t i = 0; i < q->n; i++)
        if (!strcmp(q->rule[i].prefix, qr->prefix))
            return kvt__fail(KVT_EINVAL, "%s: prefix \"%s\" has two rules", opt, qr->prefix);
    qr->len = (uint32_t)strlen(qr->prefix);
    q->pool.limit[++q->n] = bytes;
    return KVT_OK;
}

kvt_status kvt__quota_parse(const char *text, const char *opt, kvt_quota *q)
{
    memset(q, 0, sizeof *q);
    for (const char *p = text ? text : ""; *p;) {
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        kvt_status st = parse_rule(p, len, opt, q);
        if (st) return st;
        p += len + (end != NULL);
    }
    return KVT_OK;
}

uint8_t kvt__quota_owner(const kvt_quota *q, const void *ns, uint32_t len)
{
    if (!q) return 0;
    uint8_t best = 0, any = 0;
    uint32_t best_len = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        const kvt_quota_rule *r = &q->rule[i];
        if (!strcmp(r->prefix, "*")) any = (uint8_t)(i + 1);
        else if (!strcmp(r->prefix, "-")) {
            if (len == 0) return (uint8_t)(i + 1);
        } else if (r->len <= len && r->len > best_len && !memcmp(ns, r->prefix, r->len)) {
            best = (uint8_t)(i + 1);
            best_len = r->len;
        }
    }
    return best ? best : any;
}

/* dir_decode.c - what the cluster directory reads back from Redis
 * (dir_decode.h): the values its keys hold, and the reply trees hiredis
 * builds from the server's bytes. */
#include "cluster/dir_decode.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "util/err.h"

/* ------------------------------------------------------------------ */
/* Values (dir.h)                                                     */
/* ------------------------------------------------------------------ */

kvt_status kvt__dir_epoch_decode(const char *s, size_t len, uint64_t *epoch)
{
    /* 19 digits hold every value below 2^63; longer is refused even with
     * leading zeros, so the loop below cannot overflow. */
    if (!s || len == 0 || len > 19)
        return kvt__fail(KVT_EPROTO, "cluster directory: epoch of %zu bytes (want 1..19 digits)", len);
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return kvt__fail(KVT_EPROTO, "cluster directory: epoch has a byte 0x%02x that is no digit",
                             (unsigned char)s[i]);
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v >= (1ull << 63)) return kvt__fail(KVT_EPROTO, "cluster directory: epoch %" PRIu64 " >= 2^63", v);
    *epoch = v;
    return KVT_OK;
}

static bool host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
}

bool kvt__dir_addr_split(const char *s, size_t len, char *host, size_t host_len, uint16_t *port)
{
    if (len == 0 || len >= KVT_DIR_ADDR_MAX) return false;
    size_t hs = 0, he; /* host is s[hs..he) */
    const char *colon;
    if (s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (!rb || rb == s + 1 || (size_t)(rb - s) + 1 >= len || rb[1] != ':') return false;
        for (const char *p = s + 1; p < rb; p++)
            if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F') ||
                  *p == ':' || *p == '.'))
                return false;
        hs = 1;
        he = (size_t)(rb - s);
        colon = rb + 1;
    } else {
        colon = memchr(s, ':', len);
        if (!colon || colon == s) return false;
        he = (size_t)(colon - s);
        for (size_t i = 0; i < he; i++)
            if (!host_char(s[i])) return false;
    }
    size_t pn = len - (size_t)(colon + 1 - s);
    if (pn == 0 || pn > 5) return false;
    uint32_t v = 0;
    for (size_t i = 0; i < pn; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9') return false;
        v = v * 10 + (uint32_t)(c - '0');
    }
    if (v == 0 || v > 65535) return false;
    if (host) {
        if (he - hs >= host_len) return false;
        memcpy(host, s + hs, he - hs);
        host[he - hs] = '\0';
    }
    if (port) *port = (uint16_t)v;
    return true;
}

kvt_status kvt__dir_lease_decode(const char *s, size_t len, uint64_t *epoch, char *addr,
                                 size_t addr_len)
{
    const char *sp = s ? memchr(s, ' ', len) : NULL;
    if (!sp)
        return kvt__fail(KVT_EPROTO,
                         "cluster directory: lease value has no space (want \"<epoch> <host:port>\")");
    uint64_t e;
    kvt_status st = kvt__dir_epoch_decode(s, (size_t)(sp - s), &e);
    if (st) return st;
    size_t an = len - (size_t)(sp + 1 - s);
    if (!kvt__dir_addr_split(sp + 1, an, NULL, 0, NULL))
        return kvt__fail(KVT_EPROTO,
                         "cluster directory: lease value's address (%zu bytes) is not host:port", an);
    if (!addr || an >= addr_len)
        return kvt__fail(KVT_EPROTO,
                         "cluster directory: lease value's address of %zu bytes does not fit %zu", an,
                         addr_len);
    memcpy(addr, sp + 1, an);
    addr[an] = '\0';
    *epoch = e;
    return KVT_OK;
}

kvt_status kvt__dir_holding_decode(const char *s, size_t len, kvt_dir_holding *out)
{
    if (!s) return kvt__fail(KVT_EPROTO, "cluster directory: holding value is NULL");
    uint64_t v[4] = {0};
    size_t k = 0, at = 0;
    for (;;) {
        const char *sp = memchr(s + at, ' ', len - at);
        size_t fl = sp ? (size_t)(sp - (s + at)) : len - at;
        if (k == 4)
            return kvt__fail(KVT_EPROTO, "cluster directory: holding value has more than four "
                             "numbers");
        kvt_status st = kvt__dir_epoch_decode(s + at, fl, &v[k++]);
        if (st) return st;
        if (!sp) break;
        at += fl + 1;
    }
    if (k != 2 && k != 4)
        return kvt__fail(KVT_EPROTO, "cluster directory: holding value has %zu numbers (want "
                         "\"<blocks> <bytes> <cpu_blocks> <ssd_blocks>\" or \"<blocks> <bytes>\")", k);
    *out = (kvt_dir_holding){v[0], v[1], v[2], v[3], k == 4};
    return KVT_OK;
}

kvt_status kvt__dir_entry_decode(const char *s, size_t len, uint64_t *epoch, uint8_t *tier)
{
    const char *sp = s ? memchr(s, ' ', len) : NULL;
    size_t en = sp ? (size_t)(sp - s) : len, tn = sp ? len - en - 1 : 0;
    uint8_t t = KVT_DIR_TIER_UNKNOWN;
    if (sp && tn == 3 && !memcmp(sp + 1, "cpu", 3)) t = KVT_DIR_TIER_CPU;
    else if (sp && tn == 3 && !memcmp(sp + 1, "ssd", 3)) t = KVT_DIR_TIER_SSD;
    else if (sp)
        return kvt__fail(KVT_EPROTO, "cluster directory: entry's tier (%zu bytes) is not cpu or ssd",
                         tn);
    uint64_t e;
    kvt_status st = kvt__dir_epoch_decode(s, en, &e);
    if (st) return st;
    *epoch = e;
    *tier = t;
    return KVT_OK;
}


bool kvt__dir_node_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= KVT_DIR_NODE_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

/* ------------------------------------------------------------------ */
/* Reply trees                                                        */
/* ------------------------------------------------------------------ */

#if HIREDIS_MAJOR >= 1
/* hiredis 1.x bounds declared arrays itself (the reader's maxelements). */
void kvt__dir_reader_cap(redisReader *r)
{
    if (r) r->maxelements = KVT_DIR_REPLY_ELEMENTS_MAX;
}
#else
static redisReplyObjectFunctions capped_fns;
static void *(*hiredis_array)(const redisReadTask *, int);
static pthread_once_t capped_once = PTHREAD_ONCE_INIT;

static void *capped_array(const redisReadTask *task, int elements)
{
    if (elements > KVT_DIR_REPLY_ELEMENTS_MAX) return NULL; /* hiredis: "Out of memory" */
    return hiredis_array(task, elements);
}

/* hiredis's own reply functions, from a reader of its own (every reader
 * starts with the same static table). */
static void capped_init(void)
{
    redisReader *r = redisReaderCreate();
    if (!r || !r->fn) {
        if (r) redisReaderFree(r);
        return; /* out of memory: readers stay as hiredis made them */
    }
    capped_fns = *r->fn;
    hiredis_array = r->fn->createArray;
    capped_fns.createArray = capped_array;
    redisReaderFree(r);
}

void kvt__dir_reader_cap(redisReader *r)
{
    pthread_once(&capped_once, capped_init);
    if (r && hiredis_array) r->fn = &capped_fns;
}
#endif

int kvt__dir_reply_kind(const redisReply *r, char addr[KVT_DIR_ADDR_MAX])
{
    if (r->type != REDIS_REPLY_ERROR || !r->str) return KVT_DIR_REPLY_OK;
    static const char *const unavail[] = {"READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"};
    for (size_t i = 0; i < sizeof unavail / sizeof *unavail; i++) {
        size_t n = strlen(unavail[i]);
        if (r->len >= n && strncmp(r->str, unavail[i], n) == 0) return KVT_DIR_REPLY_UNAVAIL;
    }
    bool moved = strncmp(r->str, "MOVED ", 6) == 0, ask = strncmp(r->str, "ASK ", 4) == 0;
    if (!moved && !ask) return KVT_DIR_REPLY_OK; /* a plain error: the caller reports it */
    const char *a = strchr(r->str + (moved ? 6 : 4), ' ');
    if (!a || !kvt__dir_addr_split(a + 1, strlen(a + 1), NULL, 0, NULL)) return KVT_DIR_REPLY_OK;
    snprintf(addr, KVT_DIR_ADDR_MAX, "%s", a + 1);
    return moved ? KVT_DIR_REPLY_MOVED : KVT_DIR_REPLY_ASK;
}

static bool is_string(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING && r->str;
}

/* host and port as "host:port" ("[host]:port" when host has a colon: an
 * IPv6 address) into out; false when that is no address kvt__dir_addr_split
 * takes (or does not fit). */
static bool addr_join(char out[KVT_DIR_ADDR_MAX], const char *host, const char *port)
{
    int n = snprintf(out, KVT_DIR_ADDR_MAX, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
    return n > 0 && n < KVT_DIR_ADDR_MAX && kvt__dir_addr_split(out, (size_t)n, NULL, 0, NULL);
}

kvt_status kvt__dir_sentinel_reply(const redisReply *r, char addr[KVT_DIR_ADDR_MAX], const char **err)
{
    *err = r->type == REDIS_REPLY_ERROR && r->str ? r->str : NULL;
    if (r->type == REDIS_REPLY_NIL) return KVT_ENOTFOUND;
    if (*err && strncmp(*err, "NOAUTH", 6) == 0) return KVT_EAUTH;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !is_string(r->element[0]) ||
        !is_string(r->element[1]))
        return KVT_EPROTO;
    if (!addr_join(addr, r->element[0]->str, r->element[1]->str)) {
        addr[0] = '\0';
        return KVT_EINVAL;
    }
    return KVT_OK;
}

/* One CLUSTER SLOTS range's primary as "host:port" (an empty host is the
 * node asked, as Redis answers when it does not know its own address). */
static bool slots_primary(const redisReply *e, const char *asked, char *out)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) return false;
    const redisReply *p = e->element[2];
    if (p->type != REDIS_REPLY_ARRAY || p->elements < 2 || !is_string(p->element[0]) ||
        p->element[1]->type != REDIS_REPLY_INTEGER)
        return false;
    char host[KVT_DIR_ADDR_MAX];
    const char *h = p->element[0]->str;
    if (h[0] == '\0' || strcmp(h, "?") == 0) {
        if (!kvt__dir_addr_split(asked, strlen(asked), host, sizeof host, NULL)) return false;
        h = host;
    }
    char port[24];
    snprintf(port, sizeof port, "%lld", p->element[1]->integer);
    return addr_join(out, h, port);
}

/* The primary's index in m, added when new; KVT_DIR_NO_PRIMARY when full. */
static uint8_t primary_of(kvt_dir_slot_map *m, const char *addr)
{
    for (uint32_t i = 0; i < m->n; i++)
        if (strcmp(m->addr[i], addr) == 0) return (uint8_t)i;
    if (m->n == KVT_DIR_PRIMARIES_MAX) return KVT_DIR_NO_PRIMARY;
    memcpy(m->addr[m->n], addr, KVT_DIR_ADDR_MAX);
    return (uint8_t)m->n++;
}

kvt_status kvt__dir_slots_reply(const redisReply *r, const char *asked, kvt_dir_slot_map *m)
{
    memset(m->slot, KVT_DIR_NO_PRIMARY, sizeof m->slot);
    m->n = 0;
    if (r->type != REDIS_REPLY_ARRAY)
        return kvt__fail(KVT_EPROTO, "cluster directory: %s answered CLUSTER SLOTS with %s", asked,
                         r->type == REDIS_REPLY_ERROR && r->str ? r->str : "no array");
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        char addr[KVT_DIR_ADDR_MAX];
        if (!slots_primary(e, asked, addr) || e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
            e->element[1]->integer >= KVT_DIR_SLOTS || e->element[0]->integer > e->element[1]->integer)
            return kvt__fail(KVT_EPROTO, "cluster directory: %s's CLUSTER SLOTS range %zu is "
                             "malformed", asked, i);
        uint8_t p = primary_of(m, addr);
        if (p == KVT_DIR_NO_PRIMARY)
            return kvt__fail(KVT_EFULL, "cluster directory: %s's CLUSTER SLOTS names more than %d "
                             "primaries", asked, KVT_DIR_PRIMARIES_MAX);
        for (long long k = e->element[0]->integer; k <= e->element[1]->integer; k++) m->slot[k] = p;
    }
    return KVT_OK;
}

bool kvt__dir_holder_reply(const redisReply *f, const redisReply *v, const char *self,
                           const char **node, uint64_t *epoch, uint8_t *tier)
{
    if (!is_string(f) || !is_string(v)) return false;
    if (f->len >= KVT_DIR_NODE_MAX || strlen(f->str) != f->len || !kvt__dir_node_ok(f->str)) return false;
    if (strcmp(f->str, self) == 0) return false;
    if (kvt__dir_entry_decode(v->str, v->len, epoch, tier) != KVT_OK) return false;
    *node = f->str;
    return true;
}

kvt_status kvt__dir_scan_reply(const redisReply *r, char cursor[KVT_DIR_CURSOR_MAX],
                               const redisReply **keys)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !is_string(r->element[0]) ||
        r->element[0]->len >= KVT_DIR_CURSOR_MAX || strlen(r->element[0]->str) != r->element[0]->len ||
        r->element[1]->type != REDIS_REPLY_ARRAY)
        return kvt__fail(KVT_EPROTO, "cluster directory: SCAN answered no [cursor, keys]");
    memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
    *keys = r->element[1];
    return KVT_OK;
}

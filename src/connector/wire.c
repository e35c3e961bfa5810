/* wire.c - encoders and bounds-checked decoders of the step payloads. */
#include "connector/wire.h"

#include "group/frame.h"
#include "util/err.h"

size_t kvt__wire_up_size(uint32_t nl, uint32_t ns, uint32_t nr)
{
    return KVT_WIRE_HEAD + (size_t)nl * KVT_UPL_SIZE + (size_t)ns * KVT_UPS_SIZE +
           (size_t)nr * KVT_RES_SIZE;
}

size_t kvt__wire_down_size(uint32_t nl, uint32_t ns, uint32_t nr)
{
    return KVT_WIRE_HEAD + (size_t)nl * KVT_DNL_SIZE + (size_t)ns * KVT_DNS_SIZE +
           (size_t)nr * KVT_RES_SIZE;
}

void kvt__wire_head(uint8_t *p, uint32_t flags, uint32_t a, uint32_t b, uint32_t c)
{
    kvt__put32(p, flags);
    kvt__put32(p + 4, a);
    kvt__put32(p + 8, b);
    kvt__put32(p + 12, c);
}

void kvt__wire_put_lookup(uint8_t *p, const kvt_up_lookup *r)
{
    kvt__put64(p, r->rid);
    kvt__put64(p + 8, r->digest);
    kvt__put32(p + 16, r->local_tokens);
    kvt__put32(p + 20, r->flags);
}

void kvt__wire_put_store(uint8_t *p, const kvt_up_store *r)
{
    kvt__put64(p, r->rid);
    kvt__put64(p + 8, r->digest);
    kvt__put32(p + 16, r->num_tokens);
    kvt__put32(p + 20, r->flags);
}

void kvt__wire_put_result(uint8_t *p, const kvt_result_rec *r)
{
    kvt__put64(p, r->rid);
    kvt__put32(p + 8, r->kind);
    kvt__put32(p + 12, (uint32_t)r->status);
    kvt__put32(p + 16, r->tokens);
    kvt__put32(p + 20, r->rank);
}

void kvt__wire_put_load(uint8_t *p, const kvt_down_load *r)
{
    kvt__put64(p, r->rid);
    kvt__put32(p + 8, r->tokens);
    kvt__put32(p + 12, (uint32_t)r->status);
    kvt__put32(p + 16, r->rank);
    kvt__put32(p + 20, r->counter);
    kvt__put64(p + 24, r->generation);
}

void kvt__wire_put_sdec(uint8_t *p, const kvt_down_store *r)
{
    kvt__put64(p, r->rid);
    kvt__put32(p + 8, (uint32_t)r->status);
    kvt__put32(p + 12, r->rank);
}

kvt_up_lookup kvt__wire_get_lookup(const uint8_t *p)
{
    return (kvt_up_lookup){kvt__get64(p), kvt__get64(p + 8), kvt__get32(p + 16),
                           kvt__get32(p + 20)};
}

kvt_up_store kvt__wire_get_store(const uint8_t *p)
{
    return (kvt_up_store){kvt__get64(p), kvt__get64(p + 8), kvt__get32(p + 16),
                          kvt__get32(p + 20)};
}

kvt_result_rec kvt__wire_get_result(const uint8_t *p)
{
    return (kvt_result_rec){kvt__get64(p), kvt__get32(p + 8), (int32_t)kvt__get32(p + 12),
                            kvt__get32(p + 16), kvt__get32(p + 20)};
}

kvt_down_load kvt__wire_get_load(const uint8_t *p)
{
    return (kvt_down_load){kvt__get64(p), kvt__get32(p + 8), (int32_t)kvt__get32(p + 12),
                           kvt__get32(p + 16), kvt__get32(p + 20), kvt__get64(p + 24)};
}

kvt_down_store kvt__wire_get_sdec(const uint8_t *p)
{
    return (kvt_down_store){kvt__get64(p), (int32_t)kvt__get32(p + 8), kvt__get32(p + 12)};
}

static kvt_status check_results(const uint8_t *p, uint32_t n, const char *what)
{
    for (uint32_t i = 0; i < n; i++) {
        kvt_result_rec r = kvt__wire_get_result(p + (size_t)i * KVT_RES_SIZE);
        if (r.kind != KVT_TASK_LOAD && r.kind != KVT_TASK_STORE)
            return kvt__fail(KVT_EPROTO, "%s result %u (rid %llu) has unknown kind %u", what, i,
                             (unsigned long long)r.rid, r.kind);
        if (!kvt__status_known(r.status))
            return kvt__fail(KVT_EPROTO, "%s result %u (rid %llu) has unknown status %d", what,
                             i, (unsigned long long)r.rid, r.status);
    }
    return KVT_OK;
}

static kvt_status head(const uint8_t *p, size_t len, const char *what, uint32_t *f, uint32_t *a,
                       uint32_t *b, uint32_t *c)
{
    if (!p || len < KVT_WIRE_HEAD)
        return kvt__fail(KVT_EPROTO, "%s payload of %zu bytes is shorter than its head", what, len);
    *f = kvt__get32(p);
    *a = kvt__get32(p + 4);
    *b = kvt__get32(p + 8);
    *c = kvt__get32(p + 12);
    if (*f & ~KVT_WIRE_RESET)
        return kvt__fail(KVT_EPROTO, "%s payload has unknown flags 0x%x", what, *f);
    return KVT_OK;
}

kvt_status kvt__wire_up_parse(const uint8_t *p, size_t len, kvt_up_view *o)
{
    kvt_up_view v;
    kvt_status st = head(p, len, "step up", &v.flags, &v.n_lookups, &v.n_stores, &v.n_results);
    if (st != KVT_OK) return st;
    /* Counts are u32, so the size fits in 64 bits without overflow. */
    if (kvt__wire_up_size(v.n_lookups, v.n_stores, v.n_results) != len)
        return kvt__fail(KVT_EPROTO, "step up announces %u lookups, %u stores, %u results but "
                         "carries %zu bytes", v.n_lookups, v.n_stores, v.n_results, len);
    v.lookups = p + KVT_WIRE_HEAD;
    v.stores = v.lookups + (size_t)v.n_lookups * KVT_UPL_SIZE;
    v.results = v.stores + (size_t)v.n_stores * KVT_UPS_SIZE;
    st = check_results(v.results, v.n_results, "step up");
    if (st == KVT_OK) *o = v;
    return st;
}

/* A decision's status is OK or a refusal, never a positive or unknown code
 * (the engine gets it in kvt_conn_event.status). */
static kvt_status check_decisions(const kvt_down_view *v)
{
    for (uint32_t i = 0; i < v->n_loads; i++) {
        kvt_down_load l = kvt__wire_get_load(v->loads + (size_t)i * KVT_DNL_SIZE);
        if (!kvt__status_known(l.status))
            return kvt__fail(KVT_EPROTO, "step down load %u (rid %llu) has unknown status %d", i,
                             (unsigned long long)l.rid, l.status);
    }
    for (uint32_t i = 0; i < v->n_stores; i++) {
        kvt_down_store s = kvt__wire_get_sdec(v->stores + (size_t)i * KVT_DNS_SIZE);
        if (!kvt__status_known(s.status))
            return kvt__fail(KVT_EPROTO, "step down store %u (rid %llu) has unknown status %d", i,
                             (unsigned long long)s.rid, s.status);
    }
    return KVT_OK;
}

kvt_status kvt__wire_down_parse(const uint8_t *p, size_t len, kvt_down_view *o)
{
    kvt_down_view v;
    kvt_status st = head(p, len, "step down", &v.flags, &v.n_loads, &v.n_stores, &v.n_results);
    if (st != KVT_OK) return st;
    if (kvt__wire_down_size(v.n_loads, v.n_stores, v.n_results) != len)
        return kvt__fail(KVT_EPROTO, "step down announces %u loads, %u stores, %u results but "
                         "carries %zu bytes", v.n_loads, v.n_stores, v.n_results, len);
    v.loads = p + KVT_WIRE_HEAD;
    v.stores = v.loads + (size_t)v.n_loads * KVT_DNL_SIZE;
    v.results = v.stores + (size_t)v.n_stores * KVT_DNS_SIZE;
    st = check_results(v.results, v.n_results, "step down");
    if (st == KVT_OK) st = check_decisions(&v);
    if (st == KVT_OK) *o = v;
    return st;
}

void kvt__wire_fuzz(const uint8_t *data, size_t size)
{
    kvt_up_view u;
    kvt_down_view d;
    if (kvt__wire_up_parse(data, size, &u) == KVT_OK) {
        for (uint32_t i = 0; i < u.n_lookups; i++)
            (void)kvt__wire_get_lookup(u.lookups + (size_t)i * KVT_UPL_SIZE);
        for (uint32_t i = 0; i < u.n_stores; i++)
            (void)kvt__wire_get_store(u.stores + (size_t)i * KVT_UPS_SIZE);
    }
    if (kvt__wire_down_parse(data, size, &d) == KVT_OK) {
        for (uint32_t i = 0; i < d.n_loads; i++)
            (void)kvt__wire_get_load(d.loads + (size_t)i * KVT_DNL_SIZE);
        for (uint32_t i = 0; i < d.n_stores; i++)
            (void)kvt__wire_get_sdec(d.stores + (size_t)i * KVT_DNS_SIZE);
    }
}

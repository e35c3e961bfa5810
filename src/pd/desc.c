/* desc.c - descriptors: building from a geometry, wire encoding, and the
 * strict decoder (its input comes from the network). */
#include "pd/desc.h"

#include <stdlib.h>
#include <string.h>
#include "layout/layout.h"
#include "pd/wire.h"
#include "util/err.h"

#define DESC_FIXED 36 /* version + 8 fields */
#define ENTRY_LEN 32  /* 8 x u32 */
#define DESC_VERSION 2 /* 2: entries carry replicas (GQA heads replicated across TP) */

void pd_desc_free(pd_desc *d)
{
    if (!d) return;
    free(d->entries);
    d->entries = NULL;
    d->num_entries = 0;
}

static kvt_status check_rank(const kvt_pd_rank *r, uint32_t *dcp, uint32_t *dcp_rank, uint32_t *reps)
{
    *dcp = r->dcp_size ? r->dcp_size : 1;
    *dcp_rank = r->dcp_size ? r->dcp_rank : 0;
    *reps = r->kv_head_replicas ? r->kv_head_replicas : 1;
    KVT_CHECK_ARG(r->tp_size >= 1 && r->tp_size <= PD_MAX_TP && r->tp_rank < r->tp_size,
                  "pd: rank: tp_rank %u / tp_size %u (need tp_size 1..%u, rank below it)",
                  r->tp_rank, r->tp_size, PD_MAX_TP);
    KVT_CHECK_ARG(*dcp <= PD_MAX_TP && *dcp_rank < *dcp,
                  "pd: rank: dcp_rank %u / dcp_size %u (need dcp_size 1..%u, rank below it)",
                  *dcp_rank, *dcp, PD_MAX_TP);
    KVT_CHECK_ARG((uint64_t)r->tp_size * *dcp <= PD_MAX_RANKS,
                  "pd: rank: tp_size %u x dcp_size %u is %llu ranks (at most %u)", r->tp_size, *dcp,
                  (unsigned long long)r->tp_size * *dcp, PD_MAX_RANKS);
    KVT_CHECK_ARG(r->tp_size % *reps == 0,
                  "pd: rank: kv_head_replicas %u does not divide tp_size %u (n consecutive TP ranks share heads)",
                  *reps, r->tp_size);
    return KVT_OK;
}

/* The first global head of an MHA entry on TP rank t. */
static uint32_t head_offset_of(const pd_entry *e, uint32_t tp_rank)
{
    return e->replicated ? 0 : tp_rank / e->replicas * e->heads;
}

kvt_status pd_desc_from_geometry(pd_desc *out, const kvt_geometry *geo,
                                 const kvt_pd_rank *rank, uint32_t role)
{
    uint32_t dcp, dcp_rank, reps;
    kvt_status st = check_rank(rank, &dcp, &dcp_rank, &reps);
    if (st) return st;
    st = kvt_geometry_validate(geo);
    if (st) return st;
    pd_desc d = {.role = role, .tokens_per_page = geo->tokens_per_page,
                 .layout = (uint32_t)geo->layout, .tp_size = rank->tp_size,
                 .tp_rank = rank->tp_rank, .dcp_size = dcp, .dcp_rank = dcp_rank};
    d.entries = calloc((size_t)geo->num_layers * KVT_MAX_COMPONENTS, sizeof *d.entries);
    if (!d.entries) return kvt__fail(KVT_ENOMEM, "pd: descriptor: out of memory");
    for (uint32_t l = 0; l < geo->num_layers; l++) {
        const kvt_layer_spec *ls = &geo->layers[l];
        for (uint32_t c = 0; c < ls->num_components; c++) {
            const kvt_component_spec *cs = &ls->component[c];
            pd_entry *e = &d.entries[d.num_entries++];
            e->layer = l;
            e->comp = c;
            e->heads = cs->kv_heads;
            e->elem_size = cs->elem_size;
            e->token_bytes = (uint32_t)kvt__geo_token_bytes(geo, l, c);
            e->replicated = ls->num_components == 1;
            e->replicas = e->replicated ? 1 : reps;
            e->head_offset = head_offset_of(e, rank->tp_rank);
        }
    }
    *out = d;
    return KVT_OK;
}

kvt_status pd_desc_copy(pd_desc *out, const pd_desc *in)
{
    pd_desc d = *in;
    d.entries = malloc((size_t)in->num_entries * sizeof *d.entries + 1);
    if (!d.entries) return kvt__fail(KVT_ENOMEM, "pd: descriptor: out of memory");
    memcpy(d.entries, in->entries, (size_t)in->num_entries * sizeof *d.entries);
    *out = d;
    return KVT_OK;
}

kvt_status pd_desc_at(pd_desc *out, const pd_desc *in, uint32_t tp_rank, uint32_t dcp_rank)
{
    kvt_status st = pd_desc_copy(out, in);
    if (st) return st;
    out->tp_rank = tp_rank;
    out->dcp_rank = dcp_rank;
    for (uint32_t i = 0; i < out->num_entries; i++)
        out->entries[i].head_offset = head_offset_of(&out->entries[i], tp_rank);
    return KVT_OK;
}

size_t pd_desc_wire_size(const pd_desc *d)
{
    return DESC_FIXED + (size_t)d->num_entries * ENTRY_LEN;
}

void pd_desc_encode(const pd_desc *d, uint8_t *o)
{
    const uint32_t f[9] = {DESC_VERSION, d->role, d->tokens_per_page, d->layout, d->tp_size,
                           d->tp_rank, d->dcp_size, d->dcp_rank, d->num_entries};
    for (int i = 0; i < 9; i++) pd_put32(o + 4 * i, f[i]);
    o += DESC_FIXED;
    for (uint32_t i = 0; i < d->num_entries; i++, o += ENTRY_LEN) {
        const pd_entry *e = &d->entries[i];
        const uint32_t g[8] = {e->layer, e->comp, e->token_bytes, e->heads, e->head_offset,
                               e->elem_size, e->replicated, e->replicas};
        for (int k = 0; k < 8; k++) pd_put32(o + 4 * k, g[k]);
    }
}

static kvt_status check_fixed(const pd_desc *d)
{
    if (d->role != PD_ROLE_PREFILL && d->role != PD_ROLE_DECODE)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: role %u is unknown", d->role);
    if (d->tokens_per_page < 1 || d->tokens_per_page > 65536)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: tokens_per_page %u (must be 1..65536)",
                         d->tokens_per_page);
    if (d->layout > 1) return kvt__fail(KVT_EPROTO, "pd: descriptor: layout %u is unknown", d->layout);
    if (d->tp_size < 1 || d->tp_size > PD_MAX_TP || d->tp_rank >= d->tp_size)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: tp_rank %u of tp_size %u", d->tp_rank, d->tp_size);
    if (d->dcp_size < 1 || d->dcp_size > PD_MAX_TP || d->dcp_rank >= d->dcp_size)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: dcp_rank %u of dcp_size %u", d->dcp_rank,
                         d->dcp_size);
    if ((uint64_t)d->tp_size * d->dcp_size > PD_MAX_RANKS)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: tp_size %u x dcp_size %u is more than %u ranks",
                         d->tp_size, d->dcp_size, PD_MAX_RANKS);
    if (d->num_entries < 1 || d->num_entries > PD_MAX_ENTRIES)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: %u entries (must be 1..%u)", d->num_entries,
                         PD_MAX_ENTRIES);
    return KVT_OK;
}

static kvt_status check_entry(const pd_desc *d, uint32_t i)
{
    const pd_entry *e = &d->entries[i];
    const pd_entry *prev = i ? &d->entries[i - 1] : NULL;
    bool order = !prev ? (e->layer == 0 && e->comp == 0)
                       : (e->layer == prev->layer ? e->comp == prev->comp + 1
                                                  : e->layer == prev->layer + 1 && e->comp == 0);
    if (!order || e->comp >= KVT_MAX_COMPONENTS || e->layer >= KVT_MAX_LAYERS)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: entry %u is layer %u component %u (out of order)",
                         i, e->layer, e->comp);
    bool elem_ok = e->elem_size == 1 || e->elem_size == 2 || e->elem_size == 4 || e->elem_size == 8;
    uint64_t unit = (uint64_t)e->heads * e->elem_size;
    if (!elem_ok || e->heads == 0 || e->replicated > 1 || e->token_bytes == 0 ||
        e->token_bytes % unit != 0 || e->token_bytes > (1u << 24))
        return kvt__fail(KVT_EPROTO,
                         "pd: descriptor: entry %u: token_bytes %u, heads %u, elem_size %u, replicated %u are inconsistent",
                         i, e->token_bytes, e->heads, e->elem_size, e->replicated);
    if (e->replicated && e->replicas != 1)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: entry %u: replicas %u of an MLA entry (must be 1)", i,
                         e->replicas);
    if (e->replicas < 1 || d->tp_size % e->replicas != 0)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: entry %u: replicas %u does not divide tp_size %u", i,
                         e->replicas, d->tp_size);
    uint64_t want = e->replicated ? 0 : (uint64_t)(d->tp_rank / e->replicas) * e->heads;
    if (e->head_offset != want)
        return kvt__fail(KVT_EPROTO,
                         "pd: descriptor: entry %u: head_offset %u, but tp_rank %u / replicas %u x %u heads is %llu",
                         i, e->head_offset, d->tp_rank, e->replicas, e->heads, (unsigned long long)want);
    return KVT_OK;
}

kvt_status pd_desc_decode(pd_desc *out, const uint8_t *p, size_t len, size_t *used)
{
    if (len < DESC_FIXED) return kvt__fail(KVT_EPROTO, "pd: descriptor: %zu bytes is truncated", len);
    if (pd_get32(p) != DESC_VERSION)
        return kvt__fail(KVT_EVERSION, "pd: descriptor: version %u, this build speaks %u",
                         pd_get32(p), DESC_VERSION);
    pd_desc d = {.role = pd_get32(p + 4), .tokens_per_page = pd_get32(p + 8),
                 .layout = pd_get32(p + 12), .tp_size = pd_get32(p + 16),
                 .tp_rank = pd_get32(p + 20), .dcp_size = pd_get32(p + 24),
                 .dcp_rank = pd_get32(p + 28), .num_entries = pd_get32(p + 32)};
    kvt_status st = check_fixed(&d);
    if (st) return st;
    size_t need = DESC_FIXED + (size_t)d.num_entries * ENTRY_LEN;
    if (len < need)
        return kvt__fail(KVT_EPROTO, "pd: descriptor: %u entries need %zu bytes, got %zu",
                         d.num_entries, need, len);
    d.entries = calloc(d.num_entries, sizeof *d.entries);
    if (!d.entries) return kvt__fail(KVT_ENOMEM, "pd: descriptor: out of memory");
    for (uint32_t i = 0; i < d.num_entries; i++) {
        const uint8_t *q = p + DESC_FIXED + (size_t)i * ENTRY_LEN;
        d.entries[i] = (pd_entry){pd_get32(q), pd_get32(q + 4), pd_get32(q + 8), pd_get32(q + 12),
                                  pd_get32(q + 16), pd_get32(q + 20), pd_get32(q + 24), pd_get32(q + 28)};
        st = check_entry(&d, i);
        if (st) {
            pd_desc_free(&d);
            return st;
        }
    }
    *out = d;
    *used = need;
    return KVT_OK;
}

void pd_topo_free(pd_topo_entry *e, uint32_t n)
{
    for (uint32_t i = 0; e && i < n; i++) pd_desc_free(&e[i].desc);
    free(e);
}

kvt_status pd_topo_decode(const uint8_t *b, uint32_t len, pd_topo_entry **out, uint32_t *n_out)
{
    if (len < 4) return kvt__fail(KVT_EPROTO, "pd receiver: truncated topology");
    uint32_t n = pd_get32(b), off = 4;
    if (n == 0 || n > PD_MAX_RANKS) return kvt__fail(KVT_EPROTO, "pd receiver: topology of %u ranks", n);
    pd_topo_entry *e = calloc(n, sizeof *e);
    if (!e) return kvt__fail(KVT_ENOMEM, "pd receiver: out of memory");
    for (uint32_t i = 0; i < n; i++) {
        size_t used;
        kvt_status st = pd_desc_decode(&e[i].desc, b + off, len - off, &used);
        if (!st && (len - off - used < 66 || e[i].desc.role != PD_ROLE_PREFILL))
            st = kvt__fail(KVT_EPROTO, "pd receiver: malformed topology entry %u", i);
        if (st) {
            pd_topo_free(e, n);
            return st;
        }
        off += (uint32_t)used;
        e[i].port = pd_get16(b + off);
        memcpy(e[i].host, b + off + 2, 64);
        off += 66;
    }
    *out = e;
    *n_out = n;
    return KVT_OK;
}

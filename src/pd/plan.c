/* plan.c - which bytes of a prefill rank go where on a decode rank.
 *
 * Rules (docs/pd.md "Geometry rules"):
 *  - entries pair up by index and must name the same layer and component;
 *  - element size and MLA-ness must agree; MLA (replicated) entries need
 *    equal bytes per token and decode TP rank t is fed by prefill rank
 *    t % prefill_tp; MHA entries need equal bytes per head and equal total
 *    heads (heads x TP / replicas) and are sliced by head range;
 *  - GQA with fewer KV heads than TP: n = replicas consecutive TP ranks hold
 *    the same heads; of the n prefill replicas of a head only the one with
 *    tp_rank % n == decode tp_rank % n feeds a decode rank (one source per
 *    head, and decode ranks sharing a group spread over its replicas);
 *  - DCP: equal sizes pair equal ranks; 1 -> N only when every entry is
 *    MLA (token g to decode DCP rank g % N at local index g / N);
 *  - page size and layout always convert (token-granular re-paging). */
#include <stdio.h>
#include <stdlib.h>
#include "pd/desc.h"
#include "util/err.h"

static const char *comp_name(const pd_entry *e)
{
    if (e->replicated) return "KV";
    return e->comp == 0 ? "K" : "V";
}

#define ENTRY_FMT "entry %u (layer %u %s)"
#define ENTRY_ARGS(i, e) (i), (e)->layer, comp_name(e)

static kvt_status check_dcp(const pd_desc *s, const pd_desc *d)
{
    if (s->dcp_size == d->dcp_size) {
        if (s->dcp_rank != d->dcp_rank)
            return kvt__fail(KVT_EGEOMETRY,
                             "pd plan: dcp_rank: prefill %u vs decode %u (equal DCP size %u pairs equal ranks)",
                             s->dcp_rank, d->dcp_rank, s->dcp_size);
        return KVT_OK;
    }
    if (s->dcp_size != 1)
        return kvt__fail(KVT_EUNSUPPORTED,
                         "pd plan: dcp_size: prefill %u vs decode %u (supported: equal, or 1 -> N for MLA)",
                         s->dcp_size, d->dcp_size);
    for (uint32_t i = 0; i < s->num_entries; i++) {
        const pd_entry *e = &s->entries[i];
        if (!e->replicated)
            return kvt__fail(KVT_EUNSUPPORTED,
                             "pd plan: " ENTRY_FMT ": MHA (heads split across TP): prefill DCP 1 vs decode DCP %u needs MLA",
                             ENTRY_ARGS(i, e), d->dcp_size);
    }
    return KVT_OK;
}

static kvt_status check_entry(uint32_t i, const pd_entry *a, const pd_entry *b,
                              const pd_desc *s, const pd_desc *d)
{
    if (a->layer != b->layer || a->comp != b->comp)
        return kvt__fail(KVT_EGEOMETRY,
                         "pd plan: entry %u: layer/component: prefill layer %u component %u vs decode layer %u component %u",
                         i, a->layer, a->comp, b->layer, b->comp);
    if (a->replicated != b->replicated)
        return kvt__fail(KVT_EGEOMETRY, "pd plan: " ENTRY_FMT ": replicated (MLA): prefill %u vs decode %u",
                         ENTRY_ARGS(i, a), a->replicated, b->replicated);
    if (a->elem_size != b->elem_size)
        return kvt__fail(KVT_EGEOMETRY, "pd plan: " ENTRY_FMT ": elem_size: prefill %u vs decode %u",
                         ENTRY_ARGS(i, a), a->elem_size, b->elem_size);
    if (a->replicated) {
        if (a->token_bytes != b->token_bytes)
            return kvt__fail(KVT_EGEOMETRY, "pd plan: " ENTRY_FMT ": bytes_per_token: prefill %u vs decode %u",
                             ENTRY_ARGS(i, a), a->token_bytes, b->token_bytes);
        return KVT_OK;
    }
    uint32_t ha = a->token_bytes / a->heads, hb = b->token_bytes / b->heads;
    if (ha != hb)
        return kvt__fail(KVT_EGEOMETRY, "pd plan: " ENTRY_FMT ": bytes_per_head: prefill %u vs decode %u",
                         ENTRY_ARGS(i, a), ha, hb);
    uint64_t ta = (uint64_t)a->heads * s->tp_size / a->replicas;
    uint64_t tb = (uint64_t)b->heads * d->tp_size / b->replicas;
    if (ta != tb) {
        char ra[40] = "", rb[40] = "";
        if (a->replicas > 1) snprintf(ra, sizeof ra, " / kv_head_replicas %u", a->replicas);
        if (b->replicas > 1) snprintf(rb, sizeof rb, " / kv_head_replicas %u", b->replicas);
        return kvt__fail(KVT_EGEOMETRY,
                         "pd plan: " ENTRY_FMT ": total kv heads: prefill %llu (%u x TP%u%s) vs decode %llu (%u x TP%u%s)",
                         ENTRY_ARGS(i, a), (unsigned long long)ta, a->heads, s->tp_size, ra,
                         (unsigned long long)tb, b->heads, d->tp_size, rb);
    }
    return KVT_OK;
}

static void slice_entry(pd_slice *sl, const pd_entry *a, const pd_entry *b, const pd_desc *s,
                        const pd_desc *d)
{
    sl->unit = a->layer * KVT_MAX_COMPONENTS + a->comp;
    sl->src_tb = a->token_bytes;
    sl->dst_tb = b->token_bytes;
    if (a->replicated) {
        bool fed = d->tp_rank % s->tp_size == s->tp_rank;
        sl->len = fed ? a->token_bytes : 0;
        return;
    }
    /* Prefill heads held by n replicas: one of them feeds each decode rank,
     * picked by decode TP rank so that the decode ranks of one head group
     * (consecutive ranks) pull from different replicas. */
    if (a->replicas > 1 && s->tp_rank % a->replicas != d->tp_rank % a->replicas) return;
    uint32_t hb = a->token_bytes / a->heads;
    uint32_t lo = a->head_offset > b->head_offset ? a->head_offset : b->head_offset;
    uint32_t ea = a->head_offset + a->heads, eb = b->head_offset + b->heads;
    uint32_t hi = ea < eb ? ea : eb;
    if (hi <= lo) return;
    sl->src_off = (lo - a->head_offset) * hb;
    sl->dst_off = (lo - b->head_offset) * hb;
    sl->len = (hi - lo) * hb;
}

void pd_plan_free(pd_plan *p)
{
    if (!p) return;
    free(p->slices);
    p->slices = NULL;
}

kvt_status pd_plan_compute(pd_plan *out, const pd_desc *s, const pd_desc *d)
{
    if (s->role != PD_ROLE_PREFILL || d->role != PD_ROLE_DECODE)
        return kvt__fail(KVT_EINVAL, "pd plan: roles %u -> %u (need prefill -> decode)", s->role, d->role);
    if (s->num_entries != d->num_entries)
        return kvt__fail(KVT_EGEOMETRY, "pd plan: entry count: prefill %u vs decode %u",
                         s->num_entries, d->num_entries);
    kvt_status st = check_dcp(s, d);
    for (uint32_t i = 0; !st && i < s->num_entries; i++)
        st = check_entry(i, &s->entries[i], &d->entries[i], s, d);
    if (st) return st;
    pd_plan p = {.num_slices = s->num_entries, .src_tpp = s->tokens_per_page,
                 .dst_tpp = d->tokens_per_page,
                 .dcp_n = d->dcp_size, .dcp_k = d->dcp_rank, .src_n = s->dcp_size};
    p.slices = calloc(s->num_entries, sizeof *p.slices);
    if (!p.slices) return kvt__fail(KVT_ENOMEM, "pd plan: out of memory");
    for (uint32_t i = 0; i < s->num_entries; i++) {
        slice_entry(&p.slices[i], &s->entries[i], &d->entries[i], s, d);
        p.bytes_per_token += p.slices[i].len;
    }
    p.feeds = p.bytes_per_token > 0;
    *out = p;
    return KVT_OK;
}

/* The pairs a decode rank must be checked against: prefill ranks of its own
 * DCP position (every prefill rank when prefill has no DCP). */
static bool is_candidate(const pd_desc *s, const pd_desc *d)
{
    return s->dcp_size == 1 || s->dcp_rank == d->dcp_rank % s->dcp_size;
}

bool pd_topo_feeds(const pd_desc *s, const pd_desc *d)
{
    if (!is_candidate(s, d)) return false;
    pd_plan p;
    char saved[KVT_ERRMSG_MAX];
    snprintf(saved, sizeof saved, "%s", kvt_last_error());
    if (pd_plan_compute(&p, s, d) != KVT_OK) {
        kvt__fail(KVT_OK, "%s", saved); /* a probe must not clobber the caller's message */
        return false;
    }
    bool f = p.feeds;
    pd_plan_free(&p);
    return f;
}

kvt_status pd_topo_expected(const pd_desc *s, const pd_desc *dec, uint32_t *out)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < dec->tp_size; t++) {
        for (uint32_t k = 0; k < dec->dcp_size; k++) {
            pd_desc d;
            kvt_status st = pd_desc_at(&d, dec, t, k);
            if (st) return st;
            n += pd_topo_feeds(s, &d);
            pd_desc_free(&d);
        }
    }
    *out = n ? n : 1; /* nobody needs s: its dummy decode rank still opens each room */
    return KVT_OK;
}

kvt_status pd_topo_talks(const pd_desc *s, const pd_desc *d, bool *out)
{
    if (pd_topo_feeds(s, d)) {
        *out = true;
        return KVT_OK;
    }
    uint32_t n = 0;
    for (uint32_t t = 0; t < d->tp_size && n == 0; t++) {
        for (uint32_t k = 0; k < d->dcp_size && n == 0; k++) {
            pd_desc o;
            kvt_status st = pd_desc_at(&o, d, t, k);
            if (st) return st;
            n += pd_topo_feeds(s, &o);
            pd_desc_free(&o);
        }
    }
    *out = n == 0 && d->tp_rank == s->tp_rank % d->tp_size &&
           d->dcp_rank == s->dcp_rank % d->dcp_size;
    return KVT_OK;
}

kvt_status pd_topo_check(const pd_desc *s, const pd_desc *d)
{
    if (!is_candidate(s, d)) return KVT_OK;
    pd_plan p;
    kvt_status st = pd_plan_compute(&p, s, d);
    if (st == KVT_OK) pd_plan_free(&p);
    return st;
}

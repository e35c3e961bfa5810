/* group_api.c - the public kvt_group_* entry points: argument checks,
 * lifetime, abort, reform, info. (kvt_config_digest lives with the option
 * table, in util/config.c.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "group/group.h"
#include "util/clock.h"
#include "util/hash.h"

static kvt_status check_params(const kvt_net *net, const kvt_group_params *p, const char *fn)
{
    KVT_CHECK_ARG(p->pp >= 1 && p->cp >= 1 && p->tp >= 1, "%s: pp %u, cp %u, tp %u must all "
                  "be >= 1", fn, p->pp, p->cp, p->tp);
    uint64_t n = (uint64_t)p->pp * p->cp * p->tp;
    KVT_CHECK_ARG(n == net->ranks, "%s: pp %u x cp %u x tp %u = %llu ranks, the net has %u",
                  fn, p->pp, p->cp, p->tp, (unsigned long long)n, net->ranks);
    KVT_CHECK_ARG(p->timeout_ms >= 1 && p->timeout_ms <= 600000,
                  "%s: timeout_ms %lld is outside 1..600000", fn, (long long)p->timeout_ms);
    KVT_CHECK_ARG(p->formation_timeout_ms >= 0 && p->formation_timeout_ms <= 2400000,
                  "%s: formation_timeout_ms %lld is outside 0..2400000", fn,
                  (long long)p->formation_timeout_ms);
    return KVT_OK;
}

static kvt_group *group_alloc(kvt_net *net)
{
    kvt_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    size_t n = (size_t)net->ranks * KVT_CH_COUNT;
    g->tx_seq = calloc(n, sizeof *g->tx_seq);
    g->rx_seq = calloc(n, sizeof *g->rx_seq);
    g->ups = net->rank == 0 ? calloc(net->ranks, sizeof *g->ups) : NULL;
    g->stash = net->rank == 0 ? calloc(net->ranks, sizeof *g->stash) : NULL;
    g->hello_att = net->rank == 0 ? calloc(net->ranks, sizeof *g->hello_att) : NULL;
    if (!g->tx_seq || !g->rx_seq ||
        (net->rank == 0 && (!g->ups || !g->stash || !g->hello_att))) {
        kvt_group_destroy(g);
        return NULL;
    }
    return g;
}

static void place(kvt_group *g)
{
    uint32_t tp = g->p.tp, cp = g->p.cp;
    g->pp_rank = g->rank / (cp * tp);
    g->cp_rank = g->rank / tp % cp;
    g->tp_rank = g->rank % tp;
    g->role = g->rank == 0 ? KVT_ROLE_SYNC_LEADER
            : (g->cp_rank == 0 && g->tp_rank == 0) ? KVT_ROLE_STAGE_LEADER : KVT_ROLE_MEMBER;
}

kvt_status kvt__group_create_ex(kvt_group **out, kvt_net *net, const kvt_group_params *p,
                                const kvt_group_overrides *ov)
{
    static const char fn[] = "kvt_group_create";
    KVT_CHECK_NOT_NULL(out, fn);
    KVT_CHECK_NOT_NULL(net, fn);
    KVT_CHECK_NOT_NULL_AS(p, "params", fn);
    kvt_status st = check_params(net, p, fn);
    if (st != KVT_OK) return st;
    kvt_group *g = group_alloc(net);
    if (!g) return kvt__fail(KVT_ENOMEM, "%s: out of memory for %u ranks", fn, net->ranks);
    g->net = net;
    g->p = *p;
    g->rank = net->rank;
    g->ranks = net->ranks;
    g->epoch = 0; /* none formed yet */
    g->attempt = kvt__now_ns() ^ ((uint64_t)g->rank << 48); /* unique per process and rank */
    g->proto_version = ov && ov->proto_version ? ov->proto_version : KVT_PROTO_VERSION;
    g->lib_version = ov && ov->lib_version ? ov->lib_version : kvt_version();
    place(g);
    int64_t b = p->formation_timeout_ms ? p->formation_timeout_ms : 4 * p->timeout_ms;
    st = kvt__group_form(g, b, kvt__now_ns(), p->epoch ? p->epoch : 1, KVT_OK, NULL);
    if (st != KVT_OK) {
        kvt_group_destroy(g);
        /* Formation's own steps (a member connecting its link: kvt_net_connect)
         * name themselves; lead with the call the user made. */
        if (strncmp(kvt_last_error(), fn, sizeof fn - 1) != 0) return kvt__wrap_error(st, fn);
        return st;
    }
    kvt__clear_error();
    *out = g;
    return KVT_OK;
}

kvt_status kvt_group_create(kvt_group **out, kvt_net *net, const kvt_group_params *params)
{
    return kvt__group_create_ex(out, net, params, NULL);
}

void kvt_group_destroy(kvt_group *g)
{
    if (!g) return;
    if (g->ups)
        for (uint32_t r = 0; r < g->ranks; r++) kvt__buf_free(&g->ups[r]);
    if (g->stash)
        for (uint32_t r = 0; r < g->ranks; r++) kvt__buf_free(&g->stash[r]);
    free(g->ups);
    free(g->stash);
    free(g->hello_att);
    kvt__buf_free(&g->rx);
    kvt__buf_free(&g->tx);
    free(g->tx_seq);
    free(g->rx_seq);
    free(g);
}

kvt_status kvt_group_abort(kvt_group *g, const char *reason)
{
    KVT_CHECK_NOT_NULL_AS(g, "group", "kvt_group_abort");
    if (g->aborted) {
        kvt__clear_error();
        return KVT_OK;
    }
    char me[48];
    (void)kvt__group_abortf(g, UINT32_MAX, "epoch %llu: %s raised: %s",
                            (unsigned long long)g->epoch, kvt__rank_str(g, g->rank, me, sizeof me),
                            reason ? reason : "(no reason given)");
    kvt__clear_error();
    return KVT_OK;
}

kvt_status kvt_group_reform(kvt_group *g, int64_t timeout_ms)
{
    static const char fn[] = "kvt_group_reform";
    KVT_CHECK_NOT_NULL_AS(g, "group", "kvt_group_reform");
    KVT_CHECK_ARG(timeout_ms >= 1 && timeout_ms <= 600000,
                  "kvt_group_reform: timeout_ms %lld is outside 1..600000", (long long)timeout_ms);
    /* Links closed since (a lost peer, a message cut by a deadline) are
     * connected again first, by 3/8 of the budget on the hub (it must read
     * the HELLOs by B/2), by 3/4 on a member (its WELCOME deadline);
     * transports without links do nothing. The handshake then runs within
     * what is left of the same budget. */
    uint64_t t0 = kvt__now_ns(), b = (uint64_t)timeout_ms * 1000000ull;
    uint64_t propose = g->epoch + 1;
    kvt_status st = kvt__net_connect(g->net, t0 + (kvt__group_is_leader(g) ? b / 8 * 3
                                                                          : b / 4 * 3));
    char why[KVT_NOTE_TEXT_MAX] = "";
    if (st != KVT_OK) {
        snprintf(why, sizeof why, "kvt_group_reform: epoch %llu: reconnecting: %s",
                 (unsigned long long)propose, kvt_last_error());
        /* The leader still answers the members that did reconnect, with a
         * REFUSE naming the rank that did not come back. */
    }
    st = kvt__group_form(g, timeout_ms, t0, propose, st, why);
    if (st == KVT_OK) kvt__clear_error();
    /* The handshake's steps name themselves; lead with the call the user made. */
    else if (strncmp(kvt_last_error(), fn, sizeof fn - 1) != 0) kvt__wrap_error(st, fn);
    return st;
}

kvt_status kvt_group_info_get(const kvt_group *g, kvt_group_info *out)
{
    KVT_CHECK_NOT_NULL_AS(g, "group", "kvt_group_info_get");
    KVT_CHECK_NOT_NULL(out, "kvt_group_info_get");
    *out = (kvt_group_info){g->rank, g->ranks, g->pp_rank, g->cp_rank, g->tp_rank,
                            g->role, g->epoch, g->steps, g->aborted ? 1 : 0};
    kvt__clear_error();
    return KVT_OK;
}

const char *kvt_group_diagnostic(const kvt_group *g)
{
    return g ? g->diag : "";
}

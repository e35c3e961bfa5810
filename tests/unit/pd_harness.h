/* pd_harness.h - PD test clusters: a bootstrap service, prefill senders and
 * decode receivers over emulated engines in one process, on 127.0.0.1. */
#ifndef KVT_TESTS_PD_HARNESS_H
#define KVT_TESTS_PD_HARNESS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include "support.h"
#include "layout/layout.h"
#include "net/stream.h"
#include "util/clock.h"
#include "util/err.h"

typedef struct pd_model {
    uint32_t layers;
    const uint32_t *mla_bytes; /* per layer bytes/token for MLA layers (NULL: MHA) */
    uint32_t heads, head_dim;  /* MHA: total KV heads (fewer than TP: GQA, each
                                  head on tp / heads consecutive ranks) */
} pd_model;

typedef struct pd_side_cfg {
    uint32_t tp, dcp, tpp;
    kvt_layout layout;
    const pd_model *model;
    bool strided; /* the ranks' KV in a token-major pool of every layer
                     (SGLang page_first, generalised), registered by strides */
} pd_side_cfg;

/* How the engine places an MHA model's heads at TP tp: heads per rank and
 * how many consecutive ranks hold the same ones. */
static inline uint32_t pd_model_replicas(const pd_model *m, uint32_t tp)
{
    return !m->mla_bytes && m->heads < tp ? tp / m->heads : 1;
}

static inline uint32_t pd_model_rank_heads(const pd_model *m, uint32_t tp)
{
    return m->heads * pd_model_replicas(m, tp) / tp;
}

typedef struct pd_rank {
    kvt_geometry *geo;
    kvt_emu *emu; /* the engine's KV, or (strided) the reference bytes only */
    uint8_t *pool; /* strided: token slot s holds every unit's bytes of it */
    void **bases;
    uint64_t *page_strides, *token_strides;
    kvt_pd_rank rank;
    uint32_t *pages, num_pages;
    kvt_pd_sender *s;
    kvt_pd_receiver *r;
} pd_rank;

typedef struct pd_cluster {
    kvt_pd_bootstrap *bs;
    uint16_t port;
    pd_rank *pre, *dec;
    uint32_t npre, ndec;
    pd_side_cfg pc, dc;
    uint32_t ntok;
    uint32_t *tokens;
    kvt_request req;
    kvt_pd_net_params net;
    kvt_pd_params base;
    uint32_t dec_replicas; /* kv_head_replicas the decode ranks declare; 0:
                              the engine's truth (pd_model_replicas) */
    bool consecutive_pages; /* page tables 1, 2, 3, ... (decode 2, 3, ...), so a
                               layer-first entry's pieces merge; else scattered */
    int32_t dec_checksum_threads; /* the receivers' (the senders': base's) */
} pd_cluster;

/* Whether the peer closed s within 10 s; what it sent before (a REFUSE
 * frame, its UCX worker address) is read and dropped. 10 s: beyond the 3 s
 * peer_timeout_ms that ends a bad peer's truncated frame in the tests. */
static inline bool pd_peer_closed(kvt_stream *s)
{
    uint8_t b[1];
    uint64_t dl = kvt__deadline_ns(10000);
    while (kvt__now_ns() < dl)
        if (kvt__stream_recv(s, b, 1, dl) == KVT_ECONN) return true;
    return false;
}

/* The consecutive page table of a rank, when the cluster asks for one. */
static inline void pd_consecutive(const pd_cluster *cl, pd_rank *r, uint32_t first)
{
    if (cl->consecutive_pages)
        for (uint32_t k = 0; k < r->num_pages; k++) r->pages[k] = k + first;
}

static inline kvt_geometry *pd_model_geo(const pd_model *m, uint32_t tp, uint32_t tpp, kvt_layout lay)
{
    kvt_geometry *g = NULL;
    if (kvt_geometry_create(&g, m->layers, tpp, lay) != KVT_OK) return NULL;
    for (uint32_t l = 0; l < m->layers; l++) {
        kvt_layer_spec s = {0};
        if (m->mla_bytes) {
            s.num_components = 1;
            s.component[0] = (kvt_component_spec){1, m->mla_bytes[l] / 2, 2};
        } else {
            s.num_components = 2;
            s.component[0] = s.component[1] = (kvt_component_spec){pd_model_rank_heads(m, tp), m->head_dim, 2};
        }
        if (kvt_geometry_set_layer(g, l, &s) != KVT_OK) return NULL;
    }
    return g;
}

static inline void pd_rank_init(pd_rank *r, const pd_side_cfg *c, uint32_t tp_rank, uint32_t dcp_rank,
                                uint32_t ntok)
{
    r->geo = pd_model_geo(c->model, c->tp, c->tpp, c->layout);
    assert_non_null(r->geo);
    uint32_t reps = pd_model_replicas(c->model, c->tp);
    r->rank = (kvt_pd_rank){c->tp, tp_rank, c->dcp, dcp_rank, reps};
    uint32_t local = ntok > dcp_rank ? (ntok - dcp_rank + c->dcp - 1) / c->dcp : 0;
    r->num_pages = (local + c->tpp - 1) / c->tpp + 1;
    uint32_t engine = r->num_pages * 2 + 3;
    assert_ok(kvt_emu_create(&r->emu, r->geo, engine));
    if (!c->model->mla_bytes)
        assert_ok(kvt_emu_set_first_head(r->emu, tp_rank / reps * pd_model_rank_heads(c->model, c->tp)));
    r->pages = calloc(r->num_pages, sizeof *r->pages);
    for (uint32_t i = 0; i < r->num_pages; i++) r->pages[i] = engine - 1 - 2 * i; /* scattered, reversed */
    if (!c->strided) return;
    uint64_t bpt = kvt__geo_bytes_per_token(r->geo), units = (uint64_t)c->model->layers * KVT_MAX_COMPONENTS;
    r->pool = malloc(engine * c->tpp * bpt);
    r->bases = calloc(units, sizeof *r->bases);
    r->page_strides = calloc(units, sizeof *r->page_strides);
    r->token_strides = calloc(units, sizeof *r->token_strides);
    assert_true(r->pool && r->bases && r->page_strides && r->token_strides);
    memset(r->pool, 0x5A, engine * c->tpp * bpt);
    for (uint32_t u = 0; u < units; u++) {
        r->bases[u] = r->pool + r->geo->unit_prefix[u];
        r->token_strides[u] = bpt;
        r->page_strides[u] = bpt * c->tpp;
    }
}

/* The rank's engine memory: the emulator's buffers, or the strided pool. */
static inline void pd_rank_memory(pd_rank *r, kvt_engine_memory *mem)
{
    assert_ok(kvt_emu_memory(r->emu, mem));
    if (!r->pool) return;
    *mem = (kvt_engine_memory){.num_pages = mem->num_pages, .layer_bases = r->bases,
                               .page_strides = r->page_strides, .token_strides = r->token_strides};
}

/* Writes the request's tokens [0, ntok) into a strided rank's pages. */
static inline void pd_strided_fill(pd_rank *r, const kvt_request *req, uint32_t ntok, uint32_t tpp)
{
    kvt_engine_memory mem;
    kvt_page_map *map = calloc(1, sizeof *map);
    pd_rank_memory(r, &mem);
    assert_ok(kvt__page_map_init(map, r->geo, &mem));
    for (uint32_t g = 0; g < ntok; g++)
        for (uint32_t l = 0; l < r->geo->num_layers; l++)
            for (uint32_t c = 0; c < r->geo->layers[l].num_components; c++)
                assert_ok(kvt_emu_token_kv(r->emu, req, g, l, c,
                                           kvt__token_addr(map, KVT_UNIT(l, c), r->pages[g / tpp], g % tpp),
                                           kvt__geo_token_bytes(r->geo, l, c)));
    free(map);
}

static inline kvt_pd_params pd_params(pd_cluster *cl, pd_rank *r, kvt_engine_memory *mem)
{
    kvt_pd_params p = cl->base;
    p.net = cl->net;
    p.bootstrap_port = cl->port;
    p.rank = r->rank;
    p.geo = r->geo;
    pd_rank_memory(r, mem);
    p.mem = mem;
    return p;
}

/* Starts the bootstrap and the prefill ranks (filled with the request). */
static inline void pd_cluster_start(pd_cluster *cl, const pd_side_cfg *pc, const pd_side_cfg *dc,
                                    uint32_t ntok)
{
    setenv("KVTIER_PD_QUIET", "1", 0);
    cl->pc = *pc;
    cl->dc = *dc;
    cl->ntok = ntok;
    cl->tokens = calloc(ntok, sizeof *cl->tokens);
    kvt_test_tokens(cl->tokens, ntok, 42 + ntok);
    cl->req = (kvt_request){cl->tokens, ntok, "ns", 2};
    assert_ok(kvt_pd_bootstrap_create(&cl->bs, &cl->net));
    assert_ok(kvt_pd_bootstrap_port(cl->bs, &cl->port));
    cl->npre = pc->tp * pc->dcp;
    cl->pre = calloc(cl->npre, sizeof *cl->pre);
    for (uint32_t i = 0; i < cl->npre; i++) {
        pd_rank *r = &cl->pre[i];
        pd_rank_init(r, pc, i / pc->dcp, i % pc->dcp, ntok);
        pd_consecutive(cl, r, 1);
        assert_int_equal(pc->dcp, 1);
        if (pc->strided)
            pd_strided_fill(r, &cl->req, ntok, pc->tpp);
        else
            assert_ok(kvt_emu_fill(r->emu, &cl->req, 0, ntok, r->pages, r->num_pages));
        kvt_engine_memory mem;
        kvt_pd_params p = pd_params(cl, r, &mem);
        assert_ok(kvt_pd_sender_create(&r->s, &p));
    }
}

/* Creates decode rank i; returns the status of kvt_pd_receiver_create. */
static inline kvt_status pd_cluster_decoder(pd_cluster *cl, uint32_t i)
{
    pd_rank *r = &cl->dec[i];
    pd_rank_init(r, &cl->dc, i / cl->dc.dcp, i % cl->dc.dcp, cl->ntok);
    pd_consecutive(cl, r, 2);
    if (cl->dec_replicas) r->rank.kv_head_replicas = cl->dec_replicas;
    assert_ok(kvt_emu_poison(r->emu, r->pages, r->num_pages));
    kvt_engine_memory mem;
    kvt_pd_params p = pd_params(cl, r, &mem);
    p.checksum_threads = cl->dec_checksum_threads;
    return kvt_pd_receiver_create(&r->r, &p);
}

static inline void pd_cluster_decoders(pd_cluster *cl)
{
    cl->ndec = cl->dc.tp * cl->dc.dcp;
    cl->dec = calloc(cl->ndec, sizeof *cl->dec);
    for (uint32_t i = 0; i < cl->ndec; i++) assert_ok(pd_cluster_decoder(cl, i));
}

static inline void pd_open_room(pd_cluster *cl, uint64_t room, uint32_t prefix)
{
    for (uint32_t i = 0; i < cl->ndec; i++) {
        pd_rank *r = &cl->dec[i];
        kvt_pd_room_params rp = {r->pages, r->num_pages, cl->ntok, prefix};
        assert_ok(kvt_pd_receiver_room(r->r, room, &rp));
    }
    for (uint32_t i = 0; i < cl->npre; i++) {
        pd_rank *r = &cl->pre[i];
        assert_ok(kvt_pd_sender_room(r->s, room));
        assert_ok(kvt_pd_sender_send(r->s, room, r->pages, r->num_pages, cl->ntok));
    }
}

static inline void pd_expect_room(pd_cluster *cl, uint64_t room, kvt_pd_poll want)
{
    for (uint32_t i = 0; i < cl->ndec; i++) {
        kvt_pd_poll st;
        kvt_pd_room_info info;
        kvt_status rc = kvt_pd_receiver_wait(cl->dec[i].r, room, 20000, &st);
        if (rc != KVT_OK || st != want) {
            kvt_pd_room_info_get(NULL, cl->dec[i].r, room, &info);
            fail_msg("decode %u room %llu: state %d (want %d): %s", i, (unsigned long long)room, st, want,
                     info.message);
        }
    }
    for (uint32_t i = 0; i < cl->npre; i++) {
        kvt_pd_poll st;
        kvt_pd_room_info info;
        kvt_status rc = kvt_pd_sender_wait(cl->pre[i].s, room, 20000, &st);
        if (rc != KVT_OK || st != want) {
            kvt_pd_room_info_get(cl->pre[i].s, NULL, room, &info);
            fail_msg("prefill %u room %llu: state %d (want %d): %s", i, (unsigned long long)room, st, want,
                     info.message);
        }
    }
}

/* Checks every byte of every decode rank's tokens [prefix, ntok) against
 * the emulated engine's pure function; returns mismatching bytes. */
static inline uint64_t pd_verify(pd_cluster *cl, uint32_t prefix)
{
    uint64_t bad = 0;
    uint8_t want[1 << 16];
    for (uint32_t i = 0; i < cl->ndec; i++) {
        pd_rank *r = &cl->dec[i];
        kvt_engine_memory mem;
        kvt_page_map *map = calloc(1, sizeof *map);
        pd_rank_memory(r, &mem);
        assert_ok(kvt__page_map_init(map, r->geo, &mem));
        uint32_t n = cl->dc.dcp, k = r->rank.dcp_rank;
        for (uint32_t g = prefix; g < cl->ntok; g++) {
            if (g % n != k) continue;
            uint32_t lt = g / n, page = r->pages[lt / cl->dc.tpp], slot = lt % cl->dc.tpp;
            for (uint32_t l = 0; l < r->geo->num_layers; l++)
                for (uint32_t c = 0; c < r->geo->layers[l].num_components; c++) {
                    uint64_t tb = kvt__geo_token_bytes(r->geo, l, c);
                    assert_ok(kvt_emu_token_kv(r->emu, &cl->req, g, l, c, want, tb));
                    uint8_t *got = kvt__token_addr(map, KVT_UNIT(l, c), page, slot);
                    if (memcmp(got, want, tb) != 0) bad++;
                }
        }
        free(map);
    }
    return bad;
}

static inline void pd_rank_free(pd_rank *r)
{
    kvt_pd_sender_destroy(r->s);
    kvt_pd_receiver_destroy(r->r);
    kvt_emu_destroy(r->emu);
    kvt_geometry_destroy(r->geo);
    free(r->pages);
    free(r->pool);
    free(r->bases);
    free(r->page_strides);
    free(r->token_strides);
}

static inline void pd_cluster_stop(pd_cluster *cl)
{
    for (uint32_t i = 0; i < cl->ndec; i++) pd_rank_free(&cl->dec[i]);
    for (uint32_t i = 0; i < cl->npre; i++) pd_rank_free(&cl->pre[i]);
    kvt_pd_bootstrap_destroy(cl->bs);
    free(cl->dec);
    free(cl->pre);
    free(cl->tokens);
    memset(cl, 0, sizeof *cl);
}

/* One whole hand-off: start, one room, wait, verify, stop. */
static inline void pd_roundtrip(const pd_side_cfg *pc, const pd_side_cfg *dc, uint32_t ntok, uint32_t prefix)
{
    pd_cluster cl = {0};
    pd_cluster_start(&cl, pc, dc, ntok);
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, prefix);
    pd_expect_room(&cl, 7, KVT_PD_SUCCESS);
    assert_int_equal(pd_verify(&cl, prefix), 0);
    pd_cluster_stop(&cl);
}

/* ---- the PD handshake between two threads over a socket pair ---- */

/* One end: its socket, the secret it holds, and what it got. key receives
 * the session key after a handshake with a secret (left alone otherwise). */
typedef struct auth_end {
    int fd;
    const char *secret;
    kvt_status st;
    uint8_t key[KVT_AUTH_MAC];
    char msg[KVT_ERRMSG_MAX];
} auth_end;

static inline void *auth_server_main(void *arg)
{
    auth_end *e = arg;
    kvt_stream_auth a = {(const uint8_t *)e->secret, e->secret ? strlen(e->secret) : 0, "test server", e->key};
    e->st = kvt__stream_auth_server(e->fd, &a, kvt__deadline_ns(5000));
    snprintf(e->msg, sizeof e->msg, "%s", kvt_last_error());
    return NULL;
}

/* Runs the handshake between a server and a client holding these secrets
 * over a socket pair. */
static inline void handshake_pair(auth_end *srv, auth_end *cli)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    srv->fd = sv[0];
    cli->fd = sv[1];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, auth_server_main, srv), 0);
    kvt_stream_auth a = {(const uint8_t *)cli->secret, cli->secret ? strlen(cli->secret) : 0, "test client",
                         cli->key};
    cli->st = kvt__stream_auth_client(cli->fd, &a, kvt__deadline_ns(5000));
    snprintf(cli->msg, sizeof cli->msg, "%s", kvt_last_error());
    close(cli->fd); /* a failed client hangs up, as kvt__stream_connect does */
    pthread_join(th, NULL);
    close(srv->fd);
}

#endif

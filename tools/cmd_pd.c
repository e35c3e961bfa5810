/* cmd_pd.c - `kvtier pd ...`: run the hand-off's ends by hand, in separate
 * terminals (or hosts), over the emulated engine:
 *   kvtier pd bootstrap [--port P] [--host H]
 *   kvtier pd prefill --bootstrap-port P [--tp N --rank R] [--tokens T] [--room ID] [--model M]
 *   kvtier pd decode  --bootstrap-port P [--tp N --rank R --dcp N --dcp-rank R] [--tokens T] [--room ID]
 * prefill fills the request's KV and sends it; decode receives it and
 * verifies every byte. --secret S (16+ bytes) on all three turns on the
 * HMAC challenge. Exit code 0 on Success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cmds.h"
#include "kvtier.h"

typedef struct pd_opts {
    const char *host, *secret, *model;
    unsigned port, bport, tp, rank, dcp, dcp_rank, tokens, tpp;
    unsigned long long room;
    int seconds;
} pd_opts;

static int parse(int argc, char **argv, pd_opts *o)
{
    *o = (pd_opts){.model = "tiny", .tp = 1, .dcp = 1, .tokens = 1000, .tpp = 16, .room = 1, .seconds = 60};
    for (int i = 2; i < argc; i += 2) { /* every option takes one value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "kvtier pd: %s needs a value\n", a), -1;
        if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--secret")) o->secret = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--port")) o->port = (unsigned)atoi(v);
        else if (!strcmp(a, "--bootstrap-port")) o->bport = (unsigned)atoi(v);
        else if (!strcmp(a, "--tp")) o->tp = (unsigned)atoi(v);
        else if (!strcmp(a, "--rank")) o->rank = (unsigned)atoi(v);
        else if (!strcmp(a, "--dcp")) o->dcp = (unsigned)atoi(v);
        else if (!strcmp(a, "--dcp-rank")) o->dcp_rank = (unsigned)atoi(v);
        else if (!strcmp(a, "--tokens")) o->tokens = (unsigned)atoi(v);
        else if (!strcmp(a, "--page")) o->tpp = (unsigned)atoi(v);
        else if (!strcmp(a, "--room")) o->room = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seconds")) o->seconds = atoi(v);
        else return fprintf(stderr, "kvtier pd: unknown option %s\n", a), -1;
    }
    return 0;
}

static kvt_pd_net_params net_of(const pd_opts *o)
{
    return (kvt_pd_net_params){.bind_host = o->host, .port = (uint16_t)o->port, .secret = o->secret,
                               .secret_len = o->secret ? strlen(o->secret) : 0};
}

static int fail(const char *what)
{
    fprintf(stderr, "kvtier pd: %s: %s\n", what, kvt_last_error());
    return 1;
}

static int run_bootstrap(const pd_opts *o)
{
    kvt_pd_net_params n = net_of(o);
    kvt_pd_bootstrap *bs;
    uint16_t port;
    if (kvt_pd_bootstrap_create(&bs, &n) || kvt_pd_bootstrap_port(bs, &port)) return fail("bootstrap");
    printf("bootstrap listening on %s:%u for %d s\n", o->host ? o->host : "127.0.0.1", port, o->seconds);
    fflush(stdout);
    sleep((unsigned)o->seconds);
    kvt_pd_bootstrap_destroy(bs);
    return 0;
}

static int run_end(const pd_opts *o, int prefill)
{
    kvt_geometry *g = NULL;
    kvt_emu *emu = NULL;
    if (kvt_geometry_preset(&g, o->model, o->tpp, o->tp)) return fail("geometry");
    uint32_t local = prefill ? o->tokens : (o->tokens - o->dcp_rank + o->dcp - 1) / o->dcp;
    uint32_t np = (local + o->tpp - 1) / o->tpp, *pages = calloc(np + 1, sizeof *pages);
    for (uint32_t i = 0; i < np; i++) pages[i] = i;
    uint32_t *tok = calloc(o->tokens, sizeof *tok);
    for (uint32_t i = 0; i < o->tokens; i++) tok[i] = i * 2654435761u % 128000;
    kvt_request req = {tok, o->tokens, NULL, 0};
    kvt_engine_memory mem;
    if (kvt_emu_create(&emu, g, np + 1) || kvt_emu_memory(emu, &mem)) return fail("engine");
    kvt_pd_params p = {.net = net_of(o), .bootstrap_host = o->host, .bootstrap_port = (uint16_t)o->bport,
                       .rank = {o->tp, o->rank, o->dcp, o->dcp_rank}, .geo = g, .mem = &mem,
                       .connect_timeout_ms = (uint32_t)o->seconds * 1000};
    kvt_pd_poll st = KVT_PD_FAILED;
    int rc = 1;
    if (prefill) {
        kvt_pd_sender *s;
        kvt_emu_fill(emu, &req, 0, o->tokens, pages, np);
        if (kvt_pd_sender_create(&s, &p)) return fail("prefill");
        if (kvt_pd_sender_room(s, o->room) || kvt_pd_sender_send(s, o->room, pages, np, o->tokens)) return fail("send");
        kvt_pd_sender_wait(s, o->room, o->seconds * 1000, &st);
        printf("prefill room %llu: %s\n", o->room, st == KVT_PD_SUCCESS ? "Success" : "Failed");
        rc = st != KVT_PD_SUCCESS;
        kvt_pd_sender_destroy(s);
    } else {
        kvt_pd_receiver *r;
        if (kvt_pd_receiver_create(&r, &p)) return fail("decode");
        kvt_pd_room_params rp = {pages, np, o->tokens, 0};
        if (kvt_pd_receiver_room(r, o->room, &rp)) return fail("room");
        kvt_pd_receiver_wait(r, o->room, o->seconds * 1000, &st);
        kvt_pd_room_info info;
        kvt_pd_room_info_get(NULL, r, o->room, &info);
        kvt_verify_result v = {0};
        if (st == KVT_PD_SUCCESS && o->dcp == 1) kvt_emu_verify(emu, &req, 0, o->tokens, pages, np, &v);
        printf("decode room %llu: %s, %llu bytes, %llu mismatching bytes%s%s\n", o->room,
               st == KVT_PD_SUCCESS ? "Success" : "Failed", (unsigned long long)info.bytes,
               (unsigned long long)v.mismatches, info.message[0] ? ": " : "", info.message);
        rc = st != KVT_PD_SUCCESS || v.mismatches;
        kvt_pd_receiver_destroy(r);
    }
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(g);
    free(pages);
    free(tok);
    return rc;
}

int kvt_cmd_pd(int argc, char **argv)
{
    pd_opts o;
    if (argc < 2 || parse(argc, argv, &o)) {
        fprintf(stderr, "usage: kvtier pd bootstrap|prefill|decode [options] (see tools/cmd_pd.c)\n");
        return 2;
    }
    if (!strcmp(argv[1], "bootstrap")) return run_bootstrap(&o);
    if (!strcmp(argv[1], "prefill")) return run_end(&o, 1);
    if (!strcmp(argv[1], "decode")) return run_end(&o, 0);
    fprintf(stderr, "kvtier pd: unknown role \"%s\"\n", argv[1]);
    return 2;
}

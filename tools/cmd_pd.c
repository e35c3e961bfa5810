/* cmd_pd.c - `kvtier pd ...`: run the hand-off's ends by hand, in separate
 * terminals (or hosts), over the emulated engine:
 *   kvtier pd bootstrap [--port P] [--host H]
 *   kvtier pd prefill --bootstrap-port P [--tp N --rank R] [--tokens T] [--room ID] [--model M]
 *   kvtier pd decode  --bootstrap-port P [--tp N --rank R --dcp N --dcp-rank R] [--tokens T] [--room ID]
 * prefill fills the request's KV and sends it; decode receives it and
 * verifies every byte. --secret S (16+ bytes), or --secret-file F (the
 * same bytes from a file, so they do not show in ps), on all three turns on the
 * HMAC challenge; --transport ucx moves the data over UCX; --json prints
 * one JSON object per end for scripts. Exit code 0 on Success. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "cli_util.h"
#include "cmds.h"
#include "kvtier.h"
#include "server/auth.h"
#include "util/clock.h"
#include "util/file.h"

typedef struct pd_opts {
    const char *host, *model;
    const uint8_t *secret; /* --secret's bytes, or --secret-file's (in file_secret) */
    size_t secret_len;
    uint8_t *file_secret;  /* kvt__srv_secret_load's, freed at the end */
    unsigned port, bport, tp, rank, dcp, dcp_rank, tokens, tpp;
    unsigned long long room;
    int seconds;
    bool json;
    bool insecure; /* --insecure: listen beyond loopback without a secret */
    kvt_pd_transport transport;
} pd_opts;

static int usage(FILE *to)
{
    fprintf(to,
            "usage: kvtier pd bootstrap [--port P] [--host H] [--seconds S]\n"
            "       kvtier pd prefill --bootstrap-port P [--tp N --rank R] [--model M] [--page T]\n"
            "                         [--tokens T] [--room ID]\n"
            "       kvtier pd decode  --bootstrap-port P [--tp N --rank R] [--dcp N --dcp-rank R]\n"
            "                         [--model M] [--page T] [--tokens T] [--room ID]\n"
            "Runs the ends of a prefill -> decode hand-off by hand, over an emulated engine:\n"
            "prefill computes the request's KV and sends it, decode receives it into its own\n"
            "layout and checks every byte. Start the bootstrap first, then the ranks, in any\n"
            "order, in separate terminals or hosts.\n"
            "  --model M     tiny (default), llama3-8b, llama3-70b, deepseek-v3 (MLA)\n"
            "  --page T      tokens per engine page (default 16); the two sides may differ\n"
            "  --tp/--rank   this side's tensor-parallel size and rank (default 1, 0)\n"
            "  --dcp/--dcp-rank  decode context parallelism (MLA models; default 1, 0)\n"
            "  --host H      bind / bootstrap address (default 127.0.0.1)\n"
            "  --secret S    shared secret (16+ bytes) on every end: peers must prove it\n"
            "  --secret-file F  the same, read from file F (16..1024 bytes; not shown by ps)\n"
            "                (required when --host is not a 127.x address, unless --insecure)\n"
            "  --insecure    bootstrap/prefill: listen beyond loopback without a secret\n"
            "  --transport T tcp (default) or ucx (UCX_TLS etc. from the environment)\n"
            "  --seconds S   how long to wait (default 60)\n"
            "  --json        prefill/decode: print the result as one JSON object (state\n"
            "                changes are not printed)\n"
            "Exit code 0 when the room ends Success (and, on decode, every byte verifies).\n");
    return to == stdout ? 0 : 2;
}

/* A decimal in [lo, hi] or an error naming the option. */
static int number(const char *opt, const char *v, unsigned long long lo, unsigned long long hi,
                  unsigned long long *out)
{
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        fprintf(stderr, "kvtier pd: %s: \"%s\" is not a number in %llu..%llu\n", opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse(int argc, char **argv, pd_opts *o)
{
    static const char *const takes_value[] = {"--host", "--transport", "--secret", "--secret-file", "--model",
        "--port", "--bootstrap-port", "--tp", "--rank", "--dcp", "--dcp-rank", "--tokens", "--page",
        "--room", "--seconds", NULL};
    *o = (pd_opts){.model = "tiny", .tp = 1, .dcp = 1, .tokens = 1000, .tpp = 16, .room = 1, .seconds = 60};
    for (int i = 2; i < argc; i += 2) { /* every option but --json and --insecure takes one value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long x = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
        if (!strcmp(a, "--json") || !strcmp(a, "--insecure")) {
            if (!strcmp(a, "--json")) o->json = true;
            else o->insecure = true;
            i--;
            continue;
        }
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("pd", a, false), -1;
        if (!v) return cli_bad_arg("pd", a, true), -1;
        if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--transport") && (!strcmp(v, "tcp") || !strcmp(v, "ucx")))
            o->transport = !strcmp(v, "ucx") ? KVT_PD_UCX : KVT_PD_TCP;
        else if (!strcmp(a, "--transport"))
            return fprintf(stderr, "kvtier pd: --transport is \"%s\"; use tcp or ucx\n", v), -1;
        else if (!strcmp(a, "--secret") || !strcmp(a, "--secret-file")) {
            if (o->secret) return fprintf(stderr, "kvtier pd: give one of --secret and --secret-file\n"), -1;
            if (!strcmp(a, "--secret")) o->secret = (const uint8_t *)v, o->secret_len = strlen(v);
            else if (kvt__srv_secret_load(v, "kvtier pd: --secret-file", &o->file_secret, &o->secret_len))
                return fprintf(stderr, "%s\n", kvt_last_error()), -1;
            else o->secret = o->file_secret;
        }
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--port")) { if (number(a, v, 0, 65535, &x)) return -1; o->port = (unsigned)x; }
        else if (!strcmp(a, "--bootstrap-port")) { if (number(a, v, 1, 65535, &x)) return -1; o->bport = (unsigned)x; }
        else if (!strcmp(a, "--tp")) { if (number(a, v, 1, 1024, &x)) return -1; o->tp = (unsigned)x; }
        else if (!strcmp(a, "--rank")) { if (number(a, v, 0, 1023, &x)) return -1; o->rank = (unsigned)x; }
        else if (!strcmp(a, "--dcp")) { if (number(a, v, 1, 1024, &x)) return -1; o->dcp = (unsigned)x; }
        else if (!strcmp(a, "--dcp-rank")) { if (number(a, v, 0, 1023, &x)) return -1; o->dcp_rank = (unsigned)x; }
        else if (!strcmp(a, "--tokens")) { if (number(a, v, 2, 1u << 20, &x)) return -1; o->tokens = (unsigned)x; }
        else if (!strcmp(a, "--page")) { if (number(a, v, 1, 4096, &x)) return -1; o->tpp = (unsigned)x; }
        else if (!strcmp(a, "--room")) { if (number(a, v, 0, ~0ull, &x)) return -1; o->room = x; }
        else if (!strcmp(a, "--seconds")) { if (number(a, v, 1, 86400, &x)) return -1; o->seconds = (int)x; }
        else return cli_bad_arg("pd", a, false), -1;
    }
    if (o->rank >= o->tp || o->dcp_rank >= o->dcp)
        return fprintf(stderr, "kvtier pd: --rank must be below --tp and --dcp-rank below --dcp\n"), -1;
    return 0;
}

static kvt_pd_net_params net_of(const pd_opts *o)
{
    return (kvt_pd_net_params){.bind_host = o->host, .port = (uint16_t)o->port, .secret = o->secret,
                               .secret_len = o->secret_len, .transport = o->transport,
                               .allow_insecure = o->insecure};
}

static int fail(const char *what)
{
    fprintf(stderr, "kvtier pd: %s: %s\n", what, kvt_last_error());
    if (strstr(kvt_last_error(), "allow_insecure")) /* the library names its field; say the options */
        fprintf(stderr, "kvtier pd: here: --secret S or --secret-file F (16+ bytes, on every end) "
                        "or --insecure\n");
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

/* A TP rank of an MHA/GQA model holds its slice of the heads (or one
 * replicated head when tp exceeds them: *replicas = tp / heads ranks hold
 * it); MLA is replicated: head 0. */
static kvt_status set_heads(kvt_emu *emu, const kvt_geometry *g, const pd_opts *o, uint32_t *replicas)
{
    *replicas = 0;
    kvt_layer_spec mine, all;
    kvt_geometry *g1 = NULL;
    kvt_status st = kvt_geometry_layer(g, 0, &mine);
    if (!st) st = kvt_geometry_preset(&g1, o->model, o->tpp, 1);
    if (!st) st = kvt_geometry_layer(g1, 0, &all);
    kvt_geometry_destroy(g1);
    if (st || mine.num_components == 1) return st;
    uint32_t heads = all.component[0].kv_heads;
    uint32_t first = o->tp <= heads ? o->rank * (heads / o->tp) : o->rank / (o->tp / heads);
    if (o->tp > heads) *replicas = o->tp / heads;
    return kvt_emu_set_first_head(emu, first);
}

/* Decode with DCP N holds global token i = j * N + dcp_rank at its local
 * position j: checks each such token's bytes in every layer's buffers. */
static uint64_t verify_dcp(const kvt_emu *emu, const kvt_geometry *g, const kvt_request *req,
                           const pd_opts *o, const kvt_engine_memory *mem, const uint32_t *pages,
                           uint32_t local)
{
    kvt_geometry_info gi;
    uint8_t want[1 << 16];
    uint64_t bad = 0;
    if (kvt_geometry_info_get(g, &gi) || gi.layout != KVT_LAYOUT_LAYER_FIRST) return ~0ull;
    for (uint32_t l = 0; l < gi.num_layers; l++) {
        kvt_layer_spec ls;
        kvt_geometry_layer(g, l, &ls);
        for (uint32_t c = 0; c < ls.num_components; c++) {
            uint64_t tb = 0;
            kvt_geometry_token_bytes(g, l, c, &tb);
            const uint8_t *base = mem->layer_bases[l * KVT_MAX_COMPONENTS + c];
            for (uint32_t j = 0; j < local && tb <= sizeof want; j++) {
                uint32_t i = j * o->dcp + o->dcp_rank;
                const uint8_t *have = base + ((uint64_t)pages[j / o->tpp] * o->tpp + j % o->tpp) * tb;
                if (kvt_emu_token_kv(emu, req, i, l, c, want, tb) || memcmp(want, have, tb)) bad += tb;
            }
        }
    }
    return bad;
}

typedef kvt_status (*poll_fn)(void *end, uint64_t room, kvt_pd_poll *out);
static kvt_status poll_sender(void *s, uint64_t room, kvt_pd_poll *out) { return kvt_pd_sender_poll(s, room, out); }
static kvt_status poll_receiver(void *r, uint64_t room, kvt_pd_poll *out) { return kvt_pd_receiver_poll(r, room, out); }

typedef struct end_result {
    kvt_pd_poll state;
    double seconds, xfer_seconds; /* since the room opened / since Transferring was seen */
} end_result;

/* Polls the room every millisecond until it ends or --seconds pass, saying
 * each state change on stderr (a person waiting sees what it waits for). */
static end_result wait_room(void *end, poll_fn poll, const pd_opts *o, const char *side)
{
    uint64_t t0 = kvt__now_ns(), dl = t0 + (uint64_t)o->seconds * 1000000000ull, tx = 0;
    kvt_pd_poll st = KVT_PD_BOOTSTRAPPING, seen = (kvt_pd_poll)-1;
    for (;;) {
        if (poll(end, o->room, &st) != KVT_OK) st = KVT_PD_FAILED;
        uint64_t now = kvt__now_ns();
        if (st != seen && !o->json)
            fprintf(stderr, "%s room %llu: %s (%.3f s)\n", side, o->room, kvt_pd_poll_name(st), (now - t0) / 1e9);
        if (st == KVT_PD_TRANSFERRING && !tx) tx = now;
        seen = st;
        if (st == KVT_PD_SUCCESS || st == KVT_PD_FAILED || now >= dl) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    uint64_t now = kvt__now_ns();
    return (end_result){st, (now - t0) / 1e9, tx ? (now - tx) / 1e9 : 0};
}

/* One line for people, or one JSON object for scripts. mismatches < 0:
 * not verified on this end (prefill). */
static void report(const pd_opts *o, const char *side, end_result e, uint64_t bytes, long long mismatches,
                   const char *msg)
{
    double gbps = e.xfer_seconds > 0 ? bytes / e.xfer_seconds / 1e9 : 0;
    if (!o->json) {
        printf("%s room %llu: %s, %llu bytes in %.3f s (%.2f GB/s while transferring)", side, o->room,
               kvt_pd_poll_name(e.state), (unsigned long long)bytes, e.seconds, gbps);
        if (mismatches >= 0) printf(", %lld mismatching bytes", mismatches);
        printf("%s%s\n", msg[0] ? ": " : "", msg);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "side", side);
    cJSON_AddNumberToObject(j, "room", (double)o->room);
    cJSON_AddStringToObject(j, "state", kvt_pd_poll_name(e.state));
    cJSON_AddNumberToObject(j, "bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "seconds", e.seconds);
    cJSON_AddNumberToObject(j, "transfer_gbps", gbps);
    if (mismatches >= 0) cJSON_AddNumberToObject(j, "mismatching_bytes", (double)mismatches);
    cJSON_AddStringToObject(j, "transport", o->transport == KVT_PD_UCX ? "ucx" : "tcp");
    cJSON_AddStringToObject(j, "message", msg);
    char *s = cJSON_PrintUnformatted(j);
    if (s) puts(s);
    free(s);
    cJSON_Delete(j);
}

static int run_end(const pd_opts *o, int prefill)
{
    kvt_geometry *g = NULL;
    kvt_emu *emu = NULL;
    kvt_pd_sender *s = NULL;
    kvt_pd_receiver *r = NULL;
    if (kvt_geometry_preset(&g, o->model, o->tpp, o->tp)) return fail("geometry");
    uint32_t local = prefill ? o->tokens : (o->tokens - o->dcp_rank + o->dcp - 1) / o->dcp;
    uint32_t np = (local + o->tpp - 1) / o->tpp, *pages = calloc(np + 1, sizeof *pages);
    uint32_t *tok = calloc(o->tokens, sizeof *tok);
    int rc = 1;
    if (!pages || !tok) {
        fprintf(stderr, "kvtier pd: out of memory for %u tokens\n", o->tokens);
        goto out;
    }
    for (uint32_t i = 0; i < np; i++) pages[i] = i;
    for (uint32_t i = 0; i < o->tokens; i++) tok[i] = i * 2654435761u % 128000;
    kvt_request req = {tok, o->tokens, NULL, 0};
    /* The emulated engine holds the whole prompt: refuse what the machine
     * cannot give at once (1 Mi tokens of a 70B model is ~340 GB), rather
     * than paging for ever past --seconds. */
    kvt_geometry_info gi;
    uint64_t need = 0, avail = kvt__mem_available();
    if (!kvt_geometry_info_get(g, &gi)) need = (uint64_t)(np + 1) * gi.bytes_per_page;
    if (avail && need > avail) {
        fprintf(stderr, "kvtier pd: %u tokens of %s at tp %u need %llu bytes of emulated engine "
                "memory; this machine can give %llu now: lower --tokens\n", o->tokens, o->model,
                o->tp, (unsigned long long)need, (unsigned long long)avail);
        goto out;
    }
    uint64_t deadline = kvt__deadline_ns((int64_t)o->seconds * 1000);
    kvt_engine_memory mem;
    if (kvt_emu_create(&emu, g, np + 1) || kvt_emu_memory(emu, &mem)) {
        rc = fail("engine");
        goto out;
    }
    /* A TP rank of an MHA/GQA model holds its slice of the heads; MLA is
     * replicated, so every rank holds head 0. */
    uint32_t replicas;
    if (set_heads(emu, g, o, &replicas)) {
        rc = fail("geometry");
        goto out;
    }
    kvt_pd_params p = {.net = net_of(o), .bootstrap_host = o->host, .bootstrap_port = (uint16_t)o->bport,
                       .rank = {o->tp, o->rank, o->dcp, o->dcp_rank, replicas}, .geo = g, .mem = &mem,
                       .connect_timeout_ms = (uint32_t)o->seconds * 1000};
    kvt_pd_poll st = KVT_PD_FAILED;
    if (prefill) {
        kvt_emu_fill(emu, &req, 0, o->tokens, pages, np);
        if (kvt__now_ns() > deadline) {
            fprintf(stderr, "kvtier pd prefill: --seconds (%d) ran out while filling %u tokens\n",
                    o->seconds, o->tokens);
            goto out;
        }
        if (kvt_pd_sender_create(&s, &p)) {
            rc = fail("prefill");
            goto out;
        }
        if (kvt_pd_sender_room(s, o->room) || kvt_pd_sender_send(s, o->room, pages, np, o->tokens)) {
            rc = fail("send");
            goto out;
        }
        end_result e = wait_room(s, poll_sender, o, "prefill");
        kvt_pd_room_info info = {0};
        kvt_pd_room_info_get(s, NULL, o->room, &info);
        st = e.state;
        report(o, "prefill", e, info.bytes, -1, info.message);
        rc = st != KVT_PD_SUCCESS;
    } else {
        if (kvt_pd_receiver_create(&r, &p)) {
            rc = fail("decode");
            goto out;
        }
        kvt_pd_room_params rp = {pages, np, o->tokens, 0};
        if (kvt_pd_receiver_room(r, o->room, &rp)) {
            rc = fail("room");
            goto out;
        }
        end_result e = wait_room(r, poll_receiver, o, "decode");
        st = e.state;
        kvt_pd_room_info info = {0};
        kvt_pd_room_info_get(NULL, r, o->room, &info);
        kvt_verify_result v = {0};
        if (st == KVT_PD_SUCCESS && o->dcp == 1) kvt_emu_verify(emu, &req, 0, o->tokens, pages, np, &v);
        else if (st == KVT_PD_SUCCESS) v.mismatches = verify_dcp(emu, g, &req, o, &mem, pages, local);
        report(o, "decode", e, info.bytes, st == KVT_PD_SUCCESS ? (long long)v.mismatches : -1, info.message);
        rc = st != KVT_PD_SUCCESS || v.mismatches;
    }
out: /* every exit: a failed end leaks nothing (cli_pd.sh runs them under ASan) */
    kvt_pd_sender_destroy(s);
    kvt_pd_receiver_destroy(r);
    kvt_emu_destroy(emu);
    kvt_geometry_destroy(g);
    free(pages);
    free(tok);
    return rc;
}

int kvt_cmd_pd(int argc, char **argv)
{
    pd_opts o;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return usage(argc < 2 ? stderr : stdout);
    int rc = parse(argc, argv, &o);
    if (rc) rc = rc > 0 ? 0 : 2; /* --help, or a usage error */
    else if (!strcmp(argv[1], "bootstrap")) rc = run_bootstrap(&o);
    else if (!strcmp(argv[1], "prefill")) rc = run_end(&o, 1);
    else if (!strcmp(argv[1], "decode")) rc = run_end(&o, 0);
    else {
        fprintf(stderr, "kvtier pd: unknown role \"%s\"\n", argv[1]);
        rc = 2;
    }
    if (o.file_secret) kvt__srv_secret_free(o.file_secret, o.secret_len);
    return rc;
}

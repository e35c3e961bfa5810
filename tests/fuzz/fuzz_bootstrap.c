/* fuzz_bootstrap.c - the PD bootstrap service's request decoding, as any
 * host that can reach its port sends it: read_request (frame header, the
 * max_req bound, the body), then per type decode_prefill + on_register
 * (store_prefill: configuration conflicts, renewals, moves) and
 * on_unregister, on_lookup (pd_desc_decode of the decode rank, topo:
 * pd_topo_check against every entry, missing_for / needed_by naming the
 * prefill ranks still missing, the TOPO encoding), and refuse for anything
 * else. The service is the directory every prefill and decode rank trusts
 * for addresses: a stranger must get a refusal, never a crash, a stale or
 * corrupted entry, or a request that costs it unbounded time.
 *
 * One service runs for the whole run (started in LLVMFuzzerInitialize, no
 * secret), holding one fixed registration: prefill rank 0 of TP 2 (a small
 * MHA model: 2 layers, 4 KV heads of 8 bf16 elements, 4-token pages), so a
 * lookup meets a live entry and a missing rank. Input: up to 4 requests
 * back to back, each a 48-byte PD frame header and the body_len bytes it
 * announces (cut at the input's end); each goes on its own authenticated
 * connection (the service answers one request per connection), the write
 * side is shut, and the answer is read until the service closes (2 s
 * bound). After the input, every registration it made is unregistered and
 * the fixed one renewed, so each input starts from the same directory. The
 * service's handlers are its own threads; the requests are sequential. */
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "kvtier.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/desc.h"
#include "pd/wire.h"
#include "util/clock.h"
#include "util/err.h"

#define MAX_REQUESTS 4
#define BASE_PORT 5000 /* the fixed entry's data address (nobody connects) */

static kvt_pd_bootstrap *g_bs;
static uint16_t g_port;
static pd_desc g_base; /* the fixed registration */
static const kvt_pd_net_params g_client = {.max_frame = 64u << 20, .peer_timeout_ms = 3000};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("KVTIER_PD_QUIET", "1", 0);
    /* leases of 4 x 60 s: nothing expires during a run */
    kvt_pd_net_params np = {.peer_timeout_ms = 60000};
    if (kvt_pd_bootstrap_create(&g_bs, &np) || kvt_pd_bootstrap_port(g_bs, &g_port)) abort();
    kvt_geometry *g = NULL;
    kvt_layer_spec s = {.num_components = 2};
    s.component[0] = s.component[1] = (kvt_component_spec){2, 8, 2};
    if (kvt_geometry_create(&g, 2, 4, KVT_LAYOUT_LAYER_FIRST) || kvt_geometry_set_layers(g, 0, 2, &s)) abort();
    kvt_pd_rank r = {2, 0, 1, 0, 0};
    if (pd_desc_from_geometry(&g_base, g, &r, PD_ROLE_PREFILL)) abort();
    kvt_geometry_destroy(g);
    return 0;
}

static void renew_base(void)
{
    static uint8_t token[PD_BS_TOKEN_LEN]; /* the fixed entry's, from its first OK */
    kvt_stream_auth a = {0};
    if (pd_bootstrap_register(&g_client, &a, "127.0.0.1", g_port, &g_base, "127.0.0.1", BASE_PORT,
                              kvt__deadline_ns(2000), token, NULL) != KVT_OK) {
        fprintf(stderr, "fuzz_bootstrap: cannot register the fixed entry: %s\n", kvt_last_error());
        abort();
    }
}

/* Sends one raw request on its own connection; *ans gets the answer's
 * header (type 0 when none came) and body (room for PD_BS_TOKEN_LEN bytes:
 * a registration's OK carries the entry's token, which its unregistration
 * needs). */
static void request(const uint8_t *p, size_t n, pd_hdr *ans, uint8_t body[PD_BS_TOKEN_LEN])
{
    memset(ans, 0, sizeof *ans);
    memset(body, 0, PD_BS_TOKEN_LEN);
    kvt_stream_auth a = {NULL, 0, "fuzz"};
    kvt_stream *s = NULL;
    uint64_t dl = kvt__deadline_ns(2000);
    if (kvt__stream_connect("127.0.0.1", g_port, &a, dl, &s) != KVT_OK) {
        fprintf(stderr, "fuzz_bootstrap: cannot connect: %s\n", kvt_last_error());
        abort();
    }
    if (!n || kvt__stream_send(s, p, n, dl) == KVT_OK) {
        shutdown(s->fd, SHUT_WR);
        uint8_t hb[PD_HDR_LEN], sink[4096];
        size_t got = 0;
        for (;;) { /* the header, then the rest until the service closes */
            if (kvt__fd_wait(s->fd, POLLIN, dl) != KVT_OK) break;
            ssize_t r = got < PD_HDR_LEN ? read(s->fd, hb + got, PD_HDR_LEN - got) : read(s->fd, sink, sizeof sink);
            if (r <= 0) break;
            if (got >= PD_HDR_LEN && got - PD_HDR_LEN < PD_BS_TOKEN_LEN) {
                size_t at = got - PD_HDR_LEN, k = (size_t)r < PD_BS_TOKEN_LEN - at ? (size_t)r
                                                                                  : PD_BS_TOKEN_LEN - at;
                memcpy(body + at, sink, k);
            }
            got += (size_t)r;
        }
        if (got >= PD_HDR_LEN && !pd_hdr_decode(ans, hb)) abort(); /* the service speaks its own wire */
    }
    kvt__stream_destroy(s);
}

/* Unregisters what registration body made, with the token its OK gave
 * (the body's last PD_BS_TOKEN_LEN bytes are the token it presented). */
static void unregister(const uint8_t *body, uint32_t len, const uint8_t token[PD_BS_TOKEN_LEN])
{
    if (len < PD_BS_TOKEN_LEN) return;
    uint8_t *b = malloc(PD_HDR_LEN + (size_t)len), sink[PD_BS_TOKEN_LEN];
    if (!b) abort();
    pd_hdr h = {.type = PD_F_UNREG_PREFILL, .body_len = len};
    pd_hdr_encode(&h, b);
    memcpy(b + PD_HDR_LEN, body, len);
    memcpy(b + PD_HDR_LEN + len - PD_BS_TOKEN_LEN, token, PD_BS_TOKEN_LEN);
    pd_hdr ans;
    request(b, PD_HDR_LEN + (size_t)len, &ans, sink);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool based;
    if (!based) { /* not in Initialize: its requests would be counted as the first input's */
        renew_base();
        based = true;
    }
    const uint8_t *regs[MAX_REQUESTS];
    uint32_t reg_len[MAX_REQUESTS];
    uint8_t tokens[MAX_REQUESTS][PD_BS_TOKEN_LEN], body[PD_BS_TOKEN_LEN];
    int nregs = 0;
    bool changed = false;
    size_t off = 0;
    for (int i = 0; i < MAX_REQUESTS && off < size; i++) {
        size_t left = size - off, n = left;
        pd_hdr h = {0};
        if (left >= PD_HDR_LEN && pd_hdr_decode(&h, data + off))
            n = PD_HDR_LEN + (h.body_len < left - PD_HDR_LEN ? h.body_len : left - PD_HDR_LEN);
        pd_hdr ans;
        request(data + off, n, &ans, body);
        if (ans.type == PD_F_OK && h.type == PD_F_REG_PREFILL && n == PD_HDR_LEN + h.body_len) {
            regs[nregs] = data + off + PD_HDR_LEN;
            memcpy(tokens[nregs], body, PD_BS_TOKEN_LEN);
            reg_len[nregs++] = h.body_len;
        }
        if (ans.type == PD_F_OK) changed = true;
        off += n;
    }
    /* back to the fixed directory */
    for (int i = 0; i < nregs; i++) unregister(regs[i], reg_len[i], tokens[i]);
    if (changed) renew_base();
    kvt__clear_error();
    return 0;
}

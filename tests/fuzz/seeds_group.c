/* seeds_group.c - writes the seed corpora of fuzz_frame and fuzz_net's
 * rank-group messages from the real encoders (kvt__frame_encode,
 * kvt__hello_encode, kvt__note_encode, the connector's wire records), so the
 * seeds speak the current protocol version and cover every op; and
 * fuzz_server_proto's frame headers, one per node-server op (request and
 * reply) the header decoder accepts, so an op added there without seeds
 * (as PEEK was) fails the check:
 *   seeds_group write CORPUS   (re)writes CORPUS/fuzz_frame/v3_*,
 *                              CORPUS/fuzz_net/recv_*_frames and
 *                              CORPUS/fuzz_server_proto/hdr_op* and
 *                              CORPUS/fuzz_server_frames/ (its streams)
 *   seeds_group check CORPUS   fails naming the first seed that differs
 *                              (ctest fuzz_seeds_current: a protocol change
 *                              that leaves old seeds behind is caught)
 * The frames' checksums are deterministic (XXH3), so the bytes are too.
 * Run `build/tests/seeds_group write tests/fuzz/corpus` after a change to
 * the wire format and commit the result. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "connector/wire.h"
#include "group/frame.h"
#include "server/proto.h"

#define MAX_SEED 4096

typedef struct seeds {
    const char *dir;
    int check;
    int bad;
    int n;
} seeds;

/* Writes (or compares) one seed file dir/sub/name. */
static void emit(seeds *s, const char *sub, const char *name, const uint8_t *p, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", s->dir, sub, name);
    s->n++;
    if (!s->check) {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(p, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "seeds_group: cannot write %s: %s\n", path, strerror(errno));
            s->bad++;
        }
        return;
    }
    uint8_t have[MAX_SEED + 1];
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(have, 1, sizeof have, f) : 0;
    if (f) fclose(f);
    if (!f || got != len || memcmp(have, p, len) != 0) {
        fprintf(stderr, "seeds_group: %s is %s; regenerate: seeds_group write %s\n", path,
                f ? "stale" : "missing", s->dir);
        s->bad++;
    }
}

/* One frame: header + payload into out; returns its size. */
static size_t frame(uint8_t *out, uint16_t op, uint32_t ch, uint64_t epoch, uint64_t seq,
                    uint32_t from, uint32_t to, const uint8_t *payload, size_t len)
{
    kvt_frame f = {.version = KVT_PROTO_VERSION, .op = op, .epoch = epoch, .seq = seq,
                   .channel = ch, .sender = from, .receiver = to, .len = (uint32_t)len};
    kvt__frame_encode(out, &f, payload);
    memcpy(out + KVT_FRAME_HDR, payload, len);
    return KVT_FRAME_HDR + len;
}

/* Handshake payload: attempt id, then extra bytes. */
static size_t hs_payload(uint8_t *out, uint64_t att, const uint8_t *extra, size_t n)
{
    kvt__put64(out, att);
    memcpy(out + 8, extra, n);
    return 8 + n;
}

static size_t hello_bytes(uint8_t out[KVT_HELLO_LEN])
{
    kvt_hello h = {0x000100, 1, 1, 3, 2, 0, 0, 2, 2, 0x1111222233334444ull,
                   0x5555666677778888ull, 2, 0x9000000000000002ull};
    kvt__hello_encode(out, &h);
    return KVT_HELLO_LEN;
}

/* A STEP_UP payload: one lookup, one store, one result. */
static size_t up_bytes(uint8_t *out)
{
    size_t n = kvt__wire_up_size(1, 1, 1);
    kvt__wire_head(out, 0, 1, 1, 1);
    uint8_t *p = out + KVT_WIRE_HEAD;
    kvt__wire_put_lookup(p, &(kvt_up_lookup){7, 0xabcdefull, 32, KVT_UPL_LOAD});
    kvt__wire_put_store(p + KVT_UPL_SIZE, &(kvt_up_store){8, 0x123456ull, 48, 0});
    kvt__wire_put_result(p + KVT_UPL_SIZE + KVT_UPS_SIZE,
                         &(kvt_result_rec){6, KVT_TASK_STORE, 0, 16, 2});
    return n;
}

/* A STEP_DOWN payload: one load, one store decision, one group result. */
static size_t down_bytes(uint8_t *out)
{
    size_t n = kvt__wire_down_size(1, 1, 1);
    kvt__wire_head(out, KVT_WIRE_RESET, 1, 1, 1);
    uint8_t *p = out + KVT_WIRE_HEAD;
    kvt__wire_put_load(p, &(kvt_down_load){7, 32, 0, 0, 1, 5});
    kvt__wire_put_sdec(p + KVT_DNL_SIZE, &(kvt_down_store){8, 0, 0});
    kvt__wire_put_result(p + KVT_DNL_SIZE + KVT_DNS_SIZE,
                         &(kvt_result_rec){6, KVT_TASK_STORE, -4, 0, 1});
    return n;
}

/* A step payload: the engine's step number, then the connector's bytes. */
static size_t step_payload(uint8_t *out, uint64_t step, const uint8_t *body, size_t n)
{
    kvt__put64(out, step);
    if (n) memcpy(out + KVT_STEP_HEAD, body, n);
    return KVT_STEP_HEAD + n;
}

typedef struct built {
    const char *name;
    uint8_t bytes[MAX_SEED];
    size_t len;
} built;

/* Every op of protocol version 3, as the code sends it. */
static int all_frames(built *b)
{
    uint8_t pl[1024], x[512];
    size_t n;
    int k = 0;
    const uint64_t att = 0x9000000000000002ull;
    n = hs_payload(pl, att, x, hello_bytes(x));
    b[k].name = "hello", b[k].len = frame(b[k].bytes, KVT_OP_HELLO, KVT_CH_HANDSHAKE, 2, 0, 2, 0, pl, n), k++;
    kvt__put64(x, 2);
    n = hs_payload(pl, att, x, 8);
    b[k].name = "welcome", b[k].len = frame(b[k].bytes, KVT_OP_WELCOME, KVT_CH_HANDSHAKE, 2, 0, 0, 2, pl, n), k++;
    n = hs_payload(pl, att, x, 0);
    b[k].name = "join", b[k].len = frame(b[k].bytes, KVT_OP_JOIN, KVT_CH_HANDSHAKE, 2, 0, 2, 0, pl, n), k++;
    n = hs_payload(pl, att, x, 8);
    b[k].name = "formed", b[k].len = frame(b[k].bytes, KVT_OP_FORMED, KVT_CH_HANDSHAKE, 2, 0, 0, 2, pl, n), k++;
    size_t t = kvt__note_encode(x, sizeof x, (uint32_t)-KVT_EGEOMETRY,
                                "rank 2 has KV geometry digest 1111, rank 1 of the same "
                                "pipeline stage 0 has 2222");
    n = hs_payload(pl, att, x, t);
    b[k].name = "refuse", b[k].len = frame(b[k].bytes, KVT_OP_REFUSE, KVT_CH_HANDSHAKE, 2, 0, 0, 2, pl, n), k++;
    t = kvt__note_encode(x, sizeof x, 0, "kvt_group: rank 2 got no verdict from rank 0");
    n = hs_payload(pl, att, x, t);
    b[k].name = "giveup", b[k].len = frame(b[k].bytes, KVT_OP_GIVEUP, KVT_CH_HANDSHAKE, 2, 0, 2, 0, pl, n), k++;
    n = step_payload(pl, 41, x, up_bytes(x));
    b[k].name = "step_up", b[k].len = frame(b[k].bytes, KVT_OP_STEP_UP, KVT_CH_STEP, 2, 5, 2, 0, pl, n), k++;
    n = step_payload(pl, 41, x, down_bytes(x));
    b[k].name = "step_down", b[k].len = frame(b[k].bytes, KVT_OP_STEP_DOWN, KVT_CH_STEP, 2, 5, 0, 2, pl, n), k++;
    n = step_payload(pl, 41, x, 0);
    b[k].name = "step_ack", b[k].len = frame(b[k].bytes, KVT_OP_STEP_ACK, KVT_CH_STEP, 2, 6, 2, 0, pl, n), k++;
    n = kvt__note_encode(pl, sizeof pl, 2, "epoch 2: step skew: rank 2 calls step 42 while rank 0 "
                         "calls step 41");
    b[k].name = "abort", b[k].len = frame(b[k].bytes, KVT_OP_ABORT, KVT_CH_CONTROL, 2, 0, 0, 2, pl, n), k++;
    return k;
}

/* fuzz_frame's input: a selector byte (0 frame, 1 hello, 2 note, 3 wire),
 * then the bytes. */
static void frame_seeds(seeds *s, const built *b, int nb)
{
    uint8_t buf[MAX_SEED + 1];
    char name[64];
    for (int i = 0; i < nb; i++) {
        buf[0] = 0;
        memcpy(buf + 1, b[i].bytes, b[i].len);
        snprintf(name, sizeof name, "v3_frame_%s", b[i].name);
        emit(s, "fuzz_frame", name, buf, b[i].len + 1);
    }
    buf[0] = 1;
    emit(s, "fuzz_frame", "v3_hello", buf, 1 + hello_bytes(buf + 1));
    buf[0] = 2;
    size_t n = kvt__note_encode(buf + 1, MAX_SEED, 3, "group aborted by rank 3 (epoch 2): gone");
    emit(s, "fuzz_frame", "v3_note", buf, 1 + n);
    buf[0] = 3;
    emit(s, "fuzz_frame", "v3_up", buf, 1 + up_bytes(buf + 1));
    buf[0] = 3;
    emit(s, "fuzz_frame", "v3_down", buf, 1 + down_bytes(buf + 1));
}

/* fuzz_net's tcp_recv inputs (byte 0: 0 a rank reading from the hub, 8 the
 * hub reading from rank 1), then length-prefixed messages: here the frames
 * each side really receives in a formation and a step. */
static void net_seeds(seeds *s, const built *b, int nb)
{
    static const char *to_rank[] = {"welcome", "formed", "step_down", "abort"};
    static const char *to_hub[] = {"hello", "join", "step_up", "step_ack", "giveup"};
    uint8_t buf[MAX_SEED];
    for (int side = 0; side < 2; side++) {
        const char *const *want = side ? to_hub : to_rank;
        int nw = side ? 5 : 4;
        size_t len = 1;
        buf[0] = side ? 8 : 0;
        for (int w = 0; w < nw; w++)
            for (int i = 0; i < nb; i++) {
                if (strcmp(b[i].name, want[w]) != 0) continue;
                kvt__put32(buf + len, (uint32_t)b[i].len);
                memcpy(buf + len + 4, b[i].bytes, b[i].len);
                len += 4 + b[i].len;
            }
        emit(s, "fuzz_net", side ? "recv_hub_frames" : "recv_rank_frames", buf, len);
    }
}

/* fuzz_server_proto case 0 (the header decoder): every op it accepts, as a
 * request of a 16-byte payload and as its reply. The ops are numbered from
 * KVT_SRV_HELLO up; the first the decoder refuses ends them. */
static void server_seeds(seeds *s)
{
    for (uint16_t op = KVT_SRV_HELLO;; op++) {
        uint8_t buf[1 + KVT_SRV_HDR] = {0}; /* byte 0 picks the decoder: 0 */
        kvt_srv_hdr h;
        kvt__srv_hdr_encode(buf + 1, op, 16, 0);
        if (kvt__srv_hdr_decode(buf + 1, &h) != KVT_OK) break;
        char name[32];
        snprintf(name, sizeof name, "hdr_op%u", op);
        emit(s, "fuzz_server_proto", name, buf, sizeof buf);
        kvt__srv_hdr_encode(buf + 1, op | KVT_SRV_REPLY, 16, 0);
        snprintf(name, sizeof name, "hdr_op%u_reply", op);
        emit(s, "fuzz_server_proto", name, buf, sizeof buf);
    }
    /* PEEK's reply (case 4, the task reply decoder): task 0, 32 tokens. */
    kvt_srv_buf b = {0};
    kvt__srv_task_rep_encode(&b, 0, 32, 0);
    uint8_t rep[1 + 16] = {4};
    if (b.oom || b.len != 16) s->bad++;
    else memcpy(rep + 1, b.p, b.len);
    emit(s, "fuzz_server_proto", "task_rep_peek", rep, sizeof rep);
    kvt__srv_buf_free(&b);
    /* A request of independent keys (case 3, form 2): two keys. */
    kvt_key keys[2] = {{"page-a", 6}, {"page-bb", 7}};
    kvt_request r = {.ns = "m", .ns_len = 1, .keys = keys, .num_keys = 2,
                     .flags = KVT_REQ_INDEPENDENT_KEYS};
    kvt_srv_buf q = {0};
    uint8_t req[1 + 64] = {3}; /* byte 0 picks the decoder: 3 */
    if (kvt__srv_req_encode(&q, &r) != KVT_OK || q.len > sizeof req - 1) s->bad++;
    else memcpy(req + 1, q.p, q.len);
    emit(s, "fuzz_server_proto", "req_independent_keys", req, 1 + q.len);
    kvt__srv_buf_free(&q);
    /* PEEK_MANY (case 12): that request and one of tokens. */
    uint32_t toks[4] = {1, 2, 3, 4};
    kvt_request two[2] = {r, {.tokens = toks, .num_tokens = 4, .ns = "n", .ns_len = 1}};
    kvt_srv_buf m = {0};
    uint8_t many[1 + 160] = {12};
    if (kvt__srv_peek_many_encode(&m, two, 2) != KVT_OK || m.len > sizeof many - 1) s->bad++;
    else memcpy(many + 1, m.p, m.len);
    emit(s, "fuzz_server_proto", "peek_many", many, 1 + m.len);
    kvt__srv_buf_free(&m);
    /* CLEAR (case 11): a namespace. */
    kvt_srv_buf c = {0};
    uint8_t clr[1 + 32] = {11};
    if (kvt__srv_clear_encode(&c, "tenant", 6) != KVT_OK || c.len > sizeof clr - 1) s->bad++;
    else memcpy(clr + 1, c.p, c.len);
    emit(s, "fuzz_server_proto", "clear", clr, 1 + c.len);
    kvt__srv_buf_free(&c);
    /* STATS_ALL's reply (case 10): one tier. */
    kvt_srv_tier t = {.fingerprint = 0x1234, .num_layers = 4, .tokens_per_page = 16,
                      .block_tokens = 16, .bytes_per_token = 512};
    kvt_srv_buf a = {0};
    uint8_t all[1 + 512] = {10};
    kvt_srv_quota quota = {.prefix = "tenant-a", .limit = 1 << 20, .used = 4096, .limited = 1};
    kvt_srv_info info = {.pid = 42, .uptime_ms = 1000, .clients = 2, .max_clients = 64,
                         .geometries = 1, .max_geometries = 4, .cpu_capacity = 1 << 30,
                         .version = "0.1.0"};
    kvt__srv_tiers_encode(&a, &t, 1, &quota, 1, &info);
    if (a.oom || a.len > sizeof all - 1) s->bad++;
    else memcpy(all + 1, a.p, a.len);
    emit(s, "fuzz_server_proto", "tiers", all, 1 + a.len);
    kvt__srv_buf_free(&a);
}

/* fuzz_server_frames: streams of whole frames as a peer writes them (byte
 * 0 picks the reader: 0 plain, 1 with fd passing): a HELLO-sized request
 * then an empty reply, and a frame whose stream ends inside its payload. */
static void frame_stream_seeds(seeds *s)
{
    uint8_t buf[1 + 2 * KVT_SRV_HDR + 24] = {0};
    kvt__srv_hdr_encode(buf + 1, KVT_SRV_HELLO, 24, 0);
    memset(buf + 1 + KVT_SRV_HDR, 0x5a, 24);
    kvt__srv_hdr_encode(buf + 1 + KVT_SRV_HDR + 24, KVT_SRV_STATS_ALL | KVT_SRV_REPLY, 0, 0);
    emit(s, "fuzz_server_frames", "two_frames", buf, sizeof buf);
    buf[0] = 1;
    emit(s, "fuzz_server_frames", "two_frames_fd", buf, sizeof buf);
    buf[0] = 0;
    emit(s, "fuzz_server_frames", "cut_payload", buf, 1 + KVT_SRV_HDR + 10);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "check"))) {
        fprintf(stderr, "usage: seeds_group write|check CORPUS_DIR (tests/fuzz/corpus)\n");
        return 2;
    }
    seeds s = {argv[2], strcmp(argv[1], "check") == 0, 0, 0};
    static built b[16];
    int nb = all_frames(b);
    for (int i = 0; i < nb; i++) { /* every seed frame must decode (else it seeds nothing) */
        kvt_frame f;
        if (kvt__frame_decode(b[i].bytes, b[i].len, KVT_PROTO_VERSION, &f) != KVT_OK) {
            fprintf(stderr, "seeds_group: frame %s does not decode: %s\n", b[i].name,
                    kvt_last_error());
            return 1;
        }
    }
    frame_seeds(&s, b, nb);
    net_seeds(&s, b, nb);
    server_seeds(&s);
    frame_stream_seeds(&s);
    if (s.bad) return 1;
    printf("seeds_group: %d seeds %s (protocol version %d, %d frame ops)\n", s.n,
           s.check ? "current" : "written", KVT_PROTO_VERSION, nb);
    return 0;
}

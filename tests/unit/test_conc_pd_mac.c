/* test_conc_pd_mac.c - frames after the handshake are authenticated (issue
 * 14 item 4, pd/mac.h). A man in the middle, a TCP proxy between a decode
 * rank and its prefill rank that forwards the handshake untouched, then
 * alters the sender's frames: it flips a payload byte (and, where frames
 * carry XXH3 checksums, recomputes the page's), injects a frame, replays
 * one or drops one. With a secret the decode room must fail naming the
 * peer and "authentication", never end Success with wrong bytes (before
 * per-frame tags the flip ended Success with a wrong byte, the injected
 * PING passed, and the replay and drop failed as protocol errors).
 *
 * The decode rank finds the proxy through a second bootstrap service, into
 * which the test registers the prefill rank's descriptor at the proxy's
 * port. 127.0.0.1 only; every wait bounded. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>
#include "pd_harness.h"
#include "net/stream.h"
#include "pd/bootstrap.h"
#include "pd/ep.h"
#include "pd/mac.h"
#include "pd/wire.h"
#include "util/clock.h"
#include "util/err.h"

static const pd_model mha = {.layers = 2, .heads = 4, .head_dim = 32};
static const pd_side_cfg c1 = {.tp = 1, .dcp = 1, .tpp = 16, .layout = KVT_LAYOUT_LAYER_FIRST, .model = &mha};
#define SECRET "0123456789abcdef-secret"
#define NTOK 40          /* pages of 16, 16 and 8 tokens: one DATA batch */
#define ENTRIES 4        /* 2 layers x (K, V), 256 bytes a token each */
#define PIECE 256
#define CHALLENGE 72 /* then ACCEPT (8), after the decode rank's proof: net/stream_auth.c */
#define ACCEPT 8

typedef enum { MITM_FLIP, MITM_INJECT, MITM_REPLAY, MITM_DROP } mitm_mode;

typedef struct mitm {
    mitm_mode mode;
    bool tagged; /* frames carry tags (mac.h): a secret, wire version 3 */
    uint16_t target, port;
    int lfd, cfd, sfd;
    pthread_t th, pump;
    atomic_bool acted; /* the alteration was made */
} mitm;

static bool read_n(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        struct pollfd q = {fd, POLLIN, 0};
        if (poll(&q, 1, 20000) <= 0) return false;
        ssize_t r = read(fd, b, n);
        if (r <= 0) return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

static bool write_n(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

/* decode -> prefill: forwarded as it comes. */
static void *pump_main(void *arg)
{
    mitm *m = arg;
    uint8_t b[65536];
    for (;;) {
        struct pollfd q = {m->cfd, POLLIN, 0};
        if (poll(&q, 1, 20000) <= 0) break;
        ssize_t r = read(m->cfd, b, sizeof b);
        if (r <= 0 || !write_n(m->sfd, b, (size_t)r)) break;
    }
    shutdown(m->sfd, SHUT_WR);
    return NULL;
}

/* Page 0's XXH3 in page order (entry after entry) from an entry-major
 * payload of ENTRIES equal blocks: what a checksum-recomputing proxy does. */
static uint64_t page0_sum(const uint8_t *payload, uint64_t len)
{
    XXH3_state_t *st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (uint32_t e = 0; e < ENTRIES; e++) XXH3_64bits_update(st, payload + e * (len / ENTRIES), 16 * PIECE);
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

/* A forged PING: a header and, on a tagged link, a tag the proxy cannot
 * compute (it lacks the key). */
static size_t forged_ping(const mitm *m, uint8_t *out)
{
    pd_hdr h = {.type = PD_F_PING};
    pd_hdr_encode(&h, out);
    memset(out + PD_HDR_LEN, 0, PD_TAG_LEN);
    return PD_HDR_LEN + (m->tagged ? PD_TAG_LEN : 0);
}

/* The frame's first DATA: altered as m->mode says. Returns false to drop. */
static bool alter(mitm *m, uint8_t *f, size_t *len, const pd_hdr *h, size_t off)
{
    uint8_t ping[PD_HDR_LEN + PD_TAG_LEN];
    switch (m->mode) {
    case MITM_FLIP: {
        uint8_t *payload = f + off;
        payload[100] ^= 0x40;
        if (!m->tagged) { /* the page checksum follows the payload: made to match */
            assert_int_equal(h->payload_len, (uint64_t)NTOK * ENTRIES * PIECE);
            pd_put64(payload + h->payload_len, page0_sum(payload, h->payload_len));
        }
        return true;
    }
    case MITM_INJECT: {
        size_t n = forged_ping(m, ping);
        return write_n(m->cfd, ping, n);
    }
    case MITM_REPLAY: return write_n(m->cfd, f, *len); /* it goes twice */
    case MITM_DROP: return false;
    }
    return true;
}

/* prefill -> decode: the handshake as it comes, then frame by frame. */
static void relay_frames(mitm *m)
{
    uint8_t hs[CHALLENGE];
    if (!read_n(m->sfd, hs, CHALLENGE) || !write_n(m->cfd, hs, CHALLENGE)) return;
    if (!read_n(m->sfd, hs, ACCEPT) || !write_n(m->cfd, hs, ACCEPT)) return;
    size_t tag = m->tagged ? PD_TAG_LEN : 0, cap = 1 << 20;
    uint8_t *f = malloc(cap);
    for (;;) {
        if (!read_n(m->sfd, f, PD_HDR_LEN + tag)) break;
        pd_hdr h;
        assert_true(pd_hdr_decode(&h, f));
        size_t off = PD_HDR_LEN + tag, rest = h.body_len + h.payload_len;
        if (h.type == PD_F_DATA) rest += tag ? tag : 8ull * h.a1;
        else if (h.body_len) rest += tag;
        assert_true(off + rest <= cap);
        if (!read_n(m->sfd, f + off, rest)) break;
        size_t len = off + rest;
        bool send_it = true;
        if (h.type == PD_F_DATA && !atomic_load(&m->acted)) {
            /* marked first: the decode side may fail the room (and the test
             * thread look at acted) as soon as alter() has written */
            atomic_store(&m->acted, true);
            send_it = alter(m, f, &len, &h, off);
        }
        if (send_it && !write_n(m->cfd, f, len)) break;
    }
    free(f);
}

static void *mitm_main(void *arg)
{
    mitm *m = arg;
    struct pollfd q = {m->lfd, POLLIN, 0};
    if (poll(&q, 1, 20000) <= 0) return NULL;
    m->cfd = accept(m->lfd, NULL, NULL);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(m->target)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    m->sfd = socket(AF_INET, SOCK_STREAM, 0);
    if (m->cfd < 0 || connect(m->sfd, (struct sockaddr *)&sa, sizeof sa) != 0) return NULL;
    pthread_create(&m->pump, NULL, pump_main, m);
    relay_frames(m);
    shutdown(m->cfd, SHUT_RDWR);
    shutdown(m->sfd, SHUT_RDWR);
    pthread_join(m->pump, NULL);
    return NULL;
}

static void mitm_start(mitm *m, uint16_t target)
{
    m->target = target;
    m->cfd = m->sfd = -1;
    m->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(m->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(m->lfd, 8), 0);
    assert_int_equal(getsockname(m->lfd, (struct sockaddr *)&sa, &sl), 0);
    m->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&m->th, NULL, mitm_main, m), 0);
}

static void mitm_stop(mitm *m)
{
    shutdown(m->lfd, SHUT_RDWR);
    if (m->cfd >= 0) shutdown(m->cfd, SHUT_RDWR);
    if (m->sfd >= 0) shutdown(m->sfd, SHUT_RDWR);
    pthread_join(m->th, NULL);
    close(m->lfd);
    if (m->cfd >= 0) close(m->cfd);
    if (m->sfd >= 0) close(m->sfd);
}

/* One room from prefill to decode through a proxy in mode; returns the
 * decode room's state, its info in *info and mismatching bytes in *bad. */
static kvt_pd_poll through_mitm(mitm_mode mode, bool secret, kvt_pd_room_info *info, uint64_t *bad)
{
    pd_cluster cl = {.net = {.peer_timeout_ms = 3000}};
    if (secret) {
        cl.net.secret = SECRET;
        cl.net.secret_len = strlen(SECRET);
    }
    pd_cluster_start(&cl, &c1, &c1, NTOK);
    pd_ep *sep = pd_sender_ep(cl.pre[0].s);
    mitm m = {.mode = mode, .tagged = secret && PD_WIRE_VERSION >= 3};
    mitm_start(&m, sep->port);
    /* a second directory that names the proxy as the prefill rank */
    kvt_pd_bootstrap *bs2 = NULL;
    uint16_t port2;
    assert_ok(kvt_pd_bootstrap_create(&bs2, &cl.net));
    assert_ok(kvt_pd_bootstrap_port(bs2, &port2));
    kvt_stream_auth a = {(const uint8_t *)cl.net.secret, cl.net.secret_len, "test"};
    uint32_t lease;
    uint8_t tok[PD_BS_TOKEN_LEN] = {0};
    assert_ok(pd_bootstrap_register(&cl.net, &a, "127.0.0.1", port2, &sep->desc, "127.0.0.1", m.port,
                                    kvt__deadline_ns(5000), tok, &lease));
    cl.port = port2;
    pd_cluster_decoders(&cl);
    pd_open_room(&cl, 7, 0);
    kvt_pd_poll st = KVT_PD_FAILED;
    assert_ok(kvt_pd_receiver_wait(cl.dec[0].r, 7, 20000, &st));
    assert_ok(kvt_pd_room_info_get(NULL, cl.dec[0].r, 7, info));
    assert_true(atomic_load(&m.acted));
    *bad = st == KVT_PD_SUCCESS ? pd_verify(&cl, 0) : 0;
    mitm_stop(&m);
    pd_cluster_stop(&cl);
    kvt_pd_bootstrap_destroy(bs2);
    return st;
}

/* Failed, naming the peer and authentication (never Success). */
static void expect_auth_failure(mitm_mode mode)
{
    kvt_pd_room_info info;
    uint64_t bad = 0;
    kvt_pd_poll st = through_mitm(mode, true, &info, &bad);
    if (st != KVT_PD_FAILED || !strstr(info.message, "prefill tp0/1 dcp0/1 at 127.0.0.1:") ||
        !strstr(info.message, "authentication"))
        fail_msg("state %s (%llu wrong bytes), error %d: %s", kvt_pd_poll_name(st), (unsigned long long)bad,
                 info.error, info.message);
    assert_int_equal(info.error, KVT_EAUTH);
    print_message("decode room: %s\n", info.message);
}

static void flipped_payload_byte_fails(void **state)
{
    (void)state;
    expect_auth_failure(MITM_FLIP);
}

static void injected_frame_fails(void **state)
{
    (void)state;
    expect_auth_failure(MITM_INJECT);
}

static void replayed_frame_fails(void **state)
{
    (void)state;
    expect_auth_failure(MITM_REPLAY);
}

static void dropped_frame_fails(void **state)
{
    (void)state;
    expect_auth_failure(MITM_DROP);
}

/* Without a secret nothing is authenticated, as documented (docs/pd.md):
 * the proxy that recomputes the checksum wins. This pins the proxy itself:
 * the same alteration the tests above catch does reach the pages. */
static void without_secret_the_flip_goes_unseen(void **state)
{
    (void)state;
    kvt_pd_room_info info;
    uint64_t bad = 0;
    assert_int_equal(through_mitm(MITM_FLIP, false, &info, &bad), KVT_PD_SUCCESS);
    assert_int_equal(bad, 1);
}

/* ---- the handshake's part ---- */

_Static_assert(sizeof(((auth_end *)0)->key) == PD_SESSION_KEY_LEN, "auth_end.key holds a session key");

/* Both ends of a connection get the same key, another connection another
 * one; without a secret there is none (the buffer is left alone). */
static void session_key_per_connection(void **state)
{
    (void)state;
    auth_end s1 = {.secret = SECRET}, c1e = {.secret = SECRET}, s2 = {.secret = SECRET}, c2e = {.secret = SECRET};
    handshake_pair(&s1, &c1e);
    handshake_pair(&s2, &c2e);
    assert_int_equal(s1.st, KVT_OK);
    assert_int_equal(c1e.st, KVT_OK);
    assert_memory_equal(s1.key, c1e.key, PD_SESSION_KEY_LEN);
    assert_memory_equal(s2.key, c2e.key, PD_SESSION_KEY_LEN);
    assert_memory_not_equal(s1.key, s2.key, PD_SESSION_KEY_LEN);
    uint8_t zero[PD_SESSION_KEY_LEN] = {0};
    assert_memory_not_equal(s1.key, zero, PD_SESSION_KEY_LEN);
    auth_end s3 = {0}, c3 = {0};
    handshake_pair(&s3, &c3);
    assert_int_equal(s3.st, KVT_OK);
    assert_memory_equal(s3.key, zero, PD_SESSION_KEY_LEN);
    assert_memory_equal(c3.key, zero, PD_SESSION_KEY_LEN);
    /* the two directions: one end's tx is the other's rx, and not its own */
    pd_mac *ms = NULL, *mc = NULL;
    assert_ok(pd_mac_new(&ms, s1.key, true));
    assert_ok(pd_mac_new(&mc, c1e.key, false));
    uint8_t hb[PD_HDR_LEN] = {1, 2, 3}, tag[PD_TAG_LEN];
    pd_mac_head(&mc->tx, hb, tag);
    assert_true(pd_mac_head_ok(&ms->rx, hb, tag));
    pd_mac_head(&mc->tx, hb, tag); /* frame 1 */
    assert_false(pd_mac_head_ok(&mc->rx, hb, tag)); /* reflected back: another key */
    pd_mac_free(ms);
    pd_mac_free(mc);
}

/* A peer of another handshake version is refused naming both versions, on
 * both ends, with KVT_EVERSION (the status of every version refusal). The server's version travels in the refusal code's high half,
 * so a client can name it. */
static void other_version_named(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    auth_end srv = {.fd = sv[0]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, auth_server_main, &srv), 0);
    uint8_t hello[40] = {0}, chal[8];
    pd_put32(hello, 0x4155504bu); /* "KPUA", version 3 (Poly1305 frame tags) */
    hello[4] = 3;
    assert_int_equal(write(sv[1], hello, sizeof hello), (ssize_t)sizeof hello);
    struct pollfd q = {sv[1], POLLIN, 0};
    assert_int_equal(poll(&q, 1, 5000), 1);
    assert_int_equal(read(sv[1], chal, sizeof chal), (ssize_t)sizeof chal);
    pthread_join(th, NULL);
    assert_int_equal(srv.st, KVT_EVERSION); /* a version refusal, as everywhere */
    if (!strstr(srv.msg, "the peer speaks PD endpoint handshake version 3, this end 4")) fail_msg("server: %s", srv.msg);
    /* a client reading that refusal from a version 5 server */
    pd_put32(chal + 4, 5u | 5u << 16); /* KVT_AUTH_BAD_VERSION */
    uint8_t sink[40];
    int cv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, cv), 0);
    assert_int_equal(write(cv[0], chal, sizeof chal), (ssize_t)sizeof chal);
    kvt_stream_auth a = {NULL, 0, "test client", NULL};
    assert_int_equal(kvt__stream_auth_client(cv[1], &a, kvt__deadline_ns(5000)), KVT_EVERSION);
    if (!strstr(kvt_last_error(), "it speaks PD endpoint handshake version 5, this end 4")) fail_msg("client: %s", kvt_last_error());
    /* and a code it does not know is named by number */
    assert_int_equal(read(cv[0], sink, sizeof sink), (ssize_t)sizeof sink);
    pd_put32(chal + 4, 77);
    assert_int_equal(write(cv[0], chal, sizeof chal), (ssize_t)sizeof chal);
    assert_int_equal(kvt__stream_auth_client(cv[1], &a, kvt__deadline_ns(5000)), KVT_EAUTH);
    if (!strstr(kvt_last_error(), "refusal code 77")) fail_msg("client: %s", kvt_last_error());
    for (int i = 0; i < 2; i++) {
        close(sv[i]);
        close(cv[i]);
    }
}

/* The expected AES-256-GCM tag (no plaintext) of ad under key and nonce:
 * libsodium's own AES-GCM where the CPU has AES-NI (an implementation
 * independent of the OpenSSL one under test), else OpenSSL's one-shot. */
static void gcm_tag(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *ad, size_t n,
                    uint8_t tag[16])
{
    unsigned long long len = 0;
    uint8_t none[1];
    if (crypto_aead_aes256gcm_is_available()) {
        assert_int_equal(crypto_aead_aes256gcm_encrypt_detached(none, tag, &len, NULL, 0, ad, n, NULL,
                                                                nonce, key), 0);
        return;
    }
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int out = 0;
    assert_int_equal(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce), 1);
    assert_int_equal(EVP_EncryptUpdate(c, NULL, &out, ad, (int)n), 1);
    assert_int_equal(EVP_EncryptFinal_ex(c, none, &out), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag), 1);
    EVP_CIPHER_CTX_free(c);
}

/* Frame tags are AES-256-GMAC as mac.h specifies: the direction's key
 * crypto_kdf(session, id = direction, "kvtpdgcm"), nonce direction | part
 * | 0 0 | frame number (little-endian), the header tag over the header,
 * the body tag over header then body, however the body arrives in
 * pieces. Checked against a second AES-GCM; the receiving end accepts the
 * same frame split otherwise, and refuses one flipped bit. */
static void tags_are_aes256_gmac(void **state)
{
    (void)state;
    assert_true(sodium_init() >= 0);
    uint8_t session[PD_SESSION_KEY_LEN], hb[PD_HDR_LEN], key[32];
    enum { BODY = 70000 };
    static uint8_t frame[PD_HDR_LEN + BODY];
    for (size_t i = 0; i < sizeof session; i++) session[i] = (uint8_t)(7 * i + 1);
    for (size_t i = 0; i < sizeof frame; i++) frame[i] = (uint8_t)(i * 131 + (i >> 9));
    memcpy(hb, frame, PD_HDR_LEN);
    const uint8_t *body = frame + PD_HDR_LEN;
    pd_mac *mc = NULL, *ms = NULL;
    assert_ok(pd_mac_new(&mc, session, false));
    assert_ok(pd_mac_new(&ms, session, true));
    uint8_t htag[PD_TAG_LEN], btag[PD_TAG_LEN], want[16];
    crypto_kdf_derive_from_key(key, sizeof key, 1, "kvtpdgcm", session); /* client -> server */
    for (uint64_t n = 0; n < 2; n++) { /* frames 0 and 1: the number is in the nonce */
        pd_mac_head(&mc->tx, hb, htag);
        pd_mac_body(&mc->tx, body, 1);
        pd_mac_body(&mc->tx, body + 1, 4095);
        pd_mac_body(&mc->tx, body + 4096, BODY - 4096);
        pd_mac_end(&mc->tx, btag);
        uint8_t nonce[12] = {1, 0};
        kvt__put64(nonce + 4, n);
        gcm_tag(key, nonce, hb, PD_HDR_LEN, want);
        assert_memory_equal(htag, want, 16);
        nonce[1] = 1;
        gcm_tag(key, nonce, frame, sizeof frame, want);
        assert_memory_equal(btag, want, 16);
        assert_true(pd_mac_head_ok(&ms->rx, hb, htag));
        pd_mac_body(&ms->rx, body, BODY / 2);
        pd_mac_body(&ms->rx, body + BODY / 2, BODY - BODY / 2);
        if (n == 0) {
            assert_true(pd_mac_end_ok(&ms->rx, btag));
            continue;
        }
        btag[5] ^= 0x10;
        assert_false(pd_mac_end_ok(&ms->rx, btag));
    }
    pd_mac_free(mc);
    pd_mac_free(ms);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flipped_payload_byte_fails),
        cmocka_unit_test(injected_frame_fails),
        cmocka_unit_test(replayed_frame_fails),
        cmocka_unit_test(dropped_frame_fails),
        cmocka_unit_test(without_secret_the_flip_goes_unseen),
        cmocka_unit_test(session_key_per_connection),
        cmocka_unit_test(other_version_named),
        cmocka_unit_test(tags_are_aes256_gmac),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

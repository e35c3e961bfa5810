/* stream_auth.c - the one handshake of every kvtier TCP link: who may join
 * a rank group's hub, who may talk to a PD endpoint. The client sends HELLO
 * (the realm's magic, its version, whether it holds a secret, the rank it
 * claims in a group, a nonce); the server answers CHALLENGE (a status, its
 * nonce and, with a secret, a MAC proving it holds it); the client answers
 * with its own MAC; the server says ACCEPT or REFUSE. Both MACs
 * (HMAC-SHA256, libsodium) cover the whole HELLO and the server's nonce
 * under labels distinct per realm and direction, so neither is replayed,
 * reflected, or carried from a PD link to a group or back. Comparisons are
 * constant-time (sodium_memcmp). docs/protocol.md draws the exchange.
 *
 * The server side is steps over bytes already read (kvt__auth_*), so the
 * group hub can run many handshakes at once on one thread (tcp.c); a PD
 * endpoint runs them in a row on the connection's own thread
 * (kvt__stream_auth_server). Both clients are kvt__stream_auth_client. */
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include "net/stream.h"
#include "util/err.h"
#include "util/le.h"

#define HELLO_LEN KVT_AUTH_HELLO
#define CHAL_LEN KVT_AUTH_CHAL
#define ACK_LEN KVT_AUTH_ACK
#define NONCE KVT_AUTH_NONCE
#define MACLEN KVT_AUTH_MAC

/* HELLO: magic u32 | version u8 | 0 | has_secret u8 | 0 | rank u32 |
 * ranks u32 | nonce[32]. CHALLENGE: magic | status u32 | nonce | MAC.
 * ACK: magic | status. All little-endian. The hub's layout since version 1;
 * the PD realm took it at its version 2 (its version 1 had no rank), where
 * also every frame after the handshake is authenticated with the session
 * key when there is a secret (pd/mac.h); version 3: the bootstrap's
 * registrations carry the entry's token (pd/bootstrap.h), so a sender of
 * version 2 is refused at the handshake; version 4: the frame tags are
 * AES-256-GMAC (pd/mac.h), so a version 3 peer is refused there too. Bytes 0-7 keep their place in
 * every version, so a peer of another version is refused naming both. */
const kvt_auth_realm kvt__auth_pd = {0x4155504bu /* "KPUA" */, 4, "kvt-pd-server", "kvt-pd-client",
                                     "server", "PD endpoint", false};
const kvt_auth_realm kvt__auth_group = {0x4154564bu /* "KVTA" */, 1, "kvtier-hub", "kvtier-rank",
                                        "hub", "rank-group hub", true};
/* The node server's Unix socket, when it has a secret (server/conn.c). */
const kvt_auth_realm kvt__auth_server = {0x4153564bu /* "KVSA" */, 1, "kvt-node-server", "kvt-node-client",
                                         "server", "node server", false};

/* Node servers pulling blocks from each other (src/cluster). */
const kvt_auth_realm kvt__auth_cluster = {0x4143564bu /* "KVCA" */, 1, "kvt-cluster-peer",
                                          "kvt-cluster-puller", "peer", "cluster peer", false};

static const kvt_auth_realm *realm(const kvt_stream_auth *a)
{
    return a->realm ? a->realm : &kvt__auth_pd;
}

const char *kvt__auth_refusal(uint32_t code)
{
    switch (code & 0xffff) { /* the high half may carry a version */
    case KVT_AUTH_NEED_SECRET: return "the server requires a shared secret the client lacks";
    case KVT_AUTH_BAD_RANK: return "rank unknown, duplicate or group size differs";
    case KVT_AUTH_BAD_PROOF: return "wrong proof of the shared secret (the two ends hold different secrets)";
    case KVT_AUTH_BAD_HELLO: return "malformed hello (not a kvtier peer of this kind)";
    case KVT_AUTH_BAD_VERSION: return "another handshake version (upgrade both ends together)";
    case KVT_AUTH_NOT_ADMITTED:
        return "this client's user is not admitted (a node server admits its own user, root and "
               "the members of server_socket_group)";
    default: {
        /* named by number: a newer peer's code, or not a kvtier peer */
        static _Thread_local char b[96];
        snprintf(b, sizeof b, "refusal code %u, which this version does not know (upgrade both ends together)",
                 code);
        return b;
    }
    }
}

/* A verdict the client read: the server's refusal in words. */
static kvt_status refused(const kvt_stream_auth *a, const uint8_t *p)
{
    const kvt_auth_realm *r = realm(a);
    if (kvt__get32(p) != r->magic)
        return kvt__fail(KVT_EAUTH, "%s: the %s is not a kvtier %s (bad handshake magic)", a->who,
                         r->server_noun, r->what);
    uint32_t code = kvt__get32(p + 4);
    if ((code & 0xffff) == KVT_AUTH_BAD_VERSION) /* a version refusal, as everywhere: EVERSION */
        return kvt__fail(KVT_EVERSION, "%s: the %s refused: it speaks %s handshake version %u, this end %u: "
                         "upgrade both ends together", a->who, r->server_noun, r->what, code >> 16,
                         r->version);
    return kvt__fail(KVT_EAUTH, "%s: the %s refused: %s", a->who, r->server_noun, kvt__auth_refusal(code));
}

/* Without a secret the MAC is zeros: the exchange then only checks the
 * HELLO (magic, version, claim). */
static void mac(const kvt_stream_auth *a, const char *label, const uint8_t *hello,
                const uint8_t *nonce, uint8_t *out)
{
    if (!a->secret) {
        memset(out, 0, MACLEN);
        return;
    }
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, a->secret, a->secret_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
    crypto_auth_hmacsha256_update(&st, hello, HELLO_LEN);
    crypto_auth_hmacsha256_update(&st, nonce, NONCE);
    crypto_auth_hmacsha256_final(&st, out);
}

/* The connection's session key: a MAC over the whole HELLO and the
 * server's nonce under its own label, so it is fresh per connection and
 * known only to holders of the secret. */
static void session_key(const kvt_stream_auth *a, const uint8_t *hello, const uint8_t *nonce)
{
    if (a->secret && a->session_key) mac(a, "kvt-pd-session", hello, nonce, a->session_key);
}

static kvt_status io(int fd, void *p, size_t n, uint64_t dl, int w)
{
    struct iovec v = {p, n};
    return kvt__stream_fd_io(fd, &v, 1, dl, w);
}

/* ---- the server's steps (no I/O, no message) ---- */

uint32_t kvt__auth_hello_rank(const uint8_t hello[KVT_AUTH_HELLO])
{
    return kvt__get32(hello + 8);
}

void kvt__auth_refuse_chal(const kvt_stream_auth *a, uint8_t chal[KVT_AUTH_CHAL], uint32_t code)
{
    memset(chal, 0, CHAL_LEN);
    kvt__put32(chal, realm(a)->magic);
    kvt__put32(chal + 4, code);
}

/* A HELLO's refusal code: its realm and version, the secret, the claim. */
static uint32_t check_hello(const kvt_stream_auth *a, const uint8_t *h)
{
    const kvt_auth_realm *r = realm(a);
    if (kvt__get32(h) != r->magic) return KVT_AUTH_BAD_HELLO;
    if (h[4] != r->version) return KVT_AUTH_BAD_VERSION | (uint32_t)r->version << 16;
    if (a->secret && !h[6]) return KVT_AUTH_NEED_SECRET;
    if (!r->claims_rank) return KVT_AUTH_OK;
    uint32_t rank = kvt__get32(h + 8);
    if (kvt__get32(h + 12) != a->ranks || rank == 0 || rank >= a->ranks) return KVT_AUTH_BAD_RANK;
    return KVT_AUTH_OK;
}

uint32_t kvt__auth_hello(const kvt_stream_auth *a, const uint8_t hello[KVT_AUTH_HELLO],
                         uint8_t chal[KVT_AUTH_CHAL])
{
    uint32_t code = check_hello(a, hello);
    kvt__auth_refuse_chal(a, chal, code);
    if (code != KVT_AUTH_OK) return code;
    randombytes_buf(chal + 8, NONCE);
    mac(a, realm(a)->server_label, hello, chal + 8, chal + 8 + NONCE);
    return KVT_AUTH_OK;
}

uint32_t kvt__auth_proof(const kvt_stream_auth *a, const uint8_t hello[KVT_AUTH_HELLO],
                         const uint8_t chal[KVT_AUTH_CHAL], const uint8_t resp[KVT_AUTH_MAC])
{
    uint8_t want[MACLEN];
    mac(a, realm(a)->client_label, hello, chal + 8, want);
    if (a->secret && sodium_memcmp(want, resp, MACLEN) != 0) return KVT_AUTH_BAD_PROOF;
    return KVT_AUTH_OK;
}

void kvt__auth_verdict(const kvt_stream_auth *a, uint8_t ack[KVT_AUTH_ACK], uint32_t code)
{
    kvt__put32(ack, realm(a)->magic);
    kvt__put32(ack + 4, code);
}

/* ---- both ends on one blocking connection ---- */

static kvt_status refuse(const kvt_stream_auth *a, int fd, uint32_t code, uint64_t dl)
{
    uint8_t ack[ACK_LEN];
    kvt__auth_verdict(a, ack, code);
    (void)io(fd, ack, ACK_LEN, dl, 1);
    return kvt__fail(KVT_EAUTH, "%s", kvt__auth_refusal(code));
}

/* A HELLO that did not come: say whether the peer stayed silent or left. */
static kvt_status no_hello(kvt_status io_status)
{
    return kvt__fail(KVT_EAUTH, io_status == KVT_ETIMEDOUT ? "no hello before the deadline"
                                                           : "the peer hung up before its hello");
}

kvt_status kvt__stream_auth_server(int fd, const kvt_stream_auth *a, uint64_t dl)
{
    const kvt_auth_realm *r = realm(a);
    uint8_t hello[HELLO_LEN] = {0}, chal[CHAL_LEN], resp[MACLEN], ack[ACK_LEN];
    /* magic and version first: a peer of another version may send a HELLO
     * of another length, and is refused at once rather than at the deadline */
    kvt_status st = io(fd, hello, 8, dl, 0);
    if (st) return no_hello(st);
    uint32_t code = kvt__get32(hello) == r->magic && hello[4] == r->version ? KVT_AUTH_OK
                                                                            : kvt__auth_hello(a, hello, chal);
    if (code == KVT_AUTH_OK && (st = io(fd, hello + 8, sizeof hello - 8, dl, 0)))
        return no_hello(st);
    if (code == KVT_AUTH_OK) code = kvt__auth_hello(a, hello, chal);
    if (code == KVT_AUTH_OK && a->refuse) {
        code = a->refuse;
        kvt__auth_refuse_chal(a, chal, code);
    }
    if (code != KVT_AUTH_OK) {
        (void)io(fd, chal, sizeof chal, dl, 1);
        if ((code & 0xffff) == KVT_AUTH_BAD_VERSION)
            return kvt__fail(KVT_EVERSION, "the peer speaks %s handshake version %u, this end %u: upgrade both "
                             "ends together", r->what, hello[4], r->version);
        return kvt__fail(KVT_EAUTH, "%s", kvt__auth_refusal(code));
    }
    if (io(fd, chal, sizeof chal, dl, 1) != KVT_OK)
        return kvt__fail(KVT_EAUTH, "the peer did not take the challenge");
    st = io(fd, resp, sizeof resp, dl, 0);
    if (st == KVT_ETIMEDOUT) return kvt__fail(KVT_EAUTH, "no proof of the shared secret before the deadline");
    if (st) /* a client of this version answers even when our proof failed it */
        return kvt__fail(KVT_EAUTH, "the peer hung up instead of proving the shared secret");
    code = kvt__auth_proof(a, hello, chal, resp);
    if (code != KVT_AUTH_OK) return refuse(a, fd, code, dl);
    kvt__auth_verdict(a, ack, KVT_AUTH_OK);
    session_key(a, hello, chal + 8);
    return io(fd, ack, sizeof ack, dl, 1);
}

static void client_hello(const kvt_stream_auth *a, uint8_t hello[HELLO_LEN])
{
    const kvt_auth_realm *r = realm(a);
    memset(hello, 0, HELLO_LEN);
    kvt__put32(hello, r->magic);
    hello[4] = r->version;
    hello[6] = a->secret ? 1 : 0;
    if (r->claims_rank) {
        kvt__put32(hello + 8, a->rank);
        kvt__put32(hello + 12, a->ranks);
    }
    randombytes_buf(hello + 16, NONCE);
}

kvt_status kvt__stream_auth_client(int fd, const kvt_stream_auth *a, uint64_t dl)
{
    const kvt_auth_realm *r = realm(a);
    uint8_t hello[HELLO_LEN], chal[CHAL_LEN], want[MACLEN], resp[MACLEN], ack[ACK_LEN];
    client_hello(a, hello);
    kvt_status st = io(fd, hello, sizeof hello, dl, 1);
    if (!st) st = io(fd, chal, ACK_LEN, dl, 0);
    if (st == KVT_ETIMEDOUT && r->claims_rank)
        /* A hub whose group has formed accepts at the kernel and answers no
         * one, so silence most often means this rank's place is taken. */
        return kvt__fail(KVT_ECONN, "%s: the %s did not answer the hello in time: its group may "
                         "have formed without this rank (its place may be taken: another "
                         "process running as rank %u, or a stale one from an earlier run), or "
                         "the address is not this group's hub", a->who, r->server_noun, a->rank);
    if (st == KVT_ETIMEDOUT)
        return kvt__fail(KVT_ECONN, "%s: the %s did not answer the hello in time", a->who, r->server_noun);
    if (st)
        return kvt__fail(KVT_ECONN, "%s: the %s closed the connection before answering the hello (busy, or "
                         "dropping strangers)", a->who, r->server_noun);
    if (kvt__get32(chal) == r->magic && kvt__get32(chal + 4) == KVT_AUTH_BAD_PROOF)
        /* never in a CHALLENGE of this version: a PD endpoint of version 1
         * numbered its "malformed hello" so */
        return kvt__fail(KVT_EVERSION, "%s: the %s refused our hello: it speaks an older %s handshake version "
                         "than this end's %u: upgrade both ends together", a->who, r->server_noun, r->what,
                         r->version);
    if (kvt__get32(chal) != r->magic || kvt__get32(chal + 4) != KVT_AUTH_OK) return refused(a, chal);
    if (io(fd, chal + ACK_LEN, sizeof chal - ACK_LEN, dl, 0) != KVT_OK)
        return kvt__fail(KVT_ECONN, "%s: truncated challenge", a->who);
    mac(a, r->server_label, hello, chal + 8, want);
    mac(a, r->client_label, hello, chal + 8, resp);
    if (a->secret && sodium_memcmp(want, chal + 8 + NONCE, MACLEN) != 0) {
        /* A server that has a secret (its MAC is not zeros) still gets
         * our proof, so it can say "wrong secret" too rather than "no
         * proof". One without a secret would accept any proof and take the
         * link for joined: it sees us hang up instead. */
        if (!sodium_is_zero(chal + 8 + NONCE, MACLEN)) (void)io(fd, resp, sizeof resp, dl, 1);
        return kvt__fail(KVT_EAUTH, "%s: the %s could not prove the shared secret: the %s and this end hold "
                         "different secrets (a wrong secret on this end or on the %s), or the %s has none",
                         a->who, r->server_noun, r->server_noun, r->server_noun, r->server_noun);
    }
    st = io(fd, resp, sizeof resp, dl, 1);
    if (!st) st = io(fd, ack, sizeof ack, dl, 0);
    if (st) return kvt__fail(KVT_EAUTH, "%s: no verdict from the %s", a->who, r->server_noun);
    if (kvt__get32(ack) != r->magic || kvt__get32(ack + 4) != KVT_AUTH_OK) return refused(a, ack);
    session_key(a, hello, chal + 8);
    return KVT_OK;
}

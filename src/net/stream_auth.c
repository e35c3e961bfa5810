/* stream_auth.c - who may talk to a PD endpoint. The client sends HELLO
 * (magic, version, whether it holds a secret, a nonce); the server answers
 * CHALLENGE (a status, its nonce and, with a secret, a MAC proving it holds
 * it); the client answers with its own MAC; the server says ACCEPT or
 * REFUSE. Both MACs (HMAC-SHA256) cover the HELLO and the server nonce under
 * distinct labels, so neither can be replayed or reflected. Comparisons are
 * constant-time. Same scheme as the rank-group TCP hub (net/tcp_auth.c),
 * whose helper is private to its transport. */
#include <sodium.h>
#include <string.h>
#include "net/stream.h"
#include "util/err.h"
#include "util/le.h"

#define A_MAGIC 0x4155504bu /* "KPUA" */
/* 2: frames after the handshake are authenticated with the session key
 * when there is a secret (pd/mac.h), so a version 1 peer is refused here,
 * naming both versions, rather than failing its first frame. */
#define A_VERSION 2
#define NONCE 32
#define MACLEN 32
#define HELLO_LEN (4 + 4 + NONCE)
#define CHAL_LEN (4 + 4 + NONCE + MACLEN)
#define ACK_LEN 8

enum { A_OK = 0, A_NEED_SECRET = 1, A_BAD_PROOF = 2, A_BAD_HELLO = 3, A_BAD_VERSION = 4 };

static const char *why(uint32_t code)
{
    switch (code) {
    case A_NEED_SECRET: return "the server requires a shared secret the client lacks";
    case A_BAD_PROOF: return "wrong proof of the shared secret (the two ends hold different secrets)";
    case A_BAD_HELLO: return "malformed hello (not a kvtier PD peer, or a handshake version before 2)";
    case A_BAD_VERSION: return "another handshake version";
    default: return "a refusal this version does not know (upgrade both ends together)";
    }
}

/* A verdict the client read: the server's refusal in words. */
static kvt_status refused(const kvt_stream_auth *a, const uint8_t *p)
{
    if (kvt__get32(p) != A_MAGIC)
        return kvt__fail(KVT_EAUTH, "%s: the server is not a kvtier PD endpoint (bad handshake magic)", a->who);
    uint32_t code = kvt__get32(p + 4);
    if ((code & 0xffff) == A_BAD_VERSION) /* the server's version in the high half */
        return kvt__fail(KVT_EAUTH, "%s: the server refused: it speaks PD handshake version %u, this end %u: "
                         "upgrade prefill, decode and bootstrap together", a->who, code >> 16, A_VERSION);
    if (code == A_BAD_HELLO)
        return kvt__fail(KVT_EAUTH, "%s: the server refused: %s; this end speaks version %u", a->who, why(code),
                         A_VERSION);
    return kvt__fail(KVT_EAUTH, "%s: the server refused: %s (code %u)", a->who, why(code), code);
}



static void mac(const kvt_stream_auth *a, const char *label, const uint8_t *hello,
                const uint8_t *nonce, uint8_t *out)
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, a->secret, a->secret_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
    crypto_auth_hmacsha256_update(&st, hello, HELLO_LEN);
    crypto_auth_hmacsha256_update(&st, nonce, NONCE);
    crypto_auth_hmacsha256_final(&st, out);
}

/* The connection's key for pd/mac.h, when asked for and there is a secret:
 * the secret over both nonces under a label of its own (neither proof). */
static void session_key(const kvt_stream_auth *a, const uint8_t *hello, const uint8_t *nonce)
{
    if (a->secret && a->session_key) mac(a, "kvt-pd-session", hello, nonce, a->session_key);
}

static kvt_status io(int fd, void *p, size_t n, uint64_t dl, int w)
{
    struct iovec v = {p, n};
    return kvt__stream_fd_io(fd, &v, 1, dl, w);
}

static kvt_status refuse(int fd, uint32_t code, uint64_t dl)
{
    uint8_t ack[CHAL_LEN] = {0};
    kvt__put32(ack, A_MAGIC);
    kvt__put32(ack + 4, code);
    (void)io(fd, ack, ACK_LEN, dl, 1);
    return kvt__fail(KVT_EAUTH, "%s", why(code));
}

kvt_status kvt__stream_auth_server(int fd, const kvt_stream_auth *a, uint64_t dl)
{
    uint8_t hello[HELLO_LEN], chal[CHAL_LEN] = {0}, resp[MACLEN], want[MACLEN], ack[ACK_LEN];
    if (io(fd, hello, sizeof hello, dl, 0) != KVT_OK)
        return kvt__fail(KVT_EAUTH, "no hello before the deadline");
    uint32_t code = A_OK;
    if (kvt__get32(hello) != A_MAGIC) code = A_BAD_HELLO;
    else if (hello[4] != A_VERSION) code = A_BAD_VERSION | (uint32_t)A_VERSION << 16;
    else if (a->secret && !hello[5]) code = A_NEED_SECRET;
    kvt__put32(chal, A_MAGIC);
    kvt__put32(chal + 4, code);
    if (code != A_OK) {
        (void)io(fd, chal, sizeof chal, dl, 1);
        if ((code & 0xffff) == A_BAD_VERSION)
            return kvt__fail(KVT_EAUTH, "the peer speaks PD handshake version %u, this end %u: upgrade "
                             "prefill, decode and bootstrap together", hello[4], A_VERSION);
        return kvt__fail(KVT_EAUTH, "%s", why(code));
    }
    randombytes_buf(chal + 8, NONCE);
    if (a->secret) mac(a, "kvt-pd-server", hello, chal + 8, chal + 8 + NONCE);
    if (io(fd, chal, sizeof chal, dl, 1) != KVT_OK)
        return kvt__fail(KVT_EAUTH, "the peer did not take the challenge");
    kvt_status st = io(fd, resp, sizeof resp, dl, 0);
    if (st == KVT_ETIMEDOUT) return kvt__fail(KVT_EAUTH, "no proof of the shared secret before the deadline");
    if (st) /* a client of this version answers even when our proof failed it */
        return kvt__fail(KVT_EAUTH, "the peer hung up instead of proving the shared secret");
    if (a->secret) {
        mac(a, "kvt-pd-client", hello, chal + 8, want);
        if (sodium_memcmp(want, resp, MACLEN) != 0) return refuse(fd, A_BAD_PROOF, dl);
    }
    kvt__put32(ack, A_MAGIC);
    kvt__put32(ack + 4, A_OK);
    session_key(a, hello, chal + 8);
    return io(fd, ack, sizeof ack, dl, 1);
}

kvt_status kvt__stream_auth_client(int fd, const kvt_stream_auth *a, uint64_t dl)
{
    uint8_t hello[HELLO_LEN] = {0}, chal[CHAL_LEN], want[MACLEN], resp[MACLEN] = {0}, ack[ACK_LEN];
    kvt__put32(hello, A_MAGIC);
    hello[4] = A_VERSION;
    hello[5] = a->secret ? 1 : 0;
    randombytes_buf(hello + 8, NONCE);
    kvt_status st = io(fd, hello, sizeof hello, dl, 1);
    if (!st) st = io(fd, chal, ACK_LEN, dl, 0);
    if (st == KVT_ETIMEDOUT) return kvt__fail(KVT_ECONN, "%s: the server did not answer the hello in time", a->who);
    if (st) return kvt__fail(KVT_ECONN, "%s: the server closed the connection before answering the hello (busy, or dropping strangers)", a->who);
    if (kvt__get32(chal) != A_MAGIC || kvt__get32(chal + 4) != A_OK) return refused(a, chal);
    if (io(fd, chal + ACK_LEN, sizeof chal - ACK_LEN, dl, 0) != KVT_OK)
        return kvt__fail(KVT_ECONN, "%s: truncated challenge", a->who);
    if (a->secret) {
        mac(a, "kvt-pd-server", hello, chal + 8, want);
        mac(a, "kvt-pd-client", hello, chal + 8, resp);
        if (sodium_memcmp(want, chal + 8 + NONCE, MACLEN) != 0) {
            /* our proof still goes out, so the server can say "wrong
             * secret" too rather than "no proof" */
            (void)io(fd, resp, sizeof resp, dl, 1);
            return kvt__fail(KVT_EAUTH, "%s: the server could not prove the shared secret (the two ends hold "
                             "different secrets, or the server has none)", a->who);
        }
    }
    st = io(fd, resp, sizeof resp, dl, 1);
    if (!st) st = io(fd, ack, sizeof ack, dl, 0);
    if (st) return kvt__fail(KVT_EAUTH, "%s: no verdict from the server", a->who);
    if (kvt__get32(ack) != A_MAGIC || kvt__get32(ack + 4) != A_OK) return refused(a, ack);
    session_key(a, hello, chal + 8);
    return KVT_OK;
}

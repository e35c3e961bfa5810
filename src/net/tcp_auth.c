/* tcp_auth.c - who may join a TCP group. The client sends HELLO (its rank,
 * the group size, a nonce); the hub answers CHALLENGE (its nonce and, with a
 * secret, a MAC proving it holds the secret); the client answers with its
 * own MAC; the hub says ACCEPT or REFUSE. Both MACs cover the HELLO and both
 * nonces, under distinct labels, so neither can be replayed or reflected.
 * Comparisons are constant-time (sodium_memcmp). */
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include "net/tcp.h"
#include "util/err.h"
#include "util/le.h"

#define AUTH_MAGIC 0x4154564bu /* "KVTA" little-endian */
#define AUTH_VERSION 1
#define HELLO_LEN KVT_TCP_HELLO_LEN
#define CHAL_LEN KVT_TCP_CHAL_LEN
#define ACK_LEN KVT_TCP_ACK_LEN

static void mac(const tcp_net *t, const char *label, const uint8_t *hello,
                const uint8_t *nonce_h, uint8_t out[KVT_TCP_MAC])
{
    if (!t->secret) {
        memset(out, 0, KVT_TCP_MAC);
        return;
    }
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, t->secret, t->secret_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label) + 1);
    crypto_auth_hmacsha256_update(&st, hello, HELLO_LEN);
    crypto_auth_hmacsha256_update(&st, nonce_h, KVT_TCP_NONCE);
    crypto_auth_hmacsha256_final(&st, out);
}

const char *kvt__tcp_refusal(uint32_t code)
{
    switch (code) {
    case KVT_TCP_ST_NEED_SECRET: return "the hub requires a shared secret this rank lacks";
    case KVT_TCP_ST_BAD_RANK: return "rank unknown, duplicate or group size differs";
    case KVT_TCP_ST_BAD_PROOF: return "wrong proof of the shared secret";
    case KVT_TCP_ST_BAD_HELLO: return "malformed hello";
    default: {
        /* named by number: a newer hub's code, or not a kvtier hub */
        static _Thread_local char b[96];
        snprintf(b, sizeof b, "refusal code %u, which this version does not know (upgrade every rank together)",
                 code);
        return b;
    }
    }
}

static kvt_status client_finish(tcp_net *t, int fd, const uint8_t *hello, uint64_t dl)
{
    uint8_t chal[CHAL_LEN], want[KVT_TCP_MAC], resp[KVT_TCP_MAC], ack[ACK_LEN];
    kvt_status st = kvt__tcp_read_all(fd, chal, sizeof chal, dl);
    if (st != KVT_OK) return st;
    if (kvt__get32(chal) != AUTH_MAGIC)
        return kvt__fail(KVT_EAUTH, "net tcp: rank %u: the hub is not a kvtier hub", t->base.rank);
    if (kvt__get32(chal + 4) != KVT_TCP_ST_OK)
        return kvt__fail(KVT_EAUTH, "net tcp: rank %u: the hub refused: %s", t->base.rank,
                         kvt__tcp_refusal(kvt__get32(chal + 4)));
    mac(t, "kvtier-hub", hello, chal + 8, want);
    if (t->secret && sodium_memcmp(want, chal + 8 + KVT_TCP_NONCE, KVT_TCP_MAC) != 0)
        return kvt__fail(KVT_EAUTH, "net tcp: rank %u: the hub could not prove the shared secret: the hub and "
                         "this rank hold different secrets (a wrong secret on this rank or on the hub), or "
                         "the hub has none", t->base.rank);
    mac(t, "kvtier-rank", hello, chal + 8, resp);
    st = kvt__tcp_write_all(fd, resp, sizeof resp, dl);
    if (st == KVT_OK) st = kvt__tcp_read_all(fd, ack, sizeof ack, dl);
    if (st != KVT_OK) return st;
    if (kvt__get32(ack) != AUTH_MAGIC || kvt__get32(ack + 4) != KVT_TCP_ST_OK)
        return kvt__fail(KVT_EAUTH, "net tcp: rank %u: the hub refused: %s", t->base.rank,
                         kvt__tcp_refusal(kvt__get32(ack + 4)));
    return KVT_OK;
}

kvt_status kvt__tcp_auth_client(tcp_net *t, int fd, uint64_t dl)
{
    uint8_t hello[HELLO_LEN];
    kvt__put32(hello, AUTH_MAGIC);
    hello[4] = AUTH_VERSION;
    hello[5] = 0;
    hello[6] = t->secret ? 1 : 0;
    hello[7] = 0;
    kvt__put32(hello + 8, t->base.rank);
    kvt__put32(hello + 12, t->base.ranks);
    randombytes_buf(hello + 16, KVT_TCP_NONCE);
    kvt_status st = kvt__tcp_write_all(fd, hello, sizeof hello, dl);
    if (st != KVT_OK) return st;
    return client_finish(t, fd, hello, dl);
}

/* Validates a HELLO; returns a refusal code. */
static uint32_t check_hello(const tcp_net *t, const uint8_t *h, const int *fds)
{
    if (kvt__get32(h) != AUTH_MAGIC || h[4] != AUTH_VERSION) return KVT_TCP_ST_BAD_HELLO;
    if (t->secret && !h[6]) return KVT_TCP_ST_NEED_SECRET;
    uint32_t rank = kvt__get32(h + 8);
    if (kvt__get32(h + 12) != t->base.ranks || rank == 0 || rank >= t->base.ranks || fds[rank] >= 0)
        return KVT_TCP_ST_BAD_RANK;
    return KVT_TCP_ST_OK;
}

void kvt__tcp_hub_status(uint8_t ack[KVT_TCP_ACK_LEN], uint32_t code)
{
    kvt__put32(ack, AUTH_MAGIC);
    kvt__put32(ack + 4, code);
}

uint32_t kvt__tcp_hello_rank(const uint8_t hello[KVT_TCP_HELLO_LEN])
{
    return kvt__get32(hello + 8);
}

uint32_t kvt__tcp_hub_hello(const tcp_net *t, const uint8_t hello[KVT_TCP_HELLO_LEN],
                            uint8_t chal[KVT_TCP_CHAL_LEN])
{
    memset(chal, 0, KVT_TCP_CHAL_LEN);
    uint32_t code = check_hello(t, hello, t->fds);
    kvt__put32(chal, AUTH_MAGIC);
    kvt__put32(chal + 4, code);
    if (code != KVT_TCP_ST_OK) return code;
    randombytes_buf(chal + 8, KVT_TCP_NONCE);
    mac(t, "kvtier-hub", hello, chal + 8, chal + 8 + KVT_TCP_NONCE);
    return KVT_TCP_ST_OK;
}

uint32_t kvt__tcp_hub_proof(const tcp_net *t, const uint8_t hello[KVT_TCP_HELLO_LEN],
                            const uint8_t chal[KVT_TCP_CHAL_LEN], const uint8_t resp[KVT_TCP_MAC])
{
    uint8_t want[KVT_TCP_MAC];
    mac(t, "kvtier-rank", hello, chal + 8, want);
    if (t->secret && sodium_memcmp(want, resp, KVT_TCP_MAC) != 0) return KVT_TCP_ST_BAD_PROOF;
    return KVT_TCP_ST_OK;
}

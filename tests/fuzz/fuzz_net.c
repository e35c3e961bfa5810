/* fuzz_net.c - what the socket layers decode from whoever connects, before
 * anything is authenticated or while a rank-group link is up: the TCP
 * rank-group transport's length-prefixed messages (tcp_recv: first_byte,
 * the u32 length checked against max_msg before kvt__buf_reserve, the read
 * of the body, closing the link on a cut or oversized message), its join
 * handshake on both sides (the hub's steps kvt__auth_hello / _proof /
 * _verdict as tcp.c drives them: HELLO checks, CHALLENGE, proof, verdict;
 * kvt__stream_auth_client in the group realm: CHALLENGE, the hub's MAC,
 * ACK), and the same handshake in the PD realm on both sides
 * (kvt__stream_auth_server / kvt__stream_auth_client): one handshake
 * (stream_auth.c), fed as each realm uses it. These run on every listener a stranger can
 * reach (group hub, PD sender, bootstrap service), so a malformed or hostile
 * peer must only ever get a refusal.
 *
 * Input: byte 0 picks the decoder ((byte 0 & 7) % 5) and, with bit 3 set, the
 * variant: 0 tcp_recv on a rank (from the hub; max_msg 4 MiB, the default)
 * or, bit 3, on the hub (from rank 1; max_msg 4096), reading messages until
 * the link fails; 1 the hub's steps, 2 the group client,
 * 3 kvt__stream_auth_server, 4 kvt__stream_auth_client (PD), each without or
 * (bit 3) with a shared secret. The rest of the input (at most 128 KiB) is
 * written into one end of a socketpair, whose write side is then shut, and
 * the decoder reads the other end with a 50 ms deadline: it never waits,
 * since every byte it can get is already there. Nonces are random (the
 * handshakes' randombytes_buf), so a MAC is never guessed: with a secret
 * the fuzzer covers the refusals, without one the whole exchange. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "net/net.h"
#include "net/stream.h"
#include "net/tcp.h"
#include "util/clock.h"
#include "util/err.h"

#define MAX_INPUT (128u << 10)

static tcp_net *g_rank[2], *g_hub[2]; /* [1]: with a secret */
static const uint8_t g_secret[32] = "fuzz_net shared secret, 32 byte";

static tcp_net *make(uint32_t rank, uint32_t max_msg, int secret)
{
    kvt_net *n = NULL;
    kvt_net_tcp_params p = {.rank = rank, .ranks = 4, .host = "127.0.0.1", .port = rank ? 1 : 0,
                            .secret = secret ? g_secret : NULL, .secret_len = secret ? sizeof g_secret : 0,
                            .max_msg = max_msg};
    if (kvt_net_tcp_create(&n, &p) != KVT_OK) abort();
    return (tcp_net *)n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    for (int s = 0; s < 2; s++) {
        g_rank[s] = make(1, 0, s);
        g_hub[s] = make(0, 4096, s); /* binds a listener on 127.0.0.1 (never accepts) */
    }
    return 0;
}

/* Every message of the link until it fails; the link (fd, as a TCP
 * stream) is ours unless the transport closed it (a cut or oversized
 * message). */
static void recv_all(tcp_net *t, uint32_t peer, int fd)
{
    kvt_stream **slot = &t->links[t->base.rank == 0 ? peer : 0], *s = NULL;
    if (kvt__stream_tcp_wrap(fd, &s) != KVT_OK) abort();
    *slot = s;
    kvt_buf buf = {0};
    uint64_t dl = kvt__deadline_ns(50);
    while (kvt__net_recv(&t->base, peer, &buf, dl) == KVT_OK) {
        if (buf.len > t->base.max_msg || (buf.len && buf.cap < buf.len)) abort();
    }
    kvt__buf_free(&buf);
    if (*slot) {
        if (*slot != s) abort();
        kvt__stream_destroy(s); /* closes fd */
        *slot = NULL;
    }
}

/* The hub's side of one handshake as tcp.c drives its steps (HELLO in,
 * CHALLENGE out, proof in, ack out), over one connection: the steps
 * decode what a stranger sends, so they are what this target feeds. */
static kvt_status hub_handshake(const tcp_net *t, int fd, uint32_t *rank, uint64_t dl)
{
    uint8_t hello[KVT_AUTH_HELLO], chal[KVT_AUTH_CHAL], resp[KVT_AUTH_MAC], ack[KVT_AUTH_ACK];
    kvt_status st = kvt__tcp_read_all(fd, hello, sizeof hello, dl);
    if (st) return st;
    uint32_t code = kvt__auth_hello(&t->auth, hello, chal);
    st = kvt__tcp_write_all(fd, chal, sizeof chal, dl);
    if (st || code != KVT_AUTH_OK) return st ? st : KVT_EAUTH;
    st = kvt__tcp_read_all(fd, resp, sizeof resp, dl);
    if (st) return st;
    code = kvt__auth_proof(&t->auth, hello, chal, resp);
    kvt__auth_verdict(&t->auth, ack, code);
    st = kvt__tcp_write_all(fd, ack, sizeof ack, dl);
    if (st || code != KVT_AUTH_OK) return st ? st : KVT_EAUTH;
    *rank = kvt__auth_hello_rank(hello);
    return KVT_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t mode = data[0];
    int sec = (mode >> 3) & 1;
    data++;
    size--;
    if (size > MAX_INPUT) size = MAX_INPUT;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    for (size_t off = 0; off < size;) { /* a smaller socket buffer than asked for cuts the input */
        ssize_t w = write(sv[0], data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    int fd = sv[1];
    uint64_t dl = kvt__deadline_ns(50);
    uint32_t rank = 0;
    kvt_stream_auth a = {sec ? g_secret : NULL, sec ? sizeof g_secret : 0, "fuzz"};
    switch ((mode & 7) % 5) {
    case 0:
        if (sec) recv_all(g_hub[0], 1, fd);
        else recv_all(g_rank[0], 0, fd);
        fd = -1;
        break;
    case 1:
        if (hub_handshake(g_hub[sec], fd, &rank, dl) == KVT_OK && (rank == 0 || rank >= 4)) abort();
        break;
    case 2: (void)kvt__stream_auth_client(fd, &g_rank[sec]->auth, dl); break;
    case 3: (void)kvt__stream_auth_server(fd, &a, dl); break;
    default: (void)kvt__stream_auth_client(fd, &a, dl); break;
    }
    if (fd >= 0) close(fd);
    close(sv[0]);
    kvt__clear_error();
    return 0;
}

/* mac.h - every PD frame after the handshake authenticated, when the
 * endpoints share a secret (wire version 4).
 *
 * The handshake (net/stream_auth.c) gives both ends a 32-byte session key,
 * HMAC-SHA256 of the secret over both nonces: fresh per connection, known
 * only to holders of the secret. Each direction derives its own AES-256
 * key from it (crypto_kdf), and numbers its frames 0, 1, 2, ...; frame n
 * carries two AES-256-GMAC tags (AES-GCM over additional data only, from
 * OpenSSL: AES-NI and carry-less multiplication, several times Poly1305's
 * rate on one core), with the 96-bit nonces direction | part | n (part 0:
 * the header, part 1: the body). A frame is then
 *   header (48) | header tag (16) | body or payload | body tag (16)
 * (no body tag when there is neither body nor payload): the header tag lets
 * the receiver check a header (its lengths, its room) before acting on it;
 * the body tag covers header and body/payload. A DATA frame carries no XXH3
 * trailer then: its tag covers every byte, which the checksums could not
 * against a peer who recomputes them. Because n is implicit, each nonce is
 * used once per key, and each direction has its own key, a frame altered,
 * injected, replayed, reordered or dropped, or one reflected back, fails the
 * next check, and the link dies naming the peer and "authentication".
 * Without a secret nothing is tagged (m NULL below): frames are as in
 * version 2. Version 3 tagged with ChaCha20-derived Poly1305 keys; the
 * handshake refuses a version 3 peer naming both versions. */
#ifndef KVT_PD_MAC_H
#define KVT_PD_MAC_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include "net/stream.h"
#include "pd/wire.h"

#define PD_TAG_LEN 16
#define PD_SESSION_KEY_LEN 32

typedef struct pd_mac_dir {
    EVP_CIPHER_CTX *gcm;  /* AES-256-GCM keyed for this direction; the current tag's state */
    uint8_t dir;          /* 1: client -> server, 2: server -> client */
    bool broken;          /* OpenSSL failed a call: every tag from here on is refused */
    uint64_t next;        /* the number of the next frame */
} pd_mac_dir;

typedef struct pd_mac {
    pd_mac_dir tx, rx;
} pd_mac;

/* The link's two directions from the handshake's session key; server: this
 * end accepted the connection. KVT_ENOMEM, KVT_ESYS (libsodium or OpenSSL
 * failed, named). */
kvt_status pd_mac_new(pd_mac **out, const uint8_t session[PD_SESSION_KEY_LEN], bool server);
void pd_mac_free(pd_mac *m);

/* Frame d->next starts: its header tag into tag; the body tag's state is
 * primed with the header. */
void pd_mac_head(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], uint8_t tag[PD_TAG_LEN]);
/* Like pd_mac_head, but checks tag (constant time): false when it differs. */
bool pd_mac_head_ok(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], const uint8_t tag[PD_TAG_LEN]);
/* More of the current frame's body or payload, in wire order. */
void pd_mac_body(pd_mac_dir *d, const void *p, size_t n);
void pd_mac_end(pd_mac_dir *d, uint8_t tag[PD_TAG_LEN]);
bool pd_mac_end_ok(pd_mac_dir *d, const uint8_t tag[PD_TAG_LEN]);

/* One whole frame over s: header hb, then body (blen bytes), each tagged
 * when m is set. async: through sendv_async when the stream has one.
 * KVT_ESYS when OpenSSL failed a tag (d->broken). */
kvt_status pd_mac_send(pd_mac *m, kvt_stream *s, const uint8_t hb[PD_HDR_LEN], const void *body,
                       size_t blen, uint64_t dl, bool async);
/* Reads a header (and, with m, its tag, checked: KVT_EAUTH when wrong). */
kvt_status pd_mac_recv_head(pd_mac *m, kvt_stream *s, uint8_t hb[PD_HDR_LEN], uint64_t dl);
/* Reads a body of blen bytes (and, with m, the body tag, checked). */
kvt_status pd_mac_recv_body(pd_mac *m, kvt_stream *s, void *body, size_t blen, uint64_t dl);

/* The message parts for a failed check, naming who and what. */
#define PD_MAC_WHY "altered, injected, replayed, reordered or dropped in transit, or not sent by the peer that proved the secret"

#endif

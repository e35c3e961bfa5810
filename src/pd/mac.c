/* mac.c - per-frame authentication of PD links (mac.h). */
#include "pd/mac.h"

#include <stdlib.h>
#include <string.h>
#include "util/err.h"

#define DIR_C2S 1
#define DIR_S2C 2

kvt_status pd_mac_new(pd_mac **out, const uint8_t session[PD_SESSION_KEY_LEN], bool server)
{
    *out = NULL;
    /* picks libsodium's SIMD Poly1305 and ChaCha20 (without it, the portable
     * ones: about half the speed); idempotent and thread-safe */
    if (sodium_init() < 0) return kvt__fail(KVT_ESYS, "pd: libsodium failed to initialise");
    pd_mac *m = calloc(1, sizeof *m); /* calloc: aligned for the Poly1305 state */
    if (!m) return kvt__fail(KVT_ENOMEM, "pd: out of memory for a link's keys");
    /* one key per direction: a frame reflected back at its sender fails */
    crypto_kdf_derive_from_key(m->tx.key, sizeof m->tx.key, server ? DIR_S2C : DIR_C2S, "kvtpdmac", session);
    crypto_kdf_derive_from_key(m->rx.key, sizeof m->rx.key, server ? DIR_C2S : DIR_S2C, "kvtpdmac", session);
    m->tx.dir = server ? DIR_S2C : DIR_C2S;
    m->rx.dir = server ? DIR_C2S : DIR_S2C;
    *out = m;
    return KVT_OK;
}

void pd_mac_free(pd_mac *m)
{
    if (!m) return;
    sodium_memzero(m, sizeof *m);
    free(m);
}

/* Frame d->next's two one-time Poly1305 keys (header, body); numbers it. */
static void frame_keys(pd_mac_dir *d, uint8_t otk[64])
{
    uint8_t nonce[crypto_stream_chacha20_ietf_NONCEBYTES] = {d->dir};
    kvt__put64(nonce + 4, d->next++);
    crypto_stream_chacha20_ietf(otk, 64, nonce, d->key);
}

void pd_mac_head(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], uint8_t tag[PD_TAG_LEN])
{
    uint8_t otk[64];
    frame_keys(d, otk);
    crypto_onetimeauth(tag, hdr, PD_HDR_LEN, otk);
    crypto_onetimeauth_init(&d->st, otk + 32);
    crypto_onetimeauth_update(&d->st, hdr, PD_HDR_LEN);
    sodium_memzero(otk, sizeof otk);
}

bool pd_mac_head_ok(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], const uint8_t tag[PD_TAG_LEN])
{
    uint8_t want[PD_TAG_LEN];
    pd_mac_head(d, hdr, want);
    return sodium_memcmp(want, tag, PD_TAG_LEN) == 0;
}

void pd_mac_end(pd_mac_dir *d, uint8_t tag[PD_TAG_LEN])
{
    crypto_onetimeauth_final(&d->st, tag);
}

bool pd_mac_end_ok(pd_mac_dir *d, const uint8_t tag[PD_TAG_LEN])
{
    uint8_t want[PD_TAG_LEN];
    pd_mac_end(d, want);
    return sodium_memcmp(want, tag, PD_TAG_LEN) == 0;
}

kvt_status pd_mac_send(pd_mac *m, kvt_stream *s, const uint8_t hb[PD_HDR_LEN], const void *body,
                       size_t blen, uint64_t dl, bool async)
{
    uint8_t htag[PD_TAG_LEN], btag[PD_TAG_LEN];
    struct iovec v[4];
    int n = 0;
    v[n++] = (struct iovec){(void *)hb, PD_HDR_LEN};
    if (m) {
        pd_mac_head(&m->tx, hb, htag);
        v[n++] = (struct iovec){htag, sizeof htag};
    }
    if (blen) {
        v[n++] = (struct iovec){(void *)body, blen};
        if (m) {
            pd_mac_body(&m->tx, body, blen);
            pd_mac_end(&m->tx, btag);
            v[n++] = (struct iovec){btag, sizeof btag};
        }
    }
    kvt_status (*send)(kvt_stream *, const struct iovec *, int, uint64_t) =
        async && s->ops->sendv_async ? s->ops->sendv_async : s->ops->sendv;
    return send(s, v, n, dl);
}

kvt_status pd_mac_recv_head(pd_mac *m, kvt_stream *s, uint8_t hb[PD_HDR_LEN], uint64_t dl)
{
    uint8_t tag[PD_TAG_LEN];
    struct iovec v[2] = {{hb, PD_HDR_LEN}, {tag, sizeof tag}};
    kvt_status st = s->ops->recvv(s, v, m ? 2 : 1, dl);
    if (st || !m) return st;
    uint64_t n = m->rx.next;
    if (!pd_mac_head_ok(&m->rx, hb, tag))
        return kvt__fail(KVT_EAUTH, "frame %llu failed authentication (its header: %s)", (unsigned long long)n,
                         PD_MAC_WHY);
    return KVT_OK;
}

kvt_status pd_mac_recv_body(pd_mac *m, kvt_stream *s, void *body, size_t blen, uint64_t dl)
{
    uint8_t tag[PD_TAG_LEN];
    if (!blen) return KVT_OK;
    struct iovec v[2] = {{body, blen}, {tag, sizeof tag}};
    kvt_status st = s->ops->recvv(s, v, m ? 2 : 1, dl);
    if (st || !m) return st;
    pd_mac_body(&m->rx, body, blen);
    if (!pd_mac_end_ok(&m->rx, tag))
        return kvt__fail(KVT_EAUTH, "frame %llu failed authentication (its body: %s)",
                         (unsigned long long)(m->rx.next - 1), PD_MAC_WHY);
    return KVT_OK;
}

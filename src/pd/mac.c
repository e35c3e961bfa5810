/* mac.c - per-frame authentication of PD links (mac.h). */
#include "pd/mac.h"

#include <limits.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include "util/err.h"

#define DIR_C2S 1
#define DIR_S2C 2
#define PART_HEAD 0
#define PART_BODY 1
#define GCM_IV_LEN 12

/* One direction: its key from the session key, an AES-256-GCM context
 * keyed once (each frame only sets a nonce: no key schedule per frame). */
static kvt_status dir_init(pd_mac_dir *d, const uint8_t session[PD_SESSION_KEY_LEN], uint8_t dir)
{
    uint8_t key[32];
    crypto_kdf_derive_from_key(key, sizeof key, dir, "kvtpdgcm", session);
    d->dir = dir;
    d->gcm = EVP_CIPHER_CTX_new();
    bool ok = d->gcm && EVP_EncryptInit_ex(d->gcm, EVP_aes_256_gcm(), NULL, key, NULL) == 1;
    sodium_memzero(key, sizeof key);
    if (!ok) return kvt__fail(KVT_ESYS, "pd: OpenSSL could not set up AES-256-GCM for a link's tags");
    return KVT_OK;
}

kvt_status pd_mac_new(pd_mac **out, const uint8_t session[PD_SESSION_KEY_LEN], bool server)
{
    *out = NULL;
    if (sodium_init() < 0) return kvt__fail(KVT_ESYS, "pd: libsodium failed to initialise");
    pd_mac *m = calloc(1, sizeof *m);
    if (!m) return kvt__fail(KVT_ENOMEM, "pd: out of memory for a link's keys");
    /* one key per direction: a frame reflected back at its sender fails */
    kvt_status st = dir_init(&m->tx, session, server ? DIR_S2C : DIR_C2S);
    if (!st) st = dir_init(&m->rx, session, server ? DIR_C2S : DIR_S2C);
    if (st) {
        pd_mac_free(m);
        return st;
    }
    *out = m;
    return KVT_OK;
}

void pd_mac_free(pd_mac *m)
{
    if (!m) return;
    EVP_CIPHER_CTX_free(m->tx.gcm); /* wipes the key schedule */
    EVP_CIPHER_CTX_free(m->rx.gcm);
    free(m);
}

/* Starts a GMAC under nonce (direction, part, frame n). */
static void gmac_start(pd_mac_dir *d, uint8_t part, uint64_t n)
{
    uint8_t iv[GCM_IV_LEN] = {d->dir, part};
    kvt__put64(iv + 4, n);
    if (EVP_EncryptInit_ex(d->gcm, NULL, NULL, NULL, iv) != 1) d->broken = true;
}

static void gmac_add(pd_mac_dir *d, const uint8_t *p, size_t n)
{
    while (n) { /* EVP takes an int length */
        int k = n > (size_t)(INT_MAX & ~15) ? (INT_MAX & ~15) : (int)n, out = 0;
        if (EVP_EncryptUpdate(d->gcm, NULL, &out, p, k) != 1) d->broken = true;
        p += k;
        n -= (size_t)k;
    }
}

/* The tag; zeros (refused by every check: broken) when OpenSSL failed. */
static void gmac_end(pd_mac_dir *d, uint8_t tag[PD_TAG_LEN])
{
    uint8_t none[16];
    int out = 0;
    if (EVP_EncryptFinal_ex(d->gcm, none, &out) != 1 ||
        EVP_CIPHER_CTX_ctrl(d->gcm, EVP_CTRL_GCM_GET_TAG, PD_TAG_LEN, tag) != 1)
        d->broken = true;
    if (d->broken) memset(tag, 0, PD_TAG_LEN);
}

void pd_mac_head(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], uint8_t tag[PD_TAG_LEN])
{
    uint64_t n = d->next++;
    gmac_start(d, PART_HEAD, n);
    gmac_add(d, hdr, PD_HDR_LEN);
    gmac_end(d, tag);
    gmac_start(d, PART_BODY, n); /* the body tag covers the header too */
    gmac_add(d, hdr, PD_HDR_LEN);
}

bool pd_mac_head_ok(pd_mac_dir *d, const uint8_t hdr[PD_HDR_LEN], const uint8_t tag[PD_TAG_LEN])
{
    uint8_t want[PD_TAG_LEN];
    pd_mac_head(d, hdr, want);
    return !d->broken && sodium_memcmp(want, tag, PD_TAG_LEN) == 0;
}

void pd_mac_body(pd_mac_dir *d, const void *p, size_t n)
{
    if (n) gmac_add(d, p, n);
}

void pd_mac_end(pd_mac_dir *d, uint8_t tag[PD_TAG_LEN])
{
    gmac_end(d, tag);
}

bool pd_mac_end_ok(pd_mac_dir *d, const uint8_t tag[PD_TAG_LEN])
{
    uint8_t want[PD_TAG_LEN];
    pd_mac_end(d, want);
    return !d->broken && sodium_memcmp(want, tag, PD_TAG_LEN) == 0;
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
    if (m && m->tx.broken)
        return kvt__fail(KVT_ESYS, "pd: OpenSSL failed computing a frame tag; the link stops");
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

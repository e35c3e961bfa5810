/* fuzz_pd_decode.c - the bytes a PD listener decodes from strangers: the
 * frame header, a descriptor (registration / lookup body), and a topology
 * answer; decoded descriptors are also run through the plan (refusal
 * messages included) against a fixed prefill descriptor; and the input as
 * an authenticated frame (pd/mac.h) under a known key: header tag checked,
 * the rest but its last 16 bytes as body, then the body tag. */
#include <stdint.h>
#include <stdlib.h>
#include "pd/desc.h"
#include "pd/mac.h"
#include "pd/wire.h"

static void plan_against_self(const pd_desc *d)
{
    pd_desc s;
    if (pd_desc_copy(&s, d) != KVT_OK) return;
    s.role = PD_ROLE_PREFILL;
    s.dcp_size = 1;
    s.dcp_rank = 0;
    pd_plan p;
    if (d->role == PD_ROLE_DECODE && pd_plan_compute(&p, &s, d) == KVT_OK) pd_plan_free(&p);
    uint32_t n;
    if (d->role == PD_ROLE_DECODE && d->tp_size * d->dcp_size <= 64) (void)pd_topo_expected(&s, d, &n);
    pd_desc_free(&s);
}

static void tagged_frame(const uint8_t *data, size_t size)
{
    static const uint8_t key[PD_SESSION_KEY_LEN] = "fuzz_pd_decode known session key";
    if (size < PD_HDR_LEN + 2 * PD_TAG_LEN) return;
    pd_mac *m = NULL;
    if (pd_mac_new(&m, key, data[0] & 1)) abort();
    bool head = pd_mac_head_ok(&m->rx, data, data + PD_HDR_LEN);
    size_t body = size - PD_HDR_LEN - 2 * PD_TAG_LEN;
    pd_mac_body(&m->rx, data + PD_HDR_LEN + PD_TAG_LEN, body);
    bool whole = pd_mac_end_ok(&m->rx, data + size - PD_TAG_LEN);
    if (head || whole) abort(); /* a made-up tag passed (2^-106 by chance): the check is broken */
    pd_mac_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tagged_frame(data, size);
    if (size >= PD_HDR_LEN) {
        pd_hdr h;
        (void)pd_hdr_decode(&h, data);
    }
    pd_topo_entry *t = NULL; /* the TOPO answer a decode rank reads from the service */
    uint32_t n = 0;
    if (pd_topo_decode(data, (uint32_t)(size > UINT32_MAX ? UINT32_MAX : size), &t, &n) == KVT_OK)
        pd_topo_free(t, n);
    size_t off = 0;
    for (int i = 0; i < 4 && off < size; i++) { /* a topology: several descriptors back to back */
        pd_desc d;
        size_t used = 0;
        if (pd_desc_decode(&d, data + off, size - off, &used) != KVT_OK) break;
        plan_against_self(&d);
        pd_desc_free(&d);
        off += used;
    }
    return 0;
}

/* fuzz_pd_decode.c - the bytes a PD listener decodes from strangers: the
 * frame header, a descriptor (registration / lookup body), and a topology
 * answer; decoded descriptors are also run through the plan (refusal
 * messages included) against a fixed prefill descriptor. */
#include <stdint.h>
#include <stdlib.h>
#include "pd/desc.h"
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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

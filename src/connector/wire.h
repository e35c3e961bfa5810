/* wire.h - the connector's step payloads (inside group STEP frames).
 * UP (member -> leader): what this rank queued since its last step.
 * DOWN (leader -> every member, identical): the decisions and the
 * group-wide results. All little-endian, fixed-size records after a
 * 16-byte head {flags, n1, n2, n3}; decoders check len == exact size. */
#ifndef KVT_CONNECTOR_WIRE_H
#define KVT_CONNECTOR_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

#define KVT_WIRE_HEAD 16
#define KVT_WIRE_RESET 1u /* head flag: a rank asked for (UP) / ordered (DOWN) a reset */

/* UP records */
typedef struct kvt_up_lookup {
    uint64_t rid, digest; /* digest: XXH3 of the request's tokens and namespace */
    uint32_t local_tokens;
    uint32_t flags; /* KVT_UPL_LOAD: pages given; KVT_UPL_LAYERWISE */
} kvt_up_lookup;
#define KVT_UPL_LOAD 1u
#define KVT_UPL_LAYERWISE 2u

typedef struct kvt_up_store {
    uint64_t rid, digest;
    uint32_t num_tokens; /* this rank's plan (informational) */
    uint32_t flags;
} kvt_up_store;

typedef struct kvt_result_rec {
    uint64_t rid;
    uint32_t kind; /* KVT_TASK_LOAD or KVT_TASK_STORE */
    int32_t status;
    uint32_t tokens;
    uint32_t rank; /* DOWN: the first rank that failed */
} kvt_result_rec;

/* DOWN records */
typedef struct kvt_down_load {
    uint64_t rid;
    uint32_t tokens;
    int32_t status;
    uint32_t rank, counter;
    uint64_t generation;
} kvt_down_load;

typedef struct kvt_down_store {
    uint64_t rid;
    int32_t status;
    uint32_t rank;
} kvt_down_store;

#define KVT_UPL_SIZE 24
#define KVT_UPS_SIZE 24
#define KVT_RES_SIZE 24
#define KVT_DNL_SIZE 32
#define KVT_DNS_SIZE 16

typedef struct kvt_up_view {
    uint32_t flags, n_lookups, n_stores, n_results;
    const uint8_t *lookups, *stores, *results;
} kvt_up_view;

typedef struct kvt_down_view {
    uint32_t flags, n_loads, n_stores, n_results;
    const uint8_t *loads, *stores, *results;
} kvt_down_view;

size_t kvt__wire_up_size(uint32_t nl, uint32_t ns, uint32_t nr);
size_t kvt__wire_down_size(uint32_t nl, uint32_t ns, uint32_t nr);
void kvt__wire_head(uint8_t *p, uint32_t flags, uint32_t a, uint32_t b, uint32_t c);

void kvt__wire_put_lookup(uint8_t *p, const kvt_up_lookup *r);
void kvt__wire_put_store(uint8_t *p, const kvt_up_store *r);
void kvt__wire_put_result(uint8_t *p, const kvt_result_rec *r);
void kvt__wire_put_load(uint8_t *p, const kvt_down_load *r);
void kvt__wire_put_sdec(uint8_t *p, const kvt_down_store *r);
kvt_up_lookup kvt__wire_get_lookup(const uint8_t *p);
kvt_up_store kvt__wire_get_store(const uint8_t *p);
kvt_result_rec kvt__wire_get_result(const uint8_t *p);
kvt_down_load kvt__wire_get_load(const uint8_t *p);
kvt_down_store kvt__wire_get_sdec(const uint8_t *p);

/* Parse a payload: KVT_EPROTO (with a message) unless len is exactly the
 * size its counts announce and every kind is known. */
kvt_status kvt__wire_up_parse(const uint8_t *p, size_t len, kvt_up_view *out);
kvt_status kvt__wire_down_parse(const uint8_t *p, size_t len, kvt_down_view *out);

/* Runs every decoder over data (the fuzz target's entry). */
void kvt__wire_fuzz(const uint8_t *data, size_t size);

#endif

/* events_json.h - one KV event batch (vLLM's msgpack EventBatch, as
 * src/events publishes it: docs/events.md) as one JSON line, for a person
 * reading `kvtier events`. The payload comes off the network: anything
 * malformed is an error with a message, never a crash. */
#ifndef KVT_TOOLS_EVENTS_JSON_H
#define KVT_TOOLS_EVENTS_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Writes {"seq":S,"ts":..,"data_parallel_rank":..,"events":[{"type":
 * "BlockStored","block_hashes":["<hex>",..],...},..]} and a newline to out.
 * Returns 0, or -1 with why (a malformed batch) in err and nothing
 * written. */
int kvt_events_batch_json(FILE *out, int64_t seq, const void *payload, size_t len, char *err,
                          size_t err_len);

#endif

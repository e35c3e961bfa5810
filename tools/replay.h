/* replay.h - pieces `kvtier replay` and `kvtier plan` share: the model
 * options (a preset or a custom geometry, so bytes per token are real),
 * capacity parsing and the full-data replay through kvt_cache. */
#ifndef KVT_TOOLS_REPLAY_H
#define KVT_TOOLS_REPLAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"
#include "replay_sim.h"
#include "trace.h"

#define REPLAY_GIB (1024.0 * 1024.0 * 1024.0)

typedef struct model_opts {
    const char *model; /* preset name, or NULL for the custom geometry */
    uint64_t layers, kv_heads, head_dim, elem_size;
    bool mla, custom;
} model_opts;

/* Consumes argv[*i] (and its value) when it is a model option: 1 if taken,
 * 0 if not a model option, -1 after printing an error naming cmd. */
int model_parse_opt(model_opts *m, const char *cmd, int argc, char **argv, int *i);
/* Checks the options together (-1 after printing an error). */
int model_check(model_opts *m, const char *cmd);
/* The geometry, tokens_per_page engine pages. */
kvt_status model_geometry(const model_opts *m, uint32_t tokens_per_page, kvt_geometry **out);
/* Bytes of one 512-token block; 0 (with a message) on failure. */
uint64_t model_block_bytes(const model_opts *m, const char *cmd);
const char *model_name(const model_opts *m);

/* A size in GiB: a finite decimal in [min, max]. -1 after printing. */
int parse_gib(const char *cmd, const char *opt, const char *v, double min, double max, double *out);
/* A count in [min, max]. -1 after printing. */
int parse_count(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t max,
                uint64_t *out);

/* Full-data replay: KV bytes really move through kvt_cache. */
typedef struct data_opts {
    double cpu_gib, ssd_gib; /* ssd_gib 0: no SSD tier */
    const char *ssd_dir;     /* NULL: a temporary directory */
    uint32_t max_requests;   /* the first N requests of the trace */
    uint32_t window;         /* engine window in blocks (stores, verified loads) */
    bool quiet;              /* no progress line */
} data_opts;

typedef struct data_result {
    sim_counts c;            /* the same counters as the index-only replay */
    uint64_t cpu_blocks, ssd_blocks, block_bytes;
    uint64_t stored_bytes, loaded_bytes, ssd_written_blocks, ssd_read_blocks;
    uint64_t verified_bytes, mismatches, failures;
    uint64_t truncated; /* requests larger than the tier: stored in part */
    double load_s, store_s, fill_s, elapsed_s;
} data_result;

/* -1 after printing an error. */
int replay_data(const trace *t, const model_opts *m, const data_opts *o, data_result *out);

#endif

/* trace.h - a Mooncake-format request trace (JSONL) in memory.
 *
 * One JSON object per line: {"timestamp": ms, "input_length": tokens,
 * "output_length": tokens, "hash_ids": [block ids]}. hash_ids name the
 * request's 512-token prefix blocks: equal ids are the same (reusable) block,
 * and an id is a prefix hash, so it always follows the same id (or starts a
 * request). The reader checks that, so a replay through the chained index
 * can never meet one block under two parents.
 *
 * Ids are remapped to dense numbers 0..num_blocks-1 in order of first
 * appearance; the original ids are not kept (nothing needs them). The reader
 * never trusts the input: every malformed line is refused with
 * "line N: <what is wrong>". */
#ifndef KVT_TOOLS_TRACE_H
#define KVT_TOOLS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_BLOCK_TOKENS 512u
/* Bounds that keep every product below 2^63 and every count in 32 bits. */
#define TRACE_MAX_INPUT (1u << 30)       /* tokens of one request */
#define TRACE_MAX_REQUESTS (1u << 26)
#define TRACE_MAX_TOTAL_BLOCKS (1u << 30) /* hash ids over the whole trace */

typedef struct trace_req {
    uint64_t timestamp;
    uint32_t input_length, output_length;
    uint64_t first;      /* its block ids are trace.blocks[first .. first + num_blocks) */
    uint32_t num_blocks; /* <= ceil(input_length / 512) */
} trace_req;

typedef struct trace {
    trace_req *reqs;
    uint32_t num_reqs;
    uint32_t *blocks;     /* dense block ids, all requests back to back */
    uint64_t total_blocks;
    uint32_t num_unique;  /* distinct block ids */
    uint32_t max_blocks;  /* longest request, in blocks */
    uint64_t total_input; /* sum of input_length */
} trace;

/* Parses len bytes of JSONL. Blank lines are skipped. On failure returns -1
 * with "line N: ..." in err (and *out untouched); 0 on success. */
int trace_parse(const char *buf, size_t len, trace *out, char *err, size_t err_len);
/* Reads and parses a file; errors name the file ("F: line 17: ..."). */
int trace_load(const char *path, trace *out, char *err, size_t err_len);
void trace_free(trace *t);

static inline const uint32_t *trace_ids(const trace *t, const trace_req *r)
{
    return t->blocks + r->first;
}

#endif

/* fuzz_trace.c - the Mooncake trace reader (tools/trace.c) on arbitrary
 * bytes: a trace file is untrusted input. Beyond "no crash, leak or UB" it
 * checks the contract: a failure has a "line N: ..." style message; a
 * success holds consistent counts and in-range dense ids. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    trace t;
    char err[512];
    if (trace_parse((const char *)data, size, &t, err, sizeof err) != 0) {
        if (err[0] == '\0') abort();
        return 0;
    }
    uint64_t blocks = 0;
    for (uint32_t i = 0; i < t.num_reqs; i++) {
        const trace_req *r = &t.reqs[i];
        if (r->first != blocks || r->num_blocks > t.max_blocks || r->input_length == 0) abort();
        if ((uint64_t)r->num_blocks * TRACE_BLOCK_TOKENS >= (uint64_t)r->input_length + TRACE_BLOCK_TOKENS)
            abort();
        blocks += r->num_blocks;
    }
    if (blocks != t.total_blocks) abort();
    for (uint64_t i = 0; i < t.total_blocks; i++)
        if (t.blocks[i] >= t.num_unique) abort();
    trace_free(&t);
    return 0;
}

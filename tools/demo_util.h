/* demo_util.h - the demo's report, as text or one JSON object. */
#ifndef KVT_TOOLS_DEMO_UTIL_H
#define KVT_TOOLS_DEMO_UTIL_H

#include "cli_util.h"

typedef struct demo_report {
    uint32_t requests;
    double hit_rate;
    uint64_t hit_tokens, lookup_tokens;
    uint64_t stored_bytes, loaded_bytes;
    double load_gbps;
    double lookup_p50_us, lookup_p99_us, load_p50_ms, load_p99_ms;
    uint64_t evicted_blocks, verified_bytes, mismatches;
    uint32_t failures;
    double elapsed_s;
    uint64_t cpu_capacity, block_bytes, cpu_blocks;
    uint64_t ssd_hit_tokens, ssd_capacity, ssd_written_blocks, recovered_blocks;
    uint64_t corrupt_blocks, cpu_dropped_blocks;
    const char *ssd_dir; /* NULL without an SSD tier */
} demo_report;

void demo_report_text(const demo_report *r);
void demo_report_json(const demo_report *r);

#endif

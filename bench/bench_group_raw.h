/* bench_group_raw.h - the machine's floor for a star exchange (see .c). */
#ifndef KVT_BENCH_GROUP_RAW_H
#define KVT_BENCH_GROUP_RAW_H

#include <stdint.h>

/* ranks threads (2..16) exchanging over loopback TCP; 0 on success. */
int kvt_bench_raw_star(uint32_t ranks, uint32_t steps, double *p50_us, double *p99_us);

#endif

/* bench_util.h - what every `kvtier bench` reports besides its own
 * figures: min/median/max over its rounds (the bar reads the median: the
 * best round favours whichever side got lucky once on a shared machine),
 * and the host facts that explain a number measured on another machine. */
#ifndef KVT_BENCH_UTIL_H
#define KVT_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct stat3 {
    double min, med, max;
} stat3;

/* Over v[0..n), skipping negative values (a round that did not measure
 * this figure); v is not changed. All -1 when none is left. */
stat3 stat3_of(const double *v, uint32_t n);
/* "key": {"min": .., "median": .., "max": ..}, then ", " when comma. */
void stat3_json(const char *key, stat3 s, bool comma);

/* "host": {cpus, cpu_model, cpu_flags (the features kvtier's copies,
 * hashes and MACs use, as the CPU reports them), page_size, thp,
 * shmem_thp, hugepages_total, mem_total_bytes, kernel, loadavg_1m (at
 * the report: a loaded host explains low figures)}, then ", " when comma. */
void bench_host_json(bool comma);
/* The same facts on one line of text to f. */
void bench_host_text(FILE *f);

#endif

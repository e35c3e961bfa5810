/* replay_plan.h - `kvtier plan` results and their CSV and SVG output. */
#ifndef KVT_TOOLS_REPLAY_PLAN_H
#define KVT_TOOLS_REPLAY_PLAN_H

#include <stdint.h>

#include "replay_sim.h"

typedef struct plan_point {
    uint32_t series;     /* 0: CPU only; s >= 1: CPU + the s-th SSD size */
    uint64_t cpu_blocks, ssd_blocks;
    sim_counts c;
} plan_point;

typedef struct plan_chart {
    const plan_point *points; /* CPU-only points first, then each SSD series */
    uint32_t num_points;
    sim_counts max;           /* unbounded */
    uint64_t block_bytes;
    const char *model, *trace;
    uint32_t requests;
} plan_chart;

/* 0, or -1 after printing an error naming the file. */
int plan_write_csv(const char *path, const plan_chart *ch);
int plan_write_svg(const char *path, const plan_chart *ch);

#endif

/* pull_cost.c - fixed + per-byte pull cost (pull_cost.h). */
#include "cluster/pull_cost.h"

#define DECAY 0.75

void kvt__pull_cost_add(kvt_pull_cost *c, uint64_t bytes, uint64_t ns)
{
    double b = (double)bytes, t = (double)ns;
    c->w = c->w * DECAY + 1;
    c->b = c->b * DECAY + b;
    c->t = c->t * DECAY + t;
    c->bb = c->bb * DECAY + b * b;
    c->bt = c->bt * DECAY + b * t;
}

/* Per-byte ns and fixed ns of the fit; false when the pulls' sizes are too
 * alike (spread under 10% of their mean) or the fit has a negative part. */
static int fit(const kvt_pull_cost *c, double *slope, double *fixed)
{
    double mb = c->b / c->w, mt = c->t / c->w;
    double var = c->bb / c->w - mb * mb, cov = c->bt / c->w - mb * mt;
    if (var <= 0.01 * mb * mb || cov <= 0) return 0;
    *slope = cov / var;
    *fixed = mt - *slope * mb;
    /* a per-byte cost under a tenth of the mean time per byte is noise
     * fitted as a link faster than the pulls ever ran: not used */
    return *fixed >= 0 && *slope >= 0.1 * mt / mb;
}

uint64_t kvt__pull_cost_ns(const kvt_pull_cost *c, uint64_t bytes)
{
    if (c->w <= 0 || c->b <= 0) return 0;
    double slope, fixed;
    if (!fit(c, &slope, &fixed)) {
        slope = c->t / c->b; /* one bandwidth for everything */
        fixed = 0;
    }
    double ns = fixed + slope * (double)bytes;
    return ns < 1 ? 1 : (uint64_t)ns;
}

uint64_t kvt__pull_cost_bps(const kvt_pull_cost *c)
{
    if (c->w <= 0 || c->b <= 0 || c->t <= 0) return 0;
    double slope, fixed;
    if (!fit(c, &slope, &fixed)) slope = c->t / c->b;
    double bps = 1e9 / slope;
    return bps >= 1.8e19 ? UINT64_MAX : (uint64_t)bps; /* a cast past 2^64 is undefined */
}

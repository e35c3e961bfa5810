/* replay_svg.c - `kvtier plan` output: a CSV of every point and a
 * hand-written SVG line chart (log x: CPU GiB; y: token hit rate), one line
 * per series, the unbounded maximum dashed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "replay.h"
#include "replay_plan.h"

#define W 860.0
#define H 520.0
#define ML 80.0  /* margins: room for tick labels, title, legend */
#define MR 230.0
#define MT 56.0
#define MB 64.0

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                     "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"};

static double gib(uint64_t blocks, uint64_t bb) { return (double)blocks * (double)bb / REPLAY_GIB; }

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "kvtier plan: %s: cannot write: %s\n", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path)
{
    bool bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "kvtier plan: %s: write failed\n", path);
        return -1;
    }
    return 0;
}

int plan_write_csv(const char *path, const plan_chart *ch)
{
    FILE *f = open_out(path);
    if (!f) return -1;
    fprintf(f, "series,cpu_gib,ssd_gib,cpu_blocks,ssd_blocks,requests,block_hit_rate,"
               "token_hit_rate,cpu_token_hit_rate,ssd_token_hit_rate,evicted_blocks\n");
    for (uint32_t i = 0; i < ch->num_points; i++) {
        const plan_point *p = &ch->points[i];
        const sim_counts *c = &p->c;
        fprintf(f, "%s,%.3f,%.3f,%llu,%llu,%llu,%.6f,%.6f,%.6f,%.6f,%llu\n",
                p->series ? "cpu+ssd" : "cpu", gib(p->cpu_blocks, ch->block_bytes),
                gib(p->ssd_blocks, ch->block_bytes), (unsigned long long)p->cpu_blocks,
                (unsigned long long)p->ssd_blocks, (unsigned long long)c->requests,
                sim_rate(c->hit_blocks, c->blocks), sim_rate(c->hit_tokens, c->input_tokens),
                sim_rate(c->cpu_hit_tokens, c->input_tokens),
                sim_rate(c->ssd_hit_tokens, c->input_tokens), (unsigned long long)c->evicted_blocks);
    }
    const sim_counts *m = &ch->max;
    fprintf(f, "max,,,,,%llu,%.6f,%.6f,,,0\n", (unsigned long long)m->requests,
            sim_rate(m->hit_blocks, m->blocks), sim_rate(m->hit_tokens, m->input_tokens));
    return close_out(f, path);
}

typedef struct axes {
    double lx0, lx1; /* log10 GiB range */
} axes;

static double px(const axes *a, double g)
{
    return ML + (log10(g) - a->lx0) / (a->lx1 - a->lx0) * (W - ML - MR);
}

static double py(double rate) { return H - MB - rate * (H - MT - MB); }

static void size_label(double g, char *buf, size_t n)
{
    if (g >= 1024) snprintf(buf, n, "%.3g TiB", g / 1024);
    else if (g >= 1) snprintf(buf, n, "%.4g GiB", g);
    else snprintf(buf, n, "%.3g MiB", g * 1024);
}

static void draw_axes(FILE *f, const axes *a)
{
    fprintf(f, "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' stroke='#333'/>\n",
            ML, MT, W - ML - MR, H - MT - MB);
    for (int pct = 0; pct <= 100; pct += 20) {
        double y = py(pct / 100.0);
        fprintf(f, "<line x1='%.0f' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#ddd'/>\n", ML, W - MR, y, y);
        fprintf(f, "<text x='%.0f' y='%.1f' text-anchor='end' font-size='12'>%d%%</text>\n",
                ML - 8, y + 4, pct);
    }
    for (int e = (int)floor(a->lx0); e <= (int)ceil(a->lx1); e++) {
        for (int m = 1; m < 10; m++) {
            double lg = e + log10(m);
            if (lg < a->lx0 - 1e-9 || lg > a->lx1 + 1e-9) continue;
            double x = px(a, pow(10, lg));
            fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.0f' y2='%.0f' stroke='%s'/>\n", x, x, MT,
                    H - MB, m == 1 ? "#ccc" : "#f0f0f0");
            if (m != 1) continue;
            char lab[32];
            size_label(pow(10, e), lab, sizeof lab);
            fprintf(f, "<text x='%.1f' y='%.0f' text-anchor='middle' font-size='12'>%s</text>\n",
                    x, H - MB + 18, lab);
        }
    }
    fprintf(f, "<text x='%.0f' y='%.0f' text-anchor='middle' font-size='13'>CPU tier capacity "
               "(log scale)</text>\n", ML + (W - ML - MR) / 2, H - 18);
    fprintf(f, "<text transform='translate(20 %.0f) rotate(-90)' text-anchor='middle' "
               "font-size='13'>token hit rate</text>\n", MT + (H - MT - MB) / 2);
}

static void draw_series(FILE *f, const plan_chart *ch, const axes *a, uint32_t s, int row)
{
    const char *color = COLORS[s % (sizeof COLORS / sizeof COLORS[0])];
    fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
    uint64_t ssd = 0;
    for (uint32_t i = 0; i < ch->num_points; i++) {
        const plan_point *p = &ch->points[i];
        if (p->series != s) continue;
        ssd = p->ssd_blocks;
        fprintf(f, "%.1f,%.1f ", px(a, gib(p->cpu_blocks, ch->block_bytes)),
                py(sim_rate(p->c.hit_tokens, p->c.input_tokens)));
    }
    fprintf(f, "'/>\n");
    for (uint32_t i = 0; i < ch->num_points; i++) {
        const plan_point *p = &ch->points[i];
        if (p->series != s) continue;
        fprintf(f, "<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>\n",
                px(a, gib(p->cpu_blocks, ch->block_bytes)),
                py(sim_rate(p->c.hit_tokens, p->c.input_tokens)), color);
    }
    char lab[64] = "CPU only";
    if (s) {
        char sz[32];
        size_label(gib(ssd, ch->block_bytes), sz, sizeof sz);
        snprintf(lab, sizeof lab, "CPU + %s SSD", sz);
    }
    double ly = MT + 14 + row * 22;
    fprintf(f, "<line x1='%.0f' x2='%.0f' y1='%.0f' y2='%.0f' stroke='%s' stroke-width='2'/>\n",
            W - MR + 16, W - MR + 44, ly, ly, color);
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='12'>%s</text>\n", W - MR + 50, ly + 4, lab);
}

static void draw_max(FILE *f, const plan_chart *ch, int row)
{
    double rate = sim_rate(ch->max.hit_tokens, ch->max.input_tokens), y = py(rate);
    fprintf(f, "<line x1='%.0f' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#000' stroke-width='1.5' "
               "stroke-dasharray='6 4'/>\n", ML, W - MR, y, y);
    double ly = MT + 14 + row * 22;
    fprintf(f, "<line x1='%.0f' x2='%.0f' y1='%.0f' y2='%.0f' stroke='#000' stroke-width='1.5' "
               "stroke-dasharray='6 4'/>\n", W - MR + 16, W - MR + 44, ly, ly);
    fprintf(f, "<text x='%.0f' y='%.0f' font-size='12'>max (unbounded) %.1f%%</text>\n",
            W - MR + 50, ly + 4, 100 * rate);
}

static void escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '\'') fputs("&apos;", f);
        else if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
}

int plan_write_svg(const char *path, const plan_chart *ch)
{
    axes a = {INFINITY, -INFINITY};
    uint32_t nseries = 0;
    for (uint32_t i = 0; i < ch->num_points; i++) {
        double lg = log10(gib(ch->points[i].cpu_blocks, ch->block_bytes));
        a.lx0 = lg < a.lx0 ? lg : a.lx0;
        a.lx1 = lg > a.lx1 ? lg : a.lx1;
        if (ch->points[i].series + 1 > nseries) nseries = ch->points[i].series + 1;
    }
    if (!ch->num_points || !(a.lx1 > a.lx0)) a.lx1 = a.lx0 + 1; /* one point: any width */
    FILE *f = open_out(path);
    if (!f) return -1;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
               "viewBox='0 0 %.0f %.0f' font-family='sans-serif'>\n<rect width='100%%' "
               "height='100%%' fill='white'/>\n", W, H, W, H);
    fprintf(f, "<text x='%.0f' y='24' font-size='15' font-weight='bold'>Prefix-cache hit rate vs "
               "capacity: ", ML);
    const char *base = strrchr(ch->trace, '/');
    escape(f, base ? base + 1 : ch->trace);
    fprintf(f, "</text>\n<text x='%.0f' y='42' font-size='12'>%u requests, %s KV (%.0f MiB per "
               "512-token block), LRU leaf eviction, inclusive CPU + SSD tiers</text>\n",
            ML, ch->requests, ch->model, (double)ch->block_bytes / (1 << 20));
    draw_axes(f, &a);
    for (uint32_t s = 0; s < nseries; s++) draw_series(f, ch, &a, s, (int)s);
    draw_max(f, ch, (int)nseries);
    fprintf(f, "</svg>\n");
    return close_out(f, path);
}

#include "cli_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/parse.h"
#include "util/vec.h"

bool demo_parse_u64(const char *s, uint64_t *out) { return kvt__parse_u64(s, out); }

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

volatile sig_atomic_t cli_stop;

static void on_stop_signal(int sig)
{
    (void)sig;
    cli_stop = 1;
}

void cli_stop_on_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void remove_tree(const char *path)
{
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int cli_bad_arg(const char *cmd, const char *arg, bool lacks_value)
{
    if (lacks_value)
        fprintf(stderr, "kvtier %s: %s needs a value (kvtier %s --help)\n", cmd, arg, cmd);
    else if (arg[0] == '-')
        fprintf(stderr, "kvtier %s: unknown option %s (kvtier %s --help)\n", cmd, arg, cmd);
    else
        fprintf(stderr, "kvtier %s: unexpected argument \"%s\" (kvtier %s --help)\n", cmd, arg, cmd);
    return 2;
}

int cli_bad_value(const char *cmd, const char *opt, const char *value)
{
    fprintf(stderr, "kvtier %s: %s: bad value \"%s\" (kvtier %s --help)\n", cmd, opt, value, cmd);
    return 2;
}

bool cli_arg_in(const char *arg, const char *const *names)
{
    for (; *names; names++)
        if (!strcmp(arg, *names)) return true;
    return false;
}

int demo_error(const char *what, kvt_status st)
{
    fprintf(stderr, "kvtier: %s: %s: %s\n", what, kvt_strerror(st), kvt_last_error());
    return 1;
}

void samples_add(sample_set *s, double x)
{
    void *v = s->v;
    kvt_status st = kvt__grow32(&v, &s->cap, s->n + 1, sizeof *s->v, "samples");
    s->v = v;
    if (st) return; /* a lost sample only blurs a percentile */
    s->v[s->n++] = x;
    s->sorted = false;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double samples_pct(sample_set *s, double pct)
{
    if (s->n == 0) return 0;
    if (!s->sorted) qsort(s->v, s->n, sizeof *s->v, cmp_double);
    s->sorted = true;
    uint32_t i = (uint32_t)((pct / 100.0) * (s->n - 1) + 0.5);
    return s->v[i < s->n ? i : s->n - 1];
}

double median_of_values(double *v, uint32_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return v[n / 2];
}

void samples_fini(sample_set *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

void progress_init(progress *p, const char *what, uint64_t total)
{
    p->what = what;
    p->total = total ? total : 1;
    p->last_ns = 0;
    p->last_quarter = 0;
    p->tty = isatty(2);
}

void progress_update(progress *p, uint64_t done, double hit_rate)
{
    if (p->tty) {
        uint64_t now = kvt__now_ns();
        if (now - p->last_ns < 100000000ull && done < p->total) return; /* 10 per second */
        p->last_ns = now;
        fprintf(stderr, "\r[%s] %llu/%llu requests (%3.0f%%)  token hit rate %5.1f%%  ", p->what,
                (unsigned long long)done, (unsigned long long)p->total,
                100.0 * (double)done / (double)p->total, 100.0 * hit_rate);
        return;
    }
    int quarter = (int)(4 * done / p->total);
    if (quarter <= p->last_quarter) return;
    p->last_quarter = quarter;
    fprintf(stderr, "[%s] %llu/%llu requests, token hit rate %.1f%%\n", p->what,
            (unsigned long long)done, (unsigned long long)p->total, 100.0 * hit_rate);
}

void progress_done(progress *p)
{
    if (p->tty) fputc('\n', stderr);
}

bool page_alloc_init(page_alloc *a, uint32_t total)
{
    a->free = malloc((size_t)total * sizeof *a->free);
    if (!a->free) return false;
    for (uint32_t i = 0; i < total; i++) a->free[i] = total - 1 - i;
    a->num_free = a->total = total;
    return true;
}

void page_alloc_fini(page_alloc *a)
{
    free(a->free);
    memset(a, 0, sizeof *a);
}

uint32_t page_free_count(const page_alloc *a) { return a->num_free; }

uint32_t *page_alloc_list(page_alloc *a, uint32_t n)
{
    if (n > a->num_free) return NULL;
    uint32_t *list = malloc((size_t)(n ? n : 1) * sizeof *list);
    if (!list) return NULL;
    for (uint32_t i = 0; i < n; i++) list[i] = a->free[--a->num_free];
    return list;
}

void page_free_list(page_alloc *a, const uint32_t *pages, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) a->free[a->num_free++] = pages[i];
}

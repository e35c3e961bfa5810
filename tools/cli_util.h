/* cli_util.h - small pieces the CLI commands share: strict number parsing,
 * latency samples with percentiles, a progress line, an engine page
 * allocator for emulated engines. */
#ifndef KVT_TOOLS_CLI_UTIL_H
#define KVT_TOOLS_CLI_UTIL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"

bool demo_parse_u64(const char *s, uint64_t *out);

/* Set by SIGINT or SIGTERM once cli_stop_on_signals() ran: a command that
 * runs until stopped (stats --watch, events) checks it between waits. */
extern volatile sig_atomic_t cli_stop;
void cli_stop_on_signals(void);

/* rm -rf path (a directory this program created). */
void remove_tree(const char *path);

/* An argument command cmd (e.g. "bench ssd") does not take: names it on
 * stderr ("unknown option X", "unexpected argument X" for a word, or "X
 * needs a value" when lacks_value) with where the usage is; returns 2, the
 * usage exit status. */
int cli_bad_arg(const char *cmd, const char *arg, bool lacks_value);
/* A value option opt of command cmd cannot take: "kvtier CMD: OPT: bad
 * value "V"" on stderr with where the usage is; returns 2. */
int cli_bad_value(const char *cmd, const char *opt, const char *value);
/* Whether arg is one of names (a NULL-ended list): the options of a
 * command that take a value, so one that does not is named as unknown. */
bool cli_arg_in(const char *arg, const char *const *names);

/* Prints "kvtier: WHAT: <status text>: <last error>" on stderr; returns 1. */
int demo_error(const char *what, kvt_status st);

typedef struct sample_set {
    double *v;
    uint32_t n, cap;
    bool sorted;
} sample_set;
void samples_add(sample_set *s, double x);
double samples_pct(sample_set *s, double pct); /* 0 when empty */
void samples_fini(sample_set *s);
/* The median of v[0..n) (n >= 1; the upper middle when n is even); sorts v.
 * The benches report it: the best of n favours whichever side got lucky
 * once on a shared machine. */
double median_of_values(double *v, uint32_t n);

/* A progress line on stderr: rewritten in place on a terminal, a line per
 * quarter otherwise (logs stay readable). */
typedef struct progress {
    const char *what;
    uint64_t total, last_ns;
    int last_quarter;
    bool tty;
} progress;
void progress_init(progress *p, const char *what, uint64_t total);
void progress_update(progress *p, uint64_t done, double hit_rate);
void progress_done(progress *p);

/* Engine pages handed out to requests (a stack of free page numbers). */
typedef struct page_alloc {
    uint32_t *free;
    uint32_t num_free, total;
} page_alloc;
bool page_alloc_init(page_alloc *a, uint32_t total);
void page_alloc_fini(page_alloc *a);
uint32_t page_free_count(const page_alloc *a);
/* A malloc'd list of n pages (NULL if fewer are free); page_free_list
 * returns them (the list itself stays the caller's to free). */
uint32_t *page_alloc_list(page_alloc *a, uint32_t n);
void page_free_list(page_alloc *a, const uint32_t *pages, uint32_t n);

#endif

/* test_group_util.h - helpers of the net, group and connector tests: ranks
 * as threads, TCP ranks as forked processes, bounded waits. */
#ifndef KVT_TEST_GROUP_UTIL_H
#define KVT_TEST_GROUP_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "support.h"
#include "util/clock.h"

#define TG_MAX_RANKS 16

typedef void (*tg_rank_fn)(uint32_t rank, void *arg);

typedef struct tg_thread {
    pthread_t th;
    uint32_t rank;
    tg_rank_fn fn;
    void *arg;
} tg_thread;

static void *tg_main(void *p)
{
    tg_thread *t = p;
    t->fn(t->rank, t->arg);
    return NULL;
}

/* Runs fn(rank, arg) for every rank in its own thread and joins them all.
 * The functions themselves are bounded (every kvtier wait has a deadline). */
static inline void tg_run_ranks(uint32_t n, tg_rank_fn fn, void *arg)
{
    tg_thread t[TG_MAX_RANKS];
    for (uint32_t r = 0; r < n; r++) {
        t[r] = (tg_thread){0, r, fn, arg};
        assert_int_equal(pthread_create(&t[r].th, NULL, tg_main, &t[r]), 0);
    }
    for (uint32_t r = 0; r < n; r++) pthread_join(t[r].th, NULL);
}

/* Waits for child pid up to ms; kills it on timeout. Returns its exit code,
 * or 128 + signal, or -1 on timeout. */
static inline int tg_wait_child(pid_t pid, int64_t ms)
{
    uint64_t dl = kvt__deadline_ns(ms);
    for (;;) {
        int wst = 0;
        pid_t r = waitpid(pid, &wst, WNOHANG);
        if (r == pid) return WIFEXITED(wst) ? WEXITSTATUS(wst) : 128 + WTERMSIG(wst);
        if (kvt__now_ns() >= dl) {
            kill(pid, SIGKILL);
            waitpid(pid, &wst, 0);
            return -1;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static inline void tg_sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif

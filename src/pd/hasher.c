/* hasher.c - a link's checksum thread (hasher.h). */
#include "pd/hasher.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/config.h"
#include "util/err.h"
#include "util/sync.h"

#define RING 256            /* chunks queued: a batch's window is far shorter */
/* Polls (a few microseconds) before an idle hasher sleeps: chunks come
 * every ~50 us on a busy link, and a link's hasher that spun longer kept a
 * core from the link threads (many links on few cores starved theirs past
 * peer_timeout under TSan). Waking a sleeper costs its link one futex call
 * per chunk, ~1 MiB. */
#define IDLE_SPINS 256u
/* A sleeper re-checks this often anyway. The wake-up cannot be lost (see
 * nap), so this is only a backstop; it is long because every idle hasher
 * of every link pays it (hundreds of links: thousands of wake-ups a
 * second at 10 ms, which starved links past peer_timeout under TSan). */
#define SLEEP_NS 200000000ull
#define STOP_DRAIN_NS 2000000000ull /* stop: bound on finishing the queued chunks */

struct pd_hasher {
    pd_hashes *hs;
    pthread_t th;
    _Atomic uint32_t head; /* the next chunk to hash: written by the hasher */
    _Atomic uint32_t tail; /* the next free slot: written by the link */
    atomic_bool sleeping, stop;
    pthread_mutex_t mu; /* only to sleep and to wake a sleeper */
    pthread_cond_t cv;
    char name[48];
    pd_hash_chunk ring[RING];
};

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Sleeps until woken or SLEEP_NS pass, unless a chunk came meanwhile.
 * sleeping and tail are both seq_cst, as in submit: either the link sees
 * sleeping and signals, or this sees the new tail and does not wait. */
static void nap(pd_hasher *h, uint32_t head)
{
    pthread_mutex_lock(&h->mu);
    atomic_store(&h->sleeping, true);
    if (atomic_load(&h->tail) == head && !atomic_load(&h->stop))
        (void)kvt__cond_wait_until(&h->cv, &h->mu, kvt__now_ns() + SLEEP_NS);
    atomic_store(&h->sleeping, false);
    pthread_mutex_unlock(&h->mu);
}

static void *hasher_main(void *arg)
{
    pd_hasher *h = arg;
    for (unsigned idle = 0;;) {
        uint32_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
        if (head != atomic_load_explicit(&h->tail, memory_order_acquire)) {
            const pd_hash_chunk *c = &h->ring[head % RING];
            if (c->fn) pd_xfer_walk_entry(&c->x, c->e, c->ja, c->jb, c->fn, c->arg);
            else pd_xfer_hash_entry(&c->x, c->e, c->ja, c->jb, c->base, h->hs);
            /* release: the states written above are the link's once it sees head */
            atomic_store_explicit(&h->head, head + 1, memory_order_release);
            idle = 0;
        } else if (atomic_load_explicit(&h->stop, memory_order_acquire)) {
            return NULL;
        } else if (++idle < IDLE_SPINS) {
            relax();
        } else {
            idle = 0;
            nap(h, head);
        }
    }
}

kvt_status pd_hasher_start(pd_hasher **out, pd_hashes *hs, const char *name)
{
    pd_hasher *h = calloc(1, sizeof *h);
    if (!h) return kvt__fail(KVT_ENOMEM, "%s: out of memory for a checksum thread", name);
    h->hs = hs;
    snprintf(h->name, sizeof h->name, "%s", name);
    int rc = pthread_mutex_init(&h->mu, NULL);
    if (!rc) rc = kvt__cond_init(&h->cv);
    if (!rc) rc = pthread_create(&h->th, NULL, hasher_main, h);
    if (rc) {
        free(h);
        return kvt__fail(KVT_ESYS, "%s: cannot start a checksum thread (error %d)", name, rc);
    }
    *out = h;
    return KVT_OK;
}

static void wake(pd_hasher *h)
{
    if (!atomic_load(&h->sleeping)) return;
    pthread_mutex_lock(&h->mu);
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Polls, then yields the core in short sleeps (the hasher may need it). */
static void backoff(unsigned *n)
{
    if (++*n < 1000) {
        relax();
        return;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

kvt_status pd_hasher_submit(pd_hasher *h, const pd_hash_chunk *c, uint64_t deadline_ns)
{
    uint32_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    for (unsigned n = 0; tail - atomic_load_explicit(&h->head, memory_order_acquire) == RING;) {
        if (kvt__now_ns() >= deadline_ns)
            return kvt__fail(KVT_ETIMEDOUT, "%s: the checksum thread fell %u chunks behind until "
                             "the deadline", h->name, RING);
        backoff(&n);
    }
    h->ring[tail % RING] = *c;
    atomic_store(&h->tail, tail + 1); /* seq_cst: see nap */
    wake(h);
    return KVT_OK;
}

kvt_status pd_hasher_drain(pd_hasher *h, uint64_t deadline_ns)
{
    uint32_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    for (unsigned n = 0; atomic_load_explicit(&h->head, memory_order_acquire) != tail;) {
        if (kvt__now_ns() >= deadline_ns)
            return kvt__fail(KVT_ETIMEDOUT, "%s: the checksum thread did not finish a batch by the "
                             "deadline", h->name);
        backoff(&n);
    }
    return KVT_OK;
}

void pd_hasher_stop(pd_hasher *h)
{
    if (!h) return;
    (void)pd_hasher_drain(h, kvt__now_ns() + STOP_DRAIN_NS);
    atomic_store(&h->stop, true);
    pthread_mutex_lock(&h->mu);
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->th, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

bool pd_hash_thread_auto(void)
{
    /* an operator's (or a test run's) override of the CPU count rule */
    const char *env = kvt__config_env("KVTIER_PD_CHECKSUM_THREADS");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return env[0] == '1';
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= PD_HASH_AUTO_CPUS;
}

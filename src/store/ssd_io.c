/* ssd_io.c - the SSD store's data path: write/read submission, completion,
 * group commit, sync and fault injection (see ssd.h, ssd_internal.h).
 *
 * A write: the caller's thread checksums the block, records it in the slot
 * table and submits one O_DIRECT write of the whole slot. Its completion
 * (backend thread) queues it for the commit thread, which takes every
 * queued write at once, fdatasyncs each touched data file, appends their
 * PUT records (after the pending DELs, so a freed-and-reused slot ends with
 * its newest record) and fdatasyncs each journal, and only then calls the
 * done callbacks: one fdatasync pair per directory covers a whole batch.
 * A read: one O_DIRECT read of the slot; its completion verifies the key
 * captured at submit and the checksum, then calls done.
 *
 * Per block the path takes no lock of its own beyond the backend's queue
 * and the commit queue (one lock per harvested batch with io_uring):
 * requests come from a preallocated, lock-free stack. */
#include "store/ssd_internal.h"

#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/clock.h"
#include "util/config.h"
#include "util/err.h"
#include "util/log.h"
#include "util/sync.h"

#define COMMIT_IDLE_NS 100000000ull /* the commit thread re-checks stop this often */
#define WAIT_SLICE_NS 10000000ull   /* sync/close re-check counters this often */
#define NONE_IDX UINT32_MAX

/* ---- the request stack ---------------------------------------------- */

static ssd_req *req_get(kvt_ssd *s)
{
    uint64_t old = atomic_load(&s->free_top);
    for (;;) {
        uint32_t idx = (uint32_t)old;
        if (idx == NONE_IDX) return NULL;
        uint32_t next = atomic_load_explicit(&s->reqs[idx].next_free, memory_order_relaxed);
        uint64_t neu = (((old >> 32) + 1) << 32) | next;
        if (atomic_compare_exchange_weak(&s->free_top, &old, neu)) return &s->reqs[idx];
    }
}

static void req_put(kvt_ssd *s, ssd_req *r)
{
    uint32_t idx = (uint32_t)(r - s->reqs);
    uint64_t old = atomic_load(&s->free_top);
    for (;;) {
        atomic_store_explicit(&r->next_free, (uint32_t)old, memory_order_relaxed);
        uint64_t neu = (((old >> 32) + 1) << 32) | idx;
        if (atomic_compare_exchange_weak(&s->free_top, &old, neu)) return;
    }
}

/* ---- fault injection ---------------------------------------------- */

void kvt__ssd_inject(kvt_ssd *s, kvt_ssd_fault kind, bool on_write, uint32_t nth)
{
    if (!s) return;
    atomic_store(&s->inject_count[on_write], (int64_t)nth);
    atomic_store(&s->inject_kind[on_write], (int)kind);
}

void kvt__ssd_hold_reads(kvt_ssd *s, bool hold)
{
    if (s) atomic_store(&s->hold_reads, hold);
}

uint32_t kvt__ssd_reads_held(kvt_ssd *s)
{
    return s ? atomic_load(&s->reads_held) : 0;
}

/* A read's completion waits here while reads are held: 1 ms naps, for at
 * most HOLD_MAX_MS, so a test that forgets to release hangs nothing. */
#define HOLD_MAX_MS 10000
static void hold_read(kvt_ssd *s)
{
    if (!atomic_load_explicit(&s->hold_reads, memory_order_relaxed)) return;
    atomic_fetch_add(&s->reads_held, 1);
    for (int i = 0; i < HOLD_MAX_MS && atomic_load(&s->hold_reads); i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_sub(&s->reads_held, 1);
}

void kvt__ssd_hold_writes(kvt_ssd *s, bool hold)
{
    if (s) atomic_store(&s->hold_writes, hold);
}

/* A write's completion waits here while writes are held (same bound). */
static void hold_write(kvt_ssd *s)
{
    for (int i = 0; i < HOLD_MAX_MS && atomic_load_explicit(&s->hold_writes, memory_order_relaxed); i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
}

void kvt__ssd_inject_journal(kvt_ssd *s, int err, uint32_t nth, uint32_t count)
{
    if (!s) return;
    atomic_store(&s->jinject_skip, (int64_t)nth);
    atomic_store(&s->jinject_left, (int64_t)count);
    atomic_store(&s->jinject_err, count ? err : 0);
}

kvt_status kvt__ssd_note_failure(kvt_ssd *s, int err, const char *dir, const char *name,
                                 const char *what)
{
    kvt_status st = err == ENOSPC || err == EDQUOT || err == EFBIG ? KVT_ENOSPC : KVT_EIO;
    int none = 0;
    if (atomic_compare_exchange_strong(&s->fail_state, &none, 1)) {
        s->fail_status = st;
        snprintf(s->fail_why, sizeof s->fail_why, "%s/%s: %s: %s", dir, name, what,
                 err ? strerror(err) : "short transfer");
        atomic_store_explicit(&s->fail_state, 2, memory_order_release);
    }
    return st;
}

kvt_status kvt__ssd_first_failure(const kvt_ssd *s, char *why, size_t why_len)
{
    kvt_ssd *m = (kvt_ssd *)s; /* atomics: loads through a non-const pointer */
    if (!m || atomic_load_explicit(&m->fail_state, memory_order_acquire) != 2) return KVT_OK;
    if (why && why_len) snprintf(why, why_len, "%s", m->fail_why);
    return m->fail_status;
}

static kvt_ssd_fault take_fault(kvt_ssd *s, bool on_write)
{
    if (atomic_load_explicit(&s->inject_kind[on_write], memory_order_relaxed) == KVT_SSD_FAULT_NONE)
        return KVT_SSD_FAULT_NONE;
    if (atomic_fetch_sub(&s->inject_count[on_write], 1) != 0) return KVT_SSD_FAULT_NONE;
    return (kvt_ssd_fault)atomic_exchange(&s->inject_kind[on_write], KVT_SSD_FAULT_NONE);
}

/* Shapes r per an injected fault: errors skip the I/O (a NOP carries them),
 * a short transfer moves half the slot, corruption flips a byte read. */
static void apply_fault(kvt_ssd *s, ssd_req *r)
{
    switch (take_fault(s, r->write)) {
    case KVT_SSD_FAULT_ENOSPC: r->early = r->write ? KVT_ENOSPC : KVT_EIO; break;
    case KVT_SSD_FAULT_EIO: r->early = KVT_EIO; break;
    case KVT_SSD_FAULT_SHORT: r->io.len /= 2; break;
    case KVT_SSD_FAULT_CORRUPT: r->flip = !r->write; break;
    default: break;
    }
}

/* ---- submission ------------------------------------------------------ */

static kvt_status check_io_args(kvt_ssd *s, uint32_t slot, const void *buf, kvt_ssd_done_fn done,
                                const char *fn)
{
    KVT_CHECK_NOT_NULL(s, fn);
    KVT_CHECK_ARG(buf != NULL && ((uintptr_t)buf % KVT_SSD_SLOT_ALIGN) == 0,
                  "%s: buf %p is not %llu-byte aligned", fn, buf, KVT_SSD_SLOT_ALIGN);
    KVT_CHECK_ARG(done != NULL, "%s: done is NULL", fn);
    KVT_CHECK_ARG(slot < s->total, "%s: slot %u is out of range (%u slots)", fn, slot, s->total);
    KVT_CHECK_ARG(s->allocated[slot], "%s: slot %u is not allocated", fn, slot);
    return KVT_OK;
}

static ssd_req *req_start(kvt_ssd *s, uint32_t slot, void *buf, bool write, kvt_ssd_done_fn done,
                          void *arg, const char *fn)
{
    ssd_req *r = req_get(s);
    if (!r) {
        kvt__fail(KVT_EAGAIN, "%s: all %u requests are in flight; retry after completions", fn,
                  s->nreq);
        return NULL;
    }
    ssd_dir *dir = kvt__ssd_dir_of(s, slot);
    r->io.op = write ? KVT_IO_WRITE : KVT_IO_READ;
    r->io.fd = dir->data_fd;
    r->io.buf = buf;
    r->io.len = (uint32_t)s->slot_bytes;
    r->io.off = (uint64_t)kvt__ssd_local(s, slot) * s->slot_bytes;
    r->io.res = 0;
    r->write = write;
    r->flip = false;
    r->slot = slot;
    r->early = KVT_OK;
    r->done = done;
    r->arg = arg;
    r->next_commit = NULL;
    return r;
}

static void submit(kvt_ssd *s, ssd_req *r)
{
    apply_fault(s, r);
    atomic_fetch_add_explicit(&s->inflight[r->slot], 1, memory_order_relaxed);
    if (r->early != KVT_OK) r->io.op = KVT_IO_NOP;
    atomic_fetch_add(&s->outstanding, 1);
    if (r->write) atomic_fetch_add(&s->writes_submitted, 1);
    s->ops->submit(s->io, &r->io);
}

kvt_status kvt__ssd_write(kvt_ssd *s, uint32_t slot, const void *buf, kvt_hash128 key,
                          kvt_hash128 parent, bool has_parent, kvt_ssd_done_fn done, void *arg)
{
    kvt_status st = check_io_args(s, slot, buf, done, "kvt__ssd_write");
    if (st != KVT_OK) return st;
    ssd_req *r = req_start(s, slot, (void *)buf, true, done, arg, "kvt__ssd_write");
    if (!r) return KVT_EAGAIN;
    r->key = key;
    r->parent = parent;
    r->has_parent = has_parent;
    r->csum = kvt__ssd_block_csum(buf, s->block_bytes, key);
    r->gen = atomic_load(&s->gen[slot]);
    kvt_ssd_slot *e = &s->slots[slot];
    e->key = key;
    e->parent = parent;
    e->has_parent = has_parent;
    e->csum = r->csum;
    e->live = 1;
    submit(s, r);
    return KVT_OK;
}

kvt_status kvt__ssd_read(kvt_ssd *s, uint32_t slot, void *buf, kvt_hash128 key,
                         kvt_ssd_done_fn done, void *arg)
{
    kvt_status st = check_io_args(s, slot, buf, done, "kvt__ssd_read");
    if (st != KVT_OK) return st;
    ssd_req *r = req_start(s, slot, buf, false, done, arg, "kvt__ssd_read");
    if (!r) return KVT_EAGAIN;
    const kvt_ssd_slot *e = &s->slots[slot];
    r->key = key;
    r->csum = e->csum;
    /* A slot that holds another block (or none) is a corrupt read, reported
     * through done like any other, without touching the device. */
    if (!e->live || !kvt__hash_eq(e->key, key)) r->early = KVT_ECORRUPT;
    submit(s, r);
    return KVT_OK;
}

/* ---- completion ------------------------------------------------------ */

/* A transfer shorter than the slot is an error, never accepted. */
static kvt_status io_status(const kvt_ssd *s, const ssd_req *r)
{
    if (r->early != KVT_OK) return r->early;
    if (r->io.res == -ENOSPC) return KVT_ENOSPC;
    if (r->io.res != (int64_t)s->slot_bytes) return KVT_EIO;
    return KVT_OK;
}

static void finish(kvt_ssd *s, ssd_req *r, kvt_status st)
{
    kvt_ssd_done_fn done = r->done;
    void *arg = r->arg;
    bool write = r->write;
    req_put(s, r);
    done(arg, st);
    if (write) atomic_fetch_add(&s->writes_finished, 1);
    atomic_fetch_sub(&s->outstanding, 1);
}

static void finish_read(kvt_ssd *s, ssd_req *r)
{
    hold_read(s);
    kvt_status st = io_status(s, r);
    if (st == KVT_OK && r->flip) ((uint8_t *)r->io.buf)[s->block_bytes / 2] ^= 0x5a;
    if (st == KVT_OK && kvt__ssd_block_csum(r->io.buf, s->block_bytes, r->key) != r->csum)
        st = KVT_ECORRUPT;
    if (st == KVT_OK) {
        atomic_fetch_add_explicit(&s->st_reads, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->st_read_bytes, s->block_bytes, memory_order_relaxed);
    } else if (st == KVT_ECORRUPT) {
        atomic_fetch_add_explicit(&s->st_corrupt, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&s->st_read_errors, 1, memory_order_relaxed);
    }
    finish(s, r, st);
}

void kvt__ssd_io_complete(void *ctx, kvt_io_req **reqs, uint32_t n)
{
    kvt_ssd *s = ctx;
    ssd_req *head = NULL, *tail = NULL;
    for (uint32_t i = 0; i < n; i++) {
        ssd_req *r = (ssd_req *)reqs[i];
        /* The device is done with the slot: a free of it may now reclaim it. */
        atomic_fetch_sub_explicit(&s->inflight[r->slot], 1, memory_order_release);
        if (!r->write) {
            finish_read(s, r);
            continue;
        }
        hold_write(s);
        kvt_status st = io_status(s, r);
        if (st != KVT_OK) {
            int err = r->early == KVT_ENOSPC ? ENOSPC : r->early != KVT_OK ? EIO
                    : r->io.res < 0 ? (int)-r->io.res : 0;
            st = kvt__ssd_note_failure(s, err, kvt__ssd_dir_of(s, r->slot)->path,
                                       KVT_SSD_DATA_NAME, r->early ? "write (injected)" : "write");
            atomic_fetch_add_explicit(&s->st_write_errors, 1, memory_order_relaxed);
            finish(s, r, st);
            continue;
        }
        r->next_commit = NULL;
        if (tail)
            tail->next_commit = r;
        else
            head = r;
        tail = r;
    }
    if (!head) return;
    pthread_mutex_lock(&s->cmu);
    if (s->cq_tail)
        s->cq_tail->next_commit = head;
    else
        s->cq_head = head;
    s->cq_tail = tail;
    pthread_cond_signal(&s->ccv);
    pthread_mutex_unlock(&s->cmu);
}

/* ---- group commit ---------------------------------------------------- */

static void round_begin(kvt_ssd *s)
{
    for (uint32_t d = 0; d < s->ndirs; d++) {
        ssd_dir *dir = &s->dirs[d];
        dir->touched = false;
        dir->fail = KVT_OK;
        dir->jbuf_n = 0;
        dir->jbuf_seq0 = dir->jrecords;
    }
}

/* The round's frees, sorted in place: [0, *nj) get a DEL record (the
 * journal names their block), the last *ndefer still have I/O in flight
 * and wait for a later round, and those the journal never named are
 * reclaimable at once (appended to s->reclaim, *nrel counts them). durable
 * changes only once the records are on disk (apply_round). */
static void journal_dels(kvt_ssd *s, uint32_t ndels, uint32_t *nj, uint32_t *ndefer,
                         uint32_t *nrel)
{
    uint32_t *v = s->dels_commit, j = 0, back = ndels;
    for (uint32_t i = 0; i < back;) {
        uint32_t slot = v[i];
        if (atomic_load_explicit(&s->inflight[slot], memory_order_acquire) != 0) {
            v[i] = v[--back];
            v[back] = slot;
            continue;
        }
        i++;
        if (!s->durable[slot].live) {
            s->reclaim[(*nrel)++] = slot;
            continue;
        }
        kvt_ssd_rec rec = {.type = KVT_SSD_REC_DEL, .slot = kvt__ssd_local(s, slot)};
        kvt__ssd_journal_add(s, kvt__ssd_dir_of(s, slot), &rec);
        v[j++] = slot; /* j < i: v[j] was already read */
    }
    *nj = j;
    *ndefer = ndels - back;
}

/* A write whose slot was freed after it was submitted is not journaled: the
 * slot's block is gone. */
static void journal_puts(kvt_ssd *s, ssd_req *batch)
{
    for (ssd_req *r = batch; r; r = r->next_commit) {
        ssd_dir *dir = kvt__ssd_dir_of(s, r->slot);
        r->journaled = dir->fail == KVT_OK && r->gen == atomic_load(&s->gen[r->slot]);
        if (!r->journaled) continue;
        kvt_ssd_rec rec = {.type = KVT_SSD_REC_PUT, .has_parent = r->has_parent,
                           .slot = kvt__ssd_local(s, r->slot), .key = r->key,
                           .parent = r->parent, .csum = r->csum};
        kvt__ssd_journal_add(s, dir, &rec);
    }
}

/* After the commit: durable follows what each journal now holds. A DEL its
 * journal did not take leaves the slot out of use for the store's life (the
 * old PUT still names it, and its bytes are intact); every other freed slot
 * is reclaimable. */
static void apply_round(kvt_ssd *s, ssd_req *batch, uint32_t nj, uint32_t *nrel)
{
    for (uint32_t i = 0; i < nj; i++) {
        uint32_t slot = s->dels_commit[i];
        ssd_dir *dir = kvt__ssd_dir_of(s, slot);
        if (dir->fail != KVT_OK) {
            atomic_fetch_sub(&s->reclaiming, 1);
            atomic_fetch_add_explicit(&s->st_withheld, 1, memory_order_relaxed);
            continue;
        }
        s->durable[slot].live = 0;
        dir->jlive--;
        s->reclaim[(*nrel)++] = slot;
    }
    for (ssd_req *r = batch; r; r = r->next_commit) {
        ssd_dir *dir = kvt__ssd_dir_of(s, r->slot);
        if (!r->journaled || dir->fail != KVT_OK) continue;
        kvt_ssd_slot *e = &s->durable[r->slot];
        if (!e->live) dir->jlive++;
        *e = (kvt_ssd_slot){r->key, r->parent, r->csum, r->has_parent, 1};
    }
}

/* Hands the round's reclaimable slots to kvt__ssd_alloc and puts the
 * deferred frees back for the next round. */
static void publish_round(kvt_ssd *s, uint32_t ndels, uint32_t ndefer, uint32_t nrel)
{
    pthread_mutex_lock(&s->cmu);
    memcpy(s->released + s->nreleased, s->reclaim, (size_t)nrel * sizeof *s->reclaim);
    s->nreleased += nrel;
    for (uint32_t i = ndels - ndefer; i < ndels; i++) s->dels[s->ndels++] = s->dels_commit[i];
    pthread_mutex_unlock(&s->cmu);
}

static void finish_batch(kvt_ssd *s, ssd_req *batch)
{
    while (batch) {
        ssd_req *r = batch;
        batch = r->next_commit;
        kvt_status st = kvt__ssd_dir_of(s, r->slot)->fail;
        if (st == KVT_OK && r->gen != atomic_load(&s->gen[r->slot])) st = KVT_ECANCELED;
        if (st == KVT_OK) {
            atomic_fetch_add_explicit(&s->st_writes, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->st_write_bytes, s->block_bytes, memory_order_relaxed);
        } else {
            atomic_fetch_add_explicit(&s->st_write_errors, 1, memory_order_relaxed);
        }
        finish(s, r, st);
    }
}

static void commit_round(kvt_ssd *s, ssd_req *batch, uint32_t ndels)
{
    round_begin(s);
    for (ssd_req *r = batch; r; r = r->next_commit) kvt__ssd_dir_of(s, r->slot)->touched = true;
    for (uint32_t d = 0; d < s->ndirs; d++)
        if (s->dirs[d].touched && fdatasync(s->dirs[d].data_fd) != 0)
            s->dirs[d].fail = kvt__ssd_note_failure(s, errno, s->dirs[d].path, KVT_SSD_DATA_NAME,
                                                    "fdatasync");
    uint32_t nj = 0, ndefer = 0, nrel = 0;
    journal_dels(s, ndels, &nj, &ndefer, &nrel);
    journal_puts(s, batch);
    for (uint32_t d = 0; d < s->ndirs; d++) kvt__ssd_journal_commit(s, &s->dirs[d]);
    apply_round(s, batch, nj, &nrel);
    publish_round(s, ndels, ndefer, nrel);
    finish_batch(s, batch);
    for (uint32_t d = 0; d < s->ndirs; d++) kvt__ssd_journal_maybe_compact(s, d);
}

/* Takes the queued writes and pending frees; false when it is time to exit. */
static bool take_work(kvt_ssd *s, ssd_req **batch, uint32_t *ndels)
{
    pthread_mutex_lock(&s->cmu);
    while (!s->cq_head && !s->stop && !s->flush_dels)
        kvt__cond_wait_until(&s->ccv, &s->cmu, kvt__now_ns() + COMMIT_IDLE_NS);
    *batch = s->cq_head;
    s->cq_head = s->cq_tail = NULL;
    uint32_t *t = s->dels_commit;
    s->dels_commit = s->dels;
    s->dels = t;
    *ndels = s->ndels;
    s->ndels = 0;
    s->flush_dels = false;
    bool go_on = !s->stop || *batch || *ndels;
    s->busy = *batch || *ndels;
    pthread_mutex_unlock(&s->cmu);
    return go_on;
}

static void *commit_main(void *arg)
{
    kvt_ssd *s = arg;
    ssd_req *batch;
    uint32_t ndels;
    while (take_work(s, &batch, &ndels)) {
        if (batch || ndels) commit_round(s, batch, ndels);
        pthread_mutex_lock(&s->cmu);
        s->busy = false;
        pthread_cond_broadcast(&s->dcv);
        pthread_mutex_unlock(&s->cmu);
    }
    return NULL;
}

void kvt__ssd_free(kvt_ssd *s, uint32_t slot)
{
    if (!s || slot >= s->total || !s->allocated[slot]) return; /* misuse: ignored, not fatal */
    s->allocated[slot] = 0;
    s->slots[slot].live = 0;
    atomic_fetch_add(&s->gen[slot], 1);
    atomic_fetch_add(&s->reclaiming, 1);
    /* Not reusable yet: the commit thread releases it (see reclaim in
     * ssd_internal.h). A slot is in dels at most once: it cannot be freed
     * again before it is allocated again. */
    pthread_mutex_lock(&s->cmu);
    s->dels[s->ndels++] = slot;
    pthread_mutex_unlock(&s->cmu);
}


/* ---- waiting --------------------------------------------------------- */

/* Waits until done() holds or deadline_ns; the commit thread broadcasts
 * after each round, reads finish without one, so waits are sliced. */
static bool wait_until(kvt_ssd *s, bool (*done)(kvt_ssd *, uint64_t), uint64_t v,
                       uint64_t deadline_ns)
{
    pthread_mutex_lock(&s->cmu);
    bool ok;
    while (!(ok = done(s, v))) {
        uint64_t now = kvt__now_ns();
        if (now >= deadline_ns) break;
        uint64_t until = now + WAIT_SLICE_NS < deadline_ns ? now + WAIT_SLICE_NS : deadline_ns;
        kvt__cond_wait_until(&s->dcv, &s->cmu, until);
    }
    pthread_mutex_unlock(&s->cmu);
    return ok;
}

static bool writes_done(kvt_ssd *s, uint64_t target) { return atomic_load(&s->writes_finished) >= target; }
static bool all_done(kvt_ssd *s, uint64_t unused) { (void)unused; return atomic_load(&s->outstanding) == 0; }
static bool dels_done(kvt_ssd *s, uint64_t unused) { (void)unused; return s->ndels == 0 && !s->flush_dels && !s->busy; }

kvt_status kvt__ssd_sync(kvt_ssd *s, uint64_t deadline_ns)
{
    KVT_CHECK_NOT_NULL(s, "kvt__ssd_sync");
    uint64_t target = atomic_load(&s->writes_submitted);
    if (!wait_until(s, writes_done, target, deadline_ns))
        return kvt__fail(KVT_ETIMEDOUT, "kvt__ssd_sync: %llu of %llu writes still in flight at the deadline",
                         (unsigned long long)(target - atomic_load(&s->writes_finished)),
                         (unsigned long long)target);
    return KVT_OK;
}

static bool reclaimed(kvt_ssd *s, uint64_t unused)
{
    (void)unused;
    if (s->nreleased > 0 || atomic_load(&s->reclaiming) == 0) return true;
    s->flush_dels = true; /* a round now, not at the commit thread's idle tick */
    pthread_cond_signal(&s->ccv);
    return false;
}

void kvt__ssd_flush_frees(kvt_ssd *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->cmu);
    if (s->ndels > 0) {
        s->flush_dels = true;
        pthread_cond_signal(&s->ccv);
    }
    pthread_mutex_unlock(&s->cmu);
}

bool kvt__ssd_wait_reclaim(kvt_ssd *s, uint64_t deadline_ns)
{
    if (!s) return false;
    wait_until(s, reclaimed, 0, deadline_ns);
    pthread_mutex_lock(&s->cmu);
    bool ready = s->nreleased > 0;
    pthread_mutex_unlock(&s->cmu);
    return ready;
}

/* ---- start / stop ---------------------------------------------------- */

static kvt_status pick_backend(kvt_ssd *s, const char *io)
{
    const char *env = kvt__config_env("KVTIER_IO");
    if (strcmp(io, "auto") == 0 && env && *env) io = env;
    if (strcmp(io, "uring") == 0 || strcmp(io, "io_uring") == 0) {
        s->ops = &kvt__io_uring_ops;
    } else if (strcmp(io, "threads") == 0) {
        s->ops = &kvt__io_threads_ops;
    } else if (strcmp(io, "auto") == 0) {
        s->ops = kvt__io_uring_probe() ? &kvt__io_uring_ops : &kvt__io_threads_ops;
    } else {
        return kvt__fail(KVT_EINVAL, "kvt__ssd_open: io \"%s\"%s is not auto, uring or threads",
                         io, io == env ? " (from KVTIER_IO)" : "");
    }
    return KVT_OK;
}

kvt_status kvt__ssd_io_start(kvt_ssd *s, const kvt_ssd_params *p)
{
    for (uint32_t i = 0; i < s->nreq; i++)
        atomic_init(&s->reqs[i].next_free, i + 1 < s->nreq ? i + 1 : NONE_IDX);
    atomic_init(&s->free_top, 0);
    kvt_status st = pick_backend(s, p->io ? p->io : "auto");
    if (st != KVT_OK) return st;
    kvt_io_cfg cfg = {p->queue_depth, p->register_base, p->register_len, kvt__ssd_io_complete, s};
    st = s->ops->create(&s->io, &cfg);
    if (st == KVT_EUNSUPPORTED) /* the message says which setting chose io_uring */
        return kvt__wrap_error(st, "the SSD tier's io option (or KVTIER_IO) asks for io_uring, "
                               "which this process cannot use (io auto falls back to threads)");
    if (st != KVT_OK) return st;
    int rc = pthread_create(&s->commit_th, NULL, commit_main, s);
    if (rc != 0) return kvt__fail(KVT_ESYS, "kvt__ssd_open: pthread_create: %s", strerror(rc));
    s->commit_started = true;
    return KVT_OK;
}

/* Bounds close: I/O that has not finished by then is abandoned (the device
 * is hung; nothing better is possible) and reported on stderr. */
#define CLOSE_WAIT_NS (60ull * 1000000000ull)

void kvt__ssd_io_stop(kvt_ssd *s)
{
    bool drained = true;
    if (s->io) drained = wait_until(s, all_done, 0, kvt__now_ns() + CLOSE_WAIT_NS);
    if (s->commit_started) {
        pthread_mutex_lock(&s->cmu);
        s->flush_dels = true;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        wait_until(s, dels_done, 0, kvt__now_ns() + CLOSE_WAIT_NS);
        pthread_mutex_lock(&s->cmu);
        s->stop = true;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
        pthread_join(s->commit_th, NULL);
    }
    if (!drained) {
        kvt__log(KVT_LOG_ERROR, "ssd close: I/O still in flight after 60 s; abandoning it");
        return; /* leak the backend rather than free memory the kernel may write */
    }
    if (s->io) s->ops->destroy(s->io);
    s->io = NULL;
}

void kvt__ssd_stats(const kvt_ssd *s, kvt_ssd_stats *out)
{
    if (!s || !out) return;
    kvt_ssd *m = (kvt_ssd *)s; /* atomics: loads through a non-const pointer */
    out->writes = atomic_load(&m->st_writes);
    out->write_bytes = atomic_load(&m->st_write_bytes);
    out->reads = atomic_load(&m->st_reads);
    out->read_bytes = atomic_load(&m->st_read_bytes);
    out->write_errors = atomic_load(&m->st_write_errors);
    out->read_errors = atomic_load(&m->st_read_errors);
    out->corrupt_reads = atomic_load(&m->st_corrupt);
    out->journal_records = atomic_load(&m->st_jrecs);
    out->journal_compactions = atomic_load(&m->st_compactions);
    out->withheld_slots = atomic_load(&m->st_withheld);
}

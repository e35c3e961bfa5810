/* share.c - one CPU capacity for several caches (see share.h). */
#include "cache/share.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "cache/tiers.h"
#include "index/index.h"
#include "util/err.h"
#include "util/clock.h"

struct kvt_share {
    pthread_mutex_t mu; /* guards members */
    kvt_pool_budget budget;
    kvt_pool_budget ssd_budget; /* limit 0: the members have no SSD tier */
    _Atomic uint64_t clock; /* every member index's ticks */
    kvt_cache **members; /* grown by join: a server holds few geometries */
    uint32_t n, cap;
};

kvt_status kvt__share_create(kvt_share **out, uint64_t capacity_bytes, uint64_t ssd_bytes)
{
    KVT_CHECK_NOT_NULL(out, "kvt__share_create");
    KVT_CHECK_ARG(capacity_bytes > 0, "kvt__share_create: capacity is 0");
    kvt_share *sh = calloc(1, sizeof *sh);
    if (!sh) return kvt__fail(KVT_ENOMEM, "kvt__share_create: out of memory");
    pthread_mutex_init(&sh->mu, NULL);
    sh->budget.limit = capacity_bytes;
    sh->ssd_budget.limit = ssd_bytes;
    *out = sh;
    return KVT_OK;
}

void kvt__share_destroy(kvt_share *sh)
{
    if (!sh) return;
    pthread_mutex_destroy(&sh->mu);
    free(sh->members);
    free(sh);
}

uint64_t kvt__share_used(const kvt_share *sh) { return atomic_load(&sh->budget.used); }
uint64_t kvt__share_capacity(const kvt_share *sh) { return sh->budget.limit; }

kvt_pool_budget *kvt__share_budget(kvt_share *sh) { return &sh->budget; }
kvt_pool_budget *kvt__share_ssd_budget(kvt_share *sh)
{
    return sh->ssd_budget.limit ? &sh->ssd_budget : NULL;
}
uint64_t kvt__share_ssd_used(const kvt_share *sh) { return atomic_load(&sh->ssd_budget.used); }

kvt_status kvt__share_join(kvt_share *sh, kvt_cache *c)
{
    pthread_mutex_lock(&sh->mu);
    if (sh->n == sh->cap) {
        uint32_t cap = sh->cap ? 2 * sh->cap : 4;
        kvt_cache **m = realloc(sh->members, cap * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&sh->mu);
            return kvt__fail(KVT_ENOMEM, "kvt__cache_create_shared: out of memory");
        }
        sh->members = m;
        sh->cap = cap;
    }
    sh->members[sh->n++] = c;
    pthread_mutex_unlock(&sh->mu);
    c->share = sh;
    kvt__index_share_clock(c->index, &sh->clock);
    return KVT_OK;
}

void kvt__share_leave(kvt_cache *c)
{
    kvt_share *sh = c->share;
    if (!sh) return;
    pthread_mutex_lock(&sh->mu);
    for (uint32_t i = 0; i < sh->n; i++)
        if (sh->members[i] == c) {
            sh->members[i] = sh->members[--sh->n];
            break;
        }
    pthread_mutex_unlock(&sh->mu);
    c->share = NULL;
}

/* A cache's coldest block as one comparable key: (freq, tick). */
typedef struct cold_key {
    uint16_t freq;
    uint64_t tick;
    bool any;
} cold_key;

static cold_key coldest(const kvt_cache *c)
{
    cold_key k = {0};
    k.any = kvt__index_coldest(c->index, &k.freq, &k.tick);
    return k;
}

static bool colder(cold_key a, cold_key b)
{
    if (!a.any) return false;
    if (!b.any) return true;
    return a.freq != b.freq ? a.freq < b.freq : a.tick < b.tick;
}

/* The two budgets' slots: a member's CPU pool slots (its stride) or, with
 * ssd, its SSD store's (every member has a pool; not every one an SSD). */
static uint64_t slot_bytes(const kvt_cache *m, bool ssd)
{
    return ssd ? kvt__ssd_slot_bytes(m->ssd) : kvt__pool_stride(m->pool);
}

/* Slots of m covering bytes (m's blocks may be larger or smaller). */
static uint32_t slots_for(const kvt_cache *m, bool ssd, uint64_t bytes)
{
    uint64_t unit = slot_bytes(m, ssd), n = (bytes + unit - 1) / unit;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* One reclaim's view of the members it could not lock. A member busy
 * under its own mutex (its mover, its SSD commit round giving slots back,
 * a stats read) is free again within microseconds; passed over at once,
 * its colder blocks were spared and the caller dropped its own newer ones
 * (or stored fewer). So a busy member is retried, yielding the CPU, for at
 * most BUSY_WAIT_NS over the whole call: its holder may be waiting for
 * sh->mu, which the caller holds, and then only the bound ends the wait.
 * busy says someone was passed over all the same (the SSD side then waits
 * with its mutex dropped, see kvt__share_ssd_reclaim). */
#define BUSY_WAIT_NS 2000000ull

typedef struct scan {
    bool spin;         /* retry a busy member (the CPU reclaim only: see below) */
    uint64_t deadline; /* 0 until the first busy member */
    bool busy;
} scan;

/* Member m's mutex (m is not the caller), or false when still busy. Only
 * the CPU reclaim spins: the SSD writer waits with its mutex dropped
 * instead (busy is its "pending"), and an owner's quota room is asked per
 * block, up to QUOTA_GIVE_UPS times (tiers.c), where a spin each time would
 * hold both caches for milliseconds a block. */
static bool lock_other(kvt_cache *m, scan *s)
{
    if (pthread_mutex_trylock(&m->mu) == 0) return true;
    if (!s->spin) {
        s->busy = true;
        return false;
    }
    if (s->deadline == 0) s->deadline = kvt__now_ns() + BUSY_WAIT_NS;
    while (kvt__now_ns() < s->deadline) {
        sched_yield();
        if (pthread_mutex_trylock(&m->mu) == 0) return true;
    }
    s->busy = true;
    return false;
}

/* Free backed slots of the others (CPU, or with ssd SSD slots): memory or
 * disk no block uses. sh->mu held. Returns bytes given back to the budget. */
static uint64_t take_free(kvt_share *sh, kvt_cache *c, uint64_t want, bool ssd, scan *sc)
{
    uint64_t got = 0;
    for (uint32_t i = 0; i < sh->n && got < want; i++) {
        kvt_cache *m = sh->members[i];
        if (m == c || (ssd && !m->ssd) || !lock_other(m, sc)) continue;
        uint32_t n = slots_for(m, ssd, want - got);
        n = ssd ? kvt__ssd_release(m->ssd, n) : kvt__pool_release(m->pool, n);
        got += (uint64_t)n * slot_bytes(m, ssd);
        pthread_mutex_unlock(&m->mu);
    }
    return got;
}

/* The member (not c; with ssd, one with an SSD tier) whose coldest block
 * is colder than mine, the coldest of them; NULL when mine is the coldest
 * (or the others stayed busy: see sc->busy). */
static kvt_cache *victim(kvt_share *sh, kvt_cache *c, cold_key mine, bool ssd, scan *sc)
{
    kvt_cache *best = NULL;
    cold_key bk = mine;
    for (uint32_t i = 0; i < sh->n; i++) {
        kvt_cache *m = sh->members[i];
        if (m == c || (ssd && !m->ssd) || !lock_other(m, sc)) continue;
        cold_key k = coldest(m);
        pthread_mutex_unlock(&m->mu);
        if (colder(k, bk)) {
            best = m;
            bk = k;
        }
    }
    return best;
}

/* Bytes got back as the caller's slots of unit bytes, at most want. */
static uint32_t got_slots(uint64_t got, uint64_t unit, uint32_t want)
{
    uint64_t slots = got / unit;
    if (got && !slots) slots = 1; /* part of a slot: worth one more try */
    return slots > want ? want : (uint32_t)slots;
}

#define RECLAIM_ROUNDS 8 /* victims tried per call: bounds the time under sh->mu */

static uint32_t reclaim(kvt_cache *c, uint32_t want, bool from_others)
{
    kvt_share *sh = c->share;
    if (!sh || want == 0) return 0;
    uint64_t stride = slot_bytes(c, false), need = (uint64_t)want * stride;
    scan sc = {.spin = true};
    pthread_mutex_lock(&sh->mu);
    uint64_t got = take_free(sh, c, need, false, &sc);
    cold_key mine = from_others ? (cold_key){0} : coldest(c);
    for (int r = 0; r < RECLAIM_ROUNDS && got < need; r++) {
        kvt_cache *v = victim(sh, c, mine, false, &sc);
        if (!v || !lock_other(v, &sc)) break;
        uint32_t n = kvt__tiers_give_back(v, slots_for(v, false, need - got));
        pthread_mutex_unlock(&v->mu);
        if (n == 0) break;
        got += (uint64_t)n * slot_bytes(v, false);
    }
    pthread_mutex_unlock(&sh->mu);
    return got_slots(got, stride, want);
}

uint32_t kvt__share_reclaim(kvt_cache *c, uint32_t want) { return reclaim(c, want, false); }
uint32_t kvt__share_reclaim_others(kvt_cache *c, uint32_t want) { return reclaim(c, want, true); }

/* The owner's coldest block in m as a key; m->mu held. */
static cold_key owner_coldest(const kvt_cache *m, uint8_t owner)
{
    cold_key k = {0};
    uint32_t id = kvt__tiers_owner_coldest(m, owner);
    if (id == KVT_INDEX_NONE) return k;
    kvt__index_age(m->index, id, &k.freq, &k.tick);
    k.any = true;
    return k;
}

/* Member m (c: already locked by the caller) with its mutex, or false. */
static bool lock_member(kvt_cache *c, kvt_cache *m, scan *sc)
{
    return m == c || lock_other(m, sc);
}

static void unlock_member(kvt_cache *c, kvt_cache *m)
{
    if (m != c) pthread_mutex_unlock(&m->mu);
}

bool kvt__share_owner_room(kvt_cache *c, uint8_t owner)
{
    kvt_share *sh = c->share;
    if (!sh) return kvt__tiers_owner_room(c, owner);
    scan sc = {0};
    pthread_mutex_lock(&sh->mu);
    kvt_cache *best = NULL;
    cold_key bk = {0};
    for (uint32_t i = 0; i < sh->n; i++) {
        kvt_cache *m = sh->members[i];
        if (!lock_member(c, m, &sc)) continue;
        cold_key k = owner_coldest(m, owner);
        unlock_member(c, m);
        if (colder(k, bk)) {
            best = m;
            bk = k;
        }
    }
    bool made = false;
    if (best && lock_member(c, best, &sc)) {
        made = kvt__tiers_owner_room(best, owner);
        unlock_member(c, best);
    }
    if (!made) made = kvt__tiers_owner_room(c, owner); /* copies on the SSD, say */
    for (uint32_t i = 0; i < sh->n && !made; i++) {
        kvt_cache *m = sh->members[i];
        if (m == c || !lock_member(c, m, &sc)) continue;
        made = kvt__tiers_owner_room(m, owner);
        unlock_member(c, m);
    }
    pthread_mutex_unlock(&sh->mu);
    return made;
}

/* ---- the SSD budget ------------------------------------------------ */

/* The victim's freed SSD slots come back only after its commit round: what
 * is already on its way counts, so repeated calls while the caller waits
 * do not evict again. A member that stayed busy counts too (it may hold
 * the colder blocks: the caller asks again after a pause rather than
 * evicting its own). sh->mu held. */
static bool ssd_victim_gives(kvt_share *sh, kvt_cache *c, uint64_t need, scan *sc)
{
    kvt_cache *v = victim(sh, c, coldest(c), true, sc);
    if (!v || !lock_other(v, sc)) return sc->busy;
    uint32_t want = slots_for(v, true, need), coming = kvt__ssd_blocks_free(v->ssd);
    uint32_t n = coming < want ? kvt__tiers_give_back_ssd(v, want - coming) : 0;
    if (n == 0) kvt__ssd_flush_frees(v->ssd);
    pthread_mutex_unlock(&v->mu);
    return n > 0 || coming > 0;
}

uint32_t kvt__share_ssd_reclaim(kvt_cache *c, uint32_t want, bool *pending)
{
    kvt_share *sh = c->share;
    *pending = false;
    if (!sh || !c->ssd || !c->ssd_budget || want == 0) return 0;
    uint64_t unit = slot_bytes(c, true), need = (uint64_t)want * unit;
    scan sc = {0};
    pthread_mutex_lock(&sh->mu);
    uint64_t got = take_free(sh, c, need, true, &sc);
    if (got < need) *pending = ssd_victim_gives(sh, c, need - got, &sc);
    pthread_mutex_unlock(&sh->mu);
    return got_slots(got, unit, want);
}

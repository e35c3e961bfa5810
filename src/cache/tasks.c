/* tasks.c - task ids and slots. An id is (reuse count of its slot) *
 * max_tasks + slot + 1, so a stale id never names a reused slot's new task. */
#include "cache/tasks.h"

#include <stdlib.h>
#include <string.h>

kvt_status kvt__tasks_init(kvt_cache *c, uint32_t max_tasks)
{
    c->tasks = calloc(max_tasks, sizeof *c->tasks);
    c->free_slots = calloc(max_tasks, sizeof *c->free_slots);
    c->slot_gen = calloc(max_tasks, sizeof *c->slot_gen);
    if (!c->tasks || !c->free_slots || !c->slot_gen)
        return kvt__fail(KVT_ENOMEM, "kvt_cache_create: no memory for %u task slots", max_tasks);
    /* Pop order = slot 0 first. */
    for (uint32_t i = 0; i < max_tasks; i++) c->free_slots[i] = max_tasks - 1 - i;
    c->num_free = max_tasks;
    return KVT_OK;
}

static void release_arrays(kvt_task *t)
{
    free(t->entries);
    free(t->blocks);
    free(t->pages);
    free(t->tmp_slots);
    t->tmp_slots = NULL;
    t->entries = NULL;
    t->blocks = NULL;
    t->pages = NULL;
}

void kvt__tasks_fini(kvt_cache *c)
{
    if (c->tasks)
        for (uint32_t i = 0; i < c->cfg.max_tasks; i++) release_arrays(&c->tasks[i]);
    free(c->tasks);
    free(c->free_slots);
    free(c->slot_gen);
}

kvt_status kvt__task_new(kvt_cache *c, kvt_task_kind kind, uint32_t num_blocks, kvt_task **out)
{
    /* Tasks are planned only by these two: the message names the call. */
    const char *fn = kind == KVT_TASK_LOAD ? "kvt_cache_lookup" : "kvt_cache_prepare_store";
    if (c->num_free == 0)
        return kvt__fail(KVT_EFULL, "%s: task table full: %u tasks are planned, running or "
                         "ended but not yet reported; report results with kvt_cache_wait or "
                         "kvt_cache_poll, or raise max_tasks", fn, c->cfg.max_tasks);
    /* One allocation per task (never per block) for its block lists. */
    uint32_t slot = c->free_slots[c->num_free - 1];
    kvt_task *t = &c->tasks[slot];
    t->entries = malloc((size_t)num_blocks * sizeof *t->entries);
    t->blocks = malloc((size_t)num_blocks * sizeof *t->blocks);
    t->pages = malloc((size_t)num_blocks * c->pages_per_block * sizeof *t->pages);
    t->tmp_slots = malloc((size_t)num_blocks * sizeof *t->tmp_slots);
    if (!t->entries || !t->blocks || !t->pages || !t->tmp_slots) {
        release_arrays(t);
        return kvt__fail(KVT_ENOMEM, "%s: no memory for a task of %u blocks", fn, num_blocks);
    }
    c->num_free--;
    uint64_t gen = c->slot_gen[slot]++;
    t->id = gen * c->cfg.max_tasks + slot + 1;
    t->kind = kind;
    t->state = KVT_TS_PLANNED;
    t->result = KVT_OK;
    t->num_blocks = num_blocks;
    t->refs = 0;
    t->reported = false;
    t->num_repair = 0;
    t->num_pinned = 0;
    t->reads_left = 0;
    t->first_bad = num_blocks;
    t->bad_status = KVT_OK;
    t->reading = false;
    t->cancel_asked = false;
    t->launched = false;
    t->launch_ns = 0;
    t->external = false;
    t->for_peer = false;
    for (uint32_t i = 0; i < num_blocks; i++) t->tmp_slots[i] = KVT_POOL_NONE;
    t->prev = t->next = NULL;
    t->cache = c;
    c->in_flight++;
    *out = t;
    return KVT_OK;
}

kvt_task *kvt__task_find(kvt_cache *c, kvt_task_id id)
{
    if (id == 0) return NULL;
    uint64_t slot = (id - 1) % c->cfg.max_tasks;
    kvt_task *t = &c->tasks[slot];
    if (t->state == KVT_TS_FREE || t->id != id || t->reported) return NULL;
    return t;
}

void kvt__task_free(kvt_cache *c, kvt_task *t)
{
    release_arrays(t);
    t->state = KVT_TS_FREE;
    t->id = 0;
    c->free_slots[c->num_free++] = (uint32_t)(t - c->tasks);
}

void kvt__list_push(kvt_task_list *l, kvt_task *t)
{
    t->next = NULL;
    t->prev = l->tail;
    if (l->tail) l->tail->next = t;
    else l->head = t;
    l->tail = t;
}

void kvt__list_remove(kvt_task_list *l, kvt_task *t)
{
    if (t->prev) t->prev->next = t->next;
    else l->head = t->next;
    if (t->next) t->next->prev = t->prev;
    else l->tail = t->prev;
    t->prev = t->next = NULL;
}

/* The statuses a task may end with; the order is the header's. */
static const kvt_status KVT_TASK_RESULTS[] = {KVT_OK, KVT_ETIMEDOUT, KVT_ECANCELED, KVT_EIO,
                                              KVT_ECORRUPT, KVT_ENOMEM, KVT_EPROTO, KVT_ECONN};

kvt_status kvt__task_status(kvt_status st)
{
    for (size_t i = 0; i < sizeof KVT_TASK_RESULTS / sizeof *KVT_TASK_RESULTS; i++)
        if (st == KVT_TASK_RESULTS[i]) return st;
    return st == KVT_EVERSION ? KVT_ECONN : KVT_EIO;
}

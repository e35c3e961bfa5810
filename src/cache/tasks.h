/* tasks.h - the cache's task table and task lists. All called with the cache
 * mutex held. */
#ifndef KVT_CACHE_TASKS_H
#define KVT_CACHE_TASKS_H

#include "cache/cache.h"

kvt_status kvt__tasks_init(kvt_cache *c, uint32_t max_tasks);
void kvt__tasks_fini(kvt_cache *c);
/* A fresh PLANNED task with arrays for num_blocks blocks; KVT_EFULL or
 * KVT_ENOMEM with a message otherwise. */
kvt_status kvt__task_new(kvt_cache *c, kvt_task_kind kind, uint32_t num_blocks, kvt_task **out);
/* The task with this id, or NULL (unknown, or already reported and freed). */
kvt_task *kvt__task_find(kvt_cache *c, kvt_task_id id);
/* Returns the slot to the free stack (the task must be unreferenced). */
void kvt__task_free(kvt_cache *c, kvt_task *t);

void kvt__list_push(kvt_task_list *l, kvt_task *t);
void kvt__list_remove(kvt_task_list *l, kvt_task *t);

#endif

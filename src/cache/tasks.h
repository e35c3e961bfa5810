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

/* st as a task's result (kvt_task_result.status, and what the wait_layer
 * family returns for a failed task): one of KVT_TASK_RESULTS below. Any
 * other failure is KVT_EIO (an SSD read's EAGAIN or ENOSPC, a submit's
 * EINVAL or ESTATE, a status a peer sent in an END: a caller must not read
 * "try again" or "your argument" into a task that failed), but a client's
 * KVT_EVERSION (the server it lost speaks another protocol) is KVT_ECONN.
 * No mutex needed. scripts/status_map.py reads the list from tasks.c. */
kvt_status kvt__task_status(kvt_status st);

void kvt__list_push(kvt_task_list *l, kvt_task *t);
void kvt__list_remove(kvt_task_list *l, kvt_task *t);

#endif

/* sync.h - a mutex and a condition variable on CLOCK_MONOTONIC, so timed
 * waits are immune to wall-clock jumps. */
#ifndef KVT_UTIL_SYNC_H
#define KVT_UTIL_SYNC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Initialises cond to time out against CLOCK_MONOTONIC. 0 or an errno. */
int kvt__cond_init(pthread_cond_t *cond);
/* Waits on cond until deadline_ns (monotonic). Returns false on timeout. */
bool kvt__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline_ns);

#endif

#include "util/sync.h"

#include <errno.h>
#include "util/clock.h"

int kvt__cond_init(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}

bool kvt__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline_ns)
{
    struct timespec ts = kvt__ns_to_timespec(deadline_ns);
    return pthread_cond_timedwait(cond, mu, &ts) != ETIMEDOUT;
}

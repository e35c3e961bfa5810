/* service.c - each endpoint's service thread: every tick (<= 10 ms) it
 * accepts pending connections (senders) and fails rooms whose state
 * deadline passed, telling their peers; rooms nobody claimed are dropped a
 * while after they failed (no engine will ever clear them). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "pd/ep.h"
#include "util/clock.h"
#include "util/err.h"

#define TICK_MS 10

static void reap(pd_ep *ep, uint64_t now)
{
    for (uint32_t b = 0; b < PD_ROOM_BUCKETS; b++) {
        pd_room *r = ep->buckets[b];
        while (r) {
            pd_room *n = r->next;
            if (!pd_room_terminal(r) && now > r->deadline_ns) {
                pd_room_fail(ep, r, KVT_ETIMEDOUT, "deadline passed in %s", kvt_pd_poll_name(r->state));
                pd_room_notify(ep, r, UINT32_MAX);
            } else if (!r->claimed && ep->role == PD_ROLE_PREFILL && r->state == KVT_PD_FAILED &&
                       now - r->failed_ns > (uint64_t)ep->t_boot * 1000000ull) {
                pd_room_remove(ep, r);
            }
            r = n;
        }
    }
}

typedef struct svc_arg {
    pd_ep *ep;
    pd_tick_fn tick;
} svc_arg;

static void *svc_main(void *arg)
{
    svc_arg a = *(svc_arg *)arg;
    free(arg);
    while (!atomic_load(&a.ep->stop)) {
        if (a.tick) a.tick(a.ep);
        else {
            struct timespec ts = {0, TICK_MS * 1000000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&a.ep->mu);
        reap(a.ep, kvt__now_ns());
        pthread_mutex_unlock(&a.ep->mu);
    }
    return NULL;
}

kvt_status pd_ep_start_service_tick(pd_ep *ep, pd_tick_fn tick)
{
    svc_arg *a = malloc(sizeof *a);
    if (!a) return kvt__fail(KVT_ENOMEM, "pd: out of memory");
    *a = (svc_arg){ep, tick};
    if (pthread_create(&ep->svc, NULL, svc_main, a) != 0) {
        free(a);
        return kvt__fail(KVT_ESYS, "pd: cannot start the service thread");
    }
    ep->svc_started = true;
    return KVT_OK;
}

void pd_ep_stop(pd_ep *ep)
{
    atomic_store(&ep->stop, true);
    if (ep->svc_started) pthread_join(ep->svc, NULL);
    ep->svc_started = false;
    for (uint32_t i = 0; i < ep->nconns; i++) {
        char b = 1;
        ssize_t w = write(ep->conns[i]->wake[1], &b, 1);
        (void)w;
    }
    for (uint32_t i = 0; i < ep->nconns; i++) {
        pd_conn *c = ep->conns[i];
        if (c->started) pthread_join(c->th, NULL);
        c->started = false;
    }
}

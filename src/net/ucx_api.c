/* ucx_api.c - resolving UCX at run time (see ucx_api.h for why). */
#include "net/ucx_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "util/err.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static kvt_ucx_api api;
static kvt_status load_status = KVT_EUNSUPPORTED;
static char load_error[256];

/* Resolves name from lib into *slot; false (with the error kept) if absent. */
static bool resolve(void *lib, const char *name, void *slot)
{
    void *sym = dlsym(lib, name);
    if (!sym) {
        snprintf(load_error, sizeof load_error, "%s is missing: %s", name, dlerror());
        return false;
    }
    memcpy(slot, &sym, sizeof sym);
    return true;
}

static void load(void)
{
    void *ucs = dlopen("libucs.so.0", RTLD_NOW | RTLD_GLOBAL);
    void *ucp = ucs ? dlopen("libucp.so.0", RTLD_NOW | RTLD_GLOBAL) : NULL;
    if (!ucp) {
        snprintf(load_error, sizeof load_error, "cannot load UCX (libucp.so.0): %s; install "
                 "libucx0 (Debian: apt-get install libucx0)", dlerror());
        return;
    }
#define KVT_UCX_SYM_(lib, field, name) \
    if (!resolve(lib, name, &api.field)) return;
    KVT_UCX_SYM_(ucp, config_read, "ucp_config_read")
    KVT_UCX_SYM_(ucp, config_release, "ucp_config_release")
    KVT_UCX_SYM_(ucp, init_version, "ucp_init_version")
    KVT_UCX_SYM_(ucp, cleanup, "ucp_cleanup")
    KVT_UCX_SYM_(ucp, worker_create, "ucp_worker_create")
    KVT_UCX_SYM_(ucp, worker_destroy, "ucp_worker_destroy")
    KVT_UCX_SYM_(ucp, worker_get_address, "ucp_worker_get_address")
    KVT_UCX_SYM_(ucp, worker_release_address, "ucp_worker_release_address")
    KVT_UCX_SYM_(ucp, worker_progress, "ucp_worker_progress")
    KVT_UCX_SYM_(ucp, worker_get_efd, "ucp_worker_get_efd")
    KVT_UCX_SYM_(ucp, worker_arm, "ucp_worker_arm")
    KVT_UCX_SYM_(ucp, ep_create, "ucp_ep_create")
    KVT_UCX_SYM_(ucp, ep_close_nbx, "ucp_ep_close_nbx")
    KVT_UCX_SYM_(ucp, ep_flush_nbx, "ucp_ep_flush_nbx")
    KVT_UCX_SYM_(ucp, tag_send_nbx, "ucp_tag_send_nbx")
    KVT_UCX_SYM_(ucp, tag_msg_recv_nbx, "ucp_tag_msg_recv_nbx")
    KVT_UCX_SYM_(ucp, tag_recv_nbx, "ucp_tag_recv_nbx")
    KVT_UCX_SYM_(ucp, tag_probe_nb, "ucp_tag_probe_nb")
    KVT_UCX_SYM_(ucp, request_check_status, "ucp_request_check_status")
    KVT_UCX_SYM_(ucp, request_free, "ucp_request_free")
    KVT_UCX_SYM_(ucp, request_cancel, "ucp_request_cancel")
    KVT_UCX_SYM_(ucs, status_string, "ucs_status_string")
#undef KVT_UCX_SYM_
    load_status = KVT_OK;
}

kvt_status kvt__ucx_api(const kvt_ucx_api **out)
{
    pthread_once(&once, load);
    if (load_status != KVT_OK) return kvt__fail(load_status, "UCX transport: %s", load_error);
    *out = &api;
    return KVT_OK;
}

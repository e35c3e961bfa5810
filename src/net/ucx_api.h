/* ucx_api.h - UCX, loaded only when a UCX stream is asked for.
 *
 * libkvtier does not link UCX: loading libucp installs UCX's memory hooks
 * (libucm patches mmap/madvise in the whole process), which an engine that
 * never uses the UCX transport must not get, and which crash ThreadSanitizer.
 * The first UCX stream dlopen()s libucp.so.0 and libucs.so.0 and resolves the
 * few functions kvtier calls into this table. */
#ifndef KVT_NET_UCX_API_H
#define KVT_NET_UCX_API_H

#include <ucp/api/ucp.h>
#include "kvtier.h"

typedef struct kvt_ucx_api {
    ucs_status_t (*config_read)(const char *, const char *, ucp_config_t **);
    void (*config_release)(ucp_config_t *);
    ucs_status_t (*init_version)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *,
                                 ucp_context_h *);
    void (*cleanup)(ucp_context_h);
    ucs_status_t (*worker_create)(ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *);
    void (*worker_destroy)(ucp_worker_h);
    ucs_status_t (*worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
    void (*worker_release_address)(ucp_worker_h, ucp_address_t *);
    unsigned (*worker_progress)(ucp_worker_h);
    ucs_status_t (*worker_get_efd)(ucp_worker_h, int *);
    ucs_status_t (*worker_arm)(ucp_worker_h);
    ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
    ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
    ucs_status_ptr_t (*ep_flush_nbx)(ucp_ep_h, const ucp_request_param_t *);
    ucs_status_ptr_t (*tag_send_nbx)(ucp_ep_h, const void *, size_t, ucp_tag_t,
                                     const ucp_request_param_t *);
    ucs_status_ptr_t (*tag_msg_recv_nbx)(ucp_worker_h, void *, size_t, ucp_tag_message_h,
                                         const ucp_request_param_t *);
    ucs_status_ptr_t (*tag_recv_nbx)(ucp_worker_h, void *, size_t, ucp_tag_t, ucp_tag_t,
                                     const ucp_request_param_t *); /* the bench's raw stream */
    ucp_tag_message_h (*tag_probe_nb)(ucp_worker_h, ucp_tag_t, ucp_tag_t, int,
                                      ucp_tag_recv_info_t *);
    ucs_status_t (*request_check_status)(void *);
    void (*request_free)(void *);
    void (*request_cancel)(ucp_worker_h, void *);
    const char *(*status_string)(ucs_status_t);
} kvt_ucx_api;

/* The table, loading UCX on first use (thread-safe). KVT_EUNSUPPORTED with
 * a message naming the library and dlerror() when UCX is not installed. */
kvt_status kvt__ucx_api(const kvt_ucx_api **out);

#endif

/* err.h - setting and reading the thread's last-error message.
 * "Log once, where the error is first decided": the function that detects a
 * problem calls kvt__fail() with the context; callers pass the status up. */
#ifndef KVT_UTIL_ERR_H
#define KVT_UTIL_ERR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvtier.h"

#define KVT_ERRMSG_MAX 512

/* Records "fmt..." as the calling thread's last error and returns status. */
kvt_status kvt__fail(kvt_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
kvt_status kvt__vfail(kvt_status status, const char *fmt, va_list ap);
/* Clears the thread's message (called on entry to public functions that
 * succeed, so a stale message is never mistaken for a new one). */
void kvt__clear_error(void);
/* Prefixes the thread's message with "prefix: " (so an error found by an
 * inner call names the public function the user called); returns status. */
kvt_status kvt__wrap_error(kvt_status status, const char *prefix);

/* Whether a status read from a peer's bytes is KVT_OK or one of the
 * library's codes (KVT_EVERSION is the lowest): checked before a peer's
 * status reaches a room, a group or the engine. */
static inline bool kvt__status_known(int64_t status)
{
    return status <= 0 && status >= KVT_EVERSION;
}

/* A failure status a peer sent, as a kvt_status: anything that is not one
 * of the library's failure codes (0, positive, unknown) reads as
 * KVT_EPROTO. 64-bit, so a negated INT32_MIN from the wire fits. */
static inline kvt_status kvt__peer_failure(int64_t status)
{
    return status != 0 && kvt__status_known(status) ? (kvt_status)status : KVT_EPROTO;
}

/* Common argument checks: each returns KVT_EINVAL with a message naming the
 * function and the argument. */
#define KVT_CHECK_ARG(cond, ...)                                 \
    do {                                                         \
        if (!(cond)) return kvt__fail(KVT_EINVAL, __VA_ARGS__);  \
    } while (0)
#define KVT_CHECK_NOT_NULL(ptr, fn) \
    KVT_CHECK_ARG((ptr) != NULL, "%s: %s is NULL", fn, #ptr)
/* The same, naming the argument as the public header does when the
 * parameter's local name is shorter. */
#define KVT_CHECK_NOT_NULL_AS(ptr, name, fn) \
    KVT_CHECK_ARG((ptr) != NULL, "%s: %s is NULL", fn, name)

#endif

/* vec.h - growing an array by doubling: the one implementation behind the
 * library's growable arrays (connector vectors, iovec lists, receive
 * buffers) and the CLI's. */
#ifndef KVT_UTIL_VEC_H
#define KVT_UTIL_VEC_H

#include <stddef.h>
#include <stdint.h>
#include "kvtier.h"

/* Makes the array *p of elem-byte elements hold at least need of them:
 * the capacity doubles from max(*cap, 16) until it does. KVT_OK, or
 * KVT_ENOMEM with the message "<what>: out of memory for N entries" (the
 * capacity would overflow, or realloc failed); on failure *p and *cap are
 * unchanged. */
kvt_status kvt__grow(void **p, size_t *cap, size_t need, size_t elem, const char *what);
/* The same for a uint32_t capacity (never doubled past UINT32_MAX). */
kvt_status kvt__grow32(void **p, uint32_t *cap, uint32_t need, size_t elem, const char *what);

#endif

/* vec.c - see vec.h. */
#include "util/vec.h"

#include <stdlib.h>
#include "util/err.h"

#define FIRST_CAP 16

static kvt_status grow(void **p, size_t *cap, size_t need, size_t elem, size_t limit,
                       const char *what)
{
    if (need <= *cap) return KVT_OK;
    size_t c = *cap > FIRST_CAP ? *cap : FIRST_CAP;
    while (c < need) c = c > limit / 2 ? limit : c * 2;
    if (need > limit || (elem && c > SIZE_MAX / elem))
        return kvt__fail(KVT_ENOMEM, "%s: out of memory for %zu entries", what, need);
    void *q = realloc(*p, c * elem);
    if (!q) return kvt__fail(KVT_ENOMEM, "%s: out of memory for %zu entries", what, c);
    *p = q;
    *cap = c;
    return KVT_OK;
}

kvt_status kvt__grow(void **p, size_t *cap, size_t need, size_t elem, const char *what)
{
    return grow(p, cap, need, elem, SIZE_MAX, what);
}

kvt_status kvt__grow32(void **p, uint32_t *cap, uint32_t need, size_t elem, const char *what)
{
    size_t c = *cap;
    kvt_status st = grow(p, &c, need, elem, UINT32_MAX, what);
    if (st == KVT_OK) *cap = (uint32_t)c;
    return st;
}

/* copy.c - kvt__copy_stream's dispatch (the AVX2 body is in hash_avx2.c,
 * the one file built for AVX2). */
#include "util/copy.h"

#include <stdatomic.h>
#include <string.h>
#include "util/hash.h"

void kvt__copy_stream(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (kvt__hash_avx2()) {
        kvt__copy_stream_avx2(dst, src, len);
        return;
    }
#endif
    memcpy(dst, src, len);
}

void kvt__copy_stream_fence(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_ia32_sfence(); /* streaming stores are weakly ordered */
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}

/* support.h - helpers shared by the unit tests (cmocka). */
#ifndef KVT_TESTS_SUPPORT_H
#define KVT_TESTS_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "kvtier.h"

/* Asserts a kvtier call returned want, printing kvt_last_error() if not. */
#define assert_status(call, want)                                                   \
    do {                                                                            \
        kvt_status st_ = (call);                                                    \
        if (st_ != (want))                                                          \
            fail_msg("%s returned %s (%s), want %s", #call, kvt_status_name(st_),   \
                     kvt_last_error(), kvt_status_name(want));                      \
    } while (0)
#define assert_ok(call) assert_status(call, KVT_OK)

/* A small uniform geometry: layers x (K,V) x heads x head_dim, 2-byte elems. */
kvt_geometry *kvt_test_geometry(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                uint32_t tokens_per_page, kvt_layout layout);
/* Deterministic token ids: tokens[i] = f(seed, i). */
void kvt_test_tokens(uint32_t *tokens, uint32_t n, uint64_t seed);

/* Scratch directories a test program made (at most 64 are tracked): when
 * every test passed, kvt_test_dirs_done removes them; when one failed it
 * keeps them for the post-mortem and names them on stderr. Call it last in
 * main with the result of cmocka_run_group_tests; returns rc. Only the
 * process that first tracked a directory removes anything (forked children
 * never do). */
void kvt_test_dir_track(const char *path);
int kvt_test_dirs_done(int rc);

#endif

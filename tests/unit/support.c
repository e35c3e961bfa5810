#include "support.h"

#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/hash.h"

kvt_geometry *kvt_test_geometry(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                uint32_t tokens_per_page, kvt_layout layout)
{
    kvt_geometry *g = NULL;
    if (kvt_geometry_create(&g, layers, tokens_per_page, layout) != KVT_OK) return NULL;
    kvt_layer_spec s = {.num_components = 2,
                        .component = {{heads, head_dim, 2}, {heads, head_dim, 2}}};
    if (kvt_geometry_set_layers(g, 0, layers, &s) != KVT_OK) {
        kvt_geometry_destroy(g);
        return NULL;
    }
    return g;
}

void kvt_test_tokens(uint32_t *tokens, uint32_t n, uint64_t seed)
{
    uint64_t st = seed;
    for (uint32_t i = 0; i < n; i++) tokens[i] = (uint32_t)(kvt__splitmix64(&st) % 128000);
}

int kvt_test_soft_failures;

void kvt_test_check_err(const char *expr, const char *file, int line, kvt_status got,
                        kvt_status want, const char *const *needles)
{
    const char *msg = kvt_last_error();
    if (got != want) {
        print_error("%s:%d: %s returned %s (\"%s\"), want %s\n", file, line, expr,
                    kvt_status_name(got), msg, kvt_status_name(want));
        kvt_test_soft_failures++;
        return;
    }
    if (msg == NULL || msg[0] == '\0') {
        print_error("%s:%d: %s: kvt_last_error() is empty\n", file, line, expr);
        kvt_test_soft_failures++;
        return;
    }
    for (const char *const *n = needles; *n; n++) {
        if (!strstr(msg, *n)) {
            print_error("%s:%d: %s: message \"%s\" lacks \"%s\"\n", file, line, expr, msg, *n);
            kvt_test_soft_failures++;
        }
    }
}

#define KVT_TEST_MAX_DIRS 64
static char g_dirs[KVT_TEST_MAX_DIRS][256];
static int g_ndirs;
static pid_t g_dirs_owner;

void kvt_test_dir_track(const char *path)
{
    if (!g_dirs_owner) g_dirs_owner = getpid();
    if (getpid() != g_dirs_owner || g_ndirs == KVT_TEST_MAX_DIRS) return; /* kept */
    snprintf(g_dirs[g_ndirs++], sizeof g_dirs[0], "%s", path);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

int kvt_test_dirs_done(int rc)
{
    if (getpid() != g_dirs_owner) return rc;
    for (int i = 0; i < g_ndirs; i++) {
        if (rc == 0)
            nftw(g_dirs[i], rm_one, 16, FTW_DEPTH | FTW_PHYS);
        else
            fprintf(stderr, "a test failed: its scratch directory is kept: %s\n", g_dirs[i]);
    }
    return rc;
}

/* Crash safety of the SSD tier through the public API: a child process
 * stores requests under load, flushing after each and reporting the request
 * durable over a pipe; the parent SIGKILLs it at a random moment, reopens
 * the cache on the same directory and checks that every request reported
 * durable before the kill is found whole and that every loaded byte is
 * right. 24 rounds, alternating the io backends. */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support.h"
#include "util/hash.h"

#define ROUNDS 24
#define BT 8
#define TOKENS 41 /* 5 full blocks + 1; blocks 0-1 shared by every request */
#define WAIT_MS 20000
#define MAX_REQ 100000
#define READY UINT32_MAX /* sent by the child once its cache is open */

static char dir[256];

static kvt_geometry *geo(void) { return kvt_test_geometry(2, 2, 16, 4, KVT_LAYOUT_LAYER_FIRST); }

static void request_tokens(uint32_t i, uint32_t *tokens)
{
    kvt_test_tokens(tokens, 16, 7);             /* the shared prefix */
    kvt_test_tokens(tokens + 16, TOKENS - 16, 1000 + i);
}

static kvt_status open_cache(kvt_cache **cache, kvt_config **cfg, kvt_geometry *g, const char *io)
{
    kvt_status st = kvt_config_create(cfg);
    if (!st) st = kvt_config_set(*cfg, "cpu_capacity", "256KiB");
    if (!st) st = kvt_config_set(*cfg, "ssd_capacity", "96MiB");
    if (!st) st = kvt_config_set(*cfg, "ssd_dirs", dir);
    if (!st) st = kvt_config_set(*cfg, "io", io);
    if (!st) st = kvt_config_set(*cfg, "block_tokens", "8");
    if (!st) st = kvt_config_set(*cfg, "huge_pages", "false");
    if (!st) st = kvt_cache_create(cache, *cfg, g);
    return st;
}

/* The child: store request i, flush, report i; repeat until killed (or a
 * bound of 10 s, so a parent that dies cannot leave it running). */
static void child(int fd, uint32_t first, const char *io)
{
    kvt_geometry *g = geo();
    kvt_config *cfg = NULL;
    kvt_cache *cache = NULL;
    kvt_emu *emu = NULL;
    kvt_engine_memory mem;
    if (open_cache(&cache, &cfg, g, io) || kvt_emu_create(&emu, g, 64) ||
        kvt_emu_memory(emu, &mem) || kvt_cache_register_memory(cache, &mem)) {
        fprintf(stderr, "child: %s\n", kvt_last_error());
        _exit(3);
    }
    uint32_t tokens[TOKENS], pages[16];
    for (uint32_t p = 0; p < 16; p++) pages[p] = p;
    uint32_t ready = READY; /* the parent's kill timer starts now, not at fork */
    if (write(fd, &ready, sizeof ready) != sizeof ready) _exit(7);
    time_t start = time(NULL);
    for (uint32_t i = first; i < MAX_REQ && time(NULL) - start < 10; i++) {
        request_tokens(i, tokens);
        kvt_request r = {.tokens = tokens, .num_tokens = TOKENS};
        kvt_emu_fill(emu, &r, 0, TOKENS, pages, 16);
        kvt_store_plan plan;
        kvt_task_result res;
        if (kvt_cache_prepare_store(cache, &r, &plan)) _exit(4);
        if (plan.task && (kvt_cache_launch(cache, plan.task, pages, 16) ||
                          kvt_cache_wait(cache, plan.task, WAIT_MS, &res) || res.status))
            _exit(5);
        if (kvt_cache_flush(cache, WAIT_MS)) _exit(6);
        if (write(fd, &i, sizeof i) != sizeof i) _exit(7);
    }
    _exit(0);
}

/* Reopens the directory; checks requests [0, durable) load whole and right,
 * and that whatever else is found is right too. */
static void verify(uint32_t durable, uint32_t attempted, const char *io)
{
    kvt_geometry *g = geo();
    kvt_config *cfg = NULL;
    kvt_cache *cache = NULL;
    kvt_emu *emu = NULL;
    kvt_engine_memory mem;
    assert_ok(open_cache(&cache, &cfg, g, io));
    assert_ok(kvt_emu_create(&emu, g, 64));
    assert_ok(kvt_emu_memory(emu, &mem));
    assert_ok(kvt_cache_register_memory(cache, &mem));
    uint32_t tokens[TOKENS], pages[16];
    for (uint32_t p = 0; p < 16; p++) pages[p] = 20 + p;
    for (uint32_t i = 0; i < attempted; i++) {
        request_tokens(i, tokens);
        kvt_request r = {.tokens = tokens, .num_tokens = TOKENS};
        assert_ok(kvt_emu_poison(emu, pages, 16));
        kvt_match m;
        assert_ok(kvt_cache_lookup(cache, &r, &m));
        if (i < durable && m.matched_tokens != TOKENS - 1)
            fail_msg("request %u was reported durable but %u of %u tokens were found", i,
                     m.matched_tokens, TOKENS - 1);
        if (!m.task) continue;
        kvt_task_result res;
        assert_ok(kvt_cache_launch(cache, m.task, pages, 16));
        assert_ok(kvt_cache_wait(cache, m.task, WAIT_MS, &res));
        if (i < durable) assert_int_equal(res.status, KVT_OK);
        kvt_verify_result v;
        uint32_t landed = res.status == KVT_OK || res.status == KVT_ECORRUPT ? res.num_tokens : 0;
        assert_ok(kvt_emu_verify(emu, &r, 0, landed, pages, 16, &v));
        if (v.mismatches) fail_msg("request %u: %llu wrong bytes at token %u", i,
                                   (unsigned long long)v.mismatches, v.first_bad_token);
    }
    kvt_cache_destroy(cache);
    kvt_emu_destroy(emu);
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(g);
}

static void test_conc_sigkill_rounds(void **state)
{
    (void)state;
    const char *base = getenv("KVTIER_TEST_TMP");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", base && *base ? base : "/tmp");
    assert_int_equal(system(cmd), 0);
    snprintf(dir, sizeof dir, "%s/crash-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(dir));
    uint64_t rng = 20261129;
    uint32_t durable = 0, attempted = 0;
    for (int round = 0; round < ROUNDS; round++) {
        const char *io = round % 2 ? "uring" : "threads";
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = kvt_test_fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            child(fds[1], durable, io);
        }
        close(fds[1]);
        /* Opening the cache takes long under sanitizers: wait (bounded) for
         * the child to be storing, then kill it at a random moment 5..200 ms
         * in, mid-store or mid-flush. */
        uint32_t first = 0;
        struct pollfd pfd = {fds[0], POLLIN, 0};
        if (poll(&pfd, 1, 60000) != 1 || read(fds[0], &first, sizeof first) != sizeof first ||
            first != READY)
            fail_msg("round %d: the child did not open the cache within 60 s", round);
        usleep((useconds_t)(5000 + kvt__splitmix64(&rng) % 195000));
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) && WEXITSTATUS(status) != 0)
            fail_msg("round %d: the child failed on its own (exit %d)", round, WEXITSTATUS(status));
        uint32_t i;
        while (read(fds[0], &i, sizeof i) == sizeof i) durable = i + 1;
        close(fds[0]);
        /* The child may have been storing up to 2 past the last report. */
        attempted = durable + 2 > attempted ? durable + 2 : attempted;
        verify(durable, attempted, io);
    }
    print_message("crash rounds: %d, requests durable: %u\n", ROUNDS, durable);
    assert_true(durable > 0);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conc_sigkill_rounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_log.c - the one logger: a handler gets kvtier's lines at their
 * levels, the threshold filters them (set directly, from a config's
 * log_level, from KVTIER_LOG_LEVEL), the default destination is stderr,
 * and the library's former ad-hoc stderr writers go through it. */
#include "support.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "net/net.h"
#include "util/log.h"

typedef struct seen {
    int n;
    kvt_log_level level[8];
    char line[8][128];
} seen;

static void on_line(void *user, kvt_log_level level, const char *line)
{
    seen *s = user;
    if (s->n < 8) {
        s->level[s->n] = level;
        snprintf(s->line[s->n], sizeof s->line[0], "%s", line);
    }
    s->n++;
}

static int evaluated;
static int count_eval(void)
{
    return ++evaluated;
}

static void test_handler_levels(void **state)
{
    seen s = {0};
    assert_ok(kvt_set_log_handler(on_line, &s));
    assert_ok(kvt_set_log_level(KVT_LOG_INFO));
    kvt__log(KVT_LOG_ERROR, "e %d", 1);
    kvt__log(KVT_LOG_WARN, "w %s", "two");
    kvt__log(KVT_LOG_INFO, "i");
    kvt__log(KVT_LOG_DEBUG, "d (filtered)");
    assert_int_equal(s.n, 3);
    assert_int_equal(s.level[0], KVT_LOG_ERROR);
    assert_string_equal(s.line[0], "e 1");
    assert_int_equal(s.level[1], KVT_LOG_WARN);
    assert_string_equal(s.line[1], "w two");
    assert_int_equal(s.level[2], KVT_LOG_INFO);
    assert_string_equal(s.line[2], "i");
    assert_ok(kvt_set_log_handler(NULL, NULL));
    kvt__log(KVT_LOG_ERROR, "after the handler was removed");
    assert_int_equal(s.n, 3);
    assert_ok(kvt_set_log_level(KVT_LOG_WARN));
}

static void test_filtering(void **state)
{
    seen s = {0};
    assert_ok(kvt_set_log_handler(on_line, &s));
    assert_ok(kvt_set_log_level(KVT_LOG_ERROR));
    evaluated = 0;
    KVT_LOG(KVT_LOG_WARN, "not logged %d", count_eval());
    KVT_LOG(KVT_LOG_DEBUG, "not logged %d", count_eval());
    assert_int_equal(evaluated, 0); /* arguments are not evaluated below the threshold */
    assert_int_equal(s.n, 0);
    KVT_LOG(KVT_LOG_ERROR, "logged %d", count_eval());
    assert_int_equal(evaluated, 1);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.line[0], "logged 1");
    assert_ok(kvt_set_log_level(KVT_LOG_DEBUG));
    KVT_LOG(KVT_LOG_DEBUG, "debug now");
    assert_int_equal(s.n, 2);
    assert_status(kvt_set_log_level((kvt_log_level)4), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "kvt_set_log_level"));
    assert_status(kvt_set_log_level((kvt_log_level)-1), KVT_EINVAL);
    assert_ok(kvt_set_log_handler(NULL, NULL));
    assert_ok(kvt_set_log_level(KVT_LOG_WARN));
}

/* A cache's config log_level becomes the threshold. */
static void test_config_log_level(void **state)
{
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_ok(kvt_config_set(cfg, "cpu_capacity", "1MiB"));
    assert_ok(kvt_config_set(cfg, "log_level", "debug"));
    kvt_geometry *g = kvt_test_geometry(2, 2, 8, 16, KVT_LAYOUT_LAYER_FIRST);
    kvt_cache *c = NULL;
    assert_ok(kvt_set_log_level(KVT_LOG_ERROR));
    assert_false(kvt__log_on(KVT_LOG_DEBUG));
    assert_ok(kvt_cache_create(&c, cfg, g));
    assert_true(kvt__log_on(KVT_LOG_DEBUG));
    kvt_cache_destroy(c);
    assert_ok(kvt_config_set(cfg, "log_level", "error"));
    assert_ok(kvt_cache_create(&c, cfg, g));
    assert_false(kvt__log_on(KVT_LOG_WARN));
    assert_true(kvt__log_on(KVT_LOG_ERROR));
    kvt_cache_destroy(c);
    kvt_geometry_destroy(g);
    kvt_config_destroy(cfg);
    assert_ok(kvt_set_log_level(KVT_LOG_WARN));
}

/* The net layer's refusal lines (formerly written straight to stderr)
 * reach the handler, at warn. */
static void test_library_lines_use_it(void **state)
{
    seen s = {0};
    assert_ok(kvt_set_log_handler(on_line, &s));
    kvt__net_log("tcp hub: refused %s", "a stranger");
    assert_int_equal(s.n, 1);
    assert_int_equal(s.level[0], KVT_LOG_WARN);
    assert_string_equal(s.line[0], "tcp hub: refused a stranger");
    assert_ok(kvt_set_log_handler(NULL, NULL));
}

static void log_three(void)
{
    kvt__log(KVT_LOG_WARN, "a warning");
    kvt__log(KVT_LOG_INFO, "some info");
    kvt__log(KVT_LOG_DEBUG, "a detail");
}

/* Runs this program again as "test_log --child" with exactly the
 * environment env (NULL-terminated "NAME=value" entries) and its stderr in
 * a file; returns what it wrote there. The logger reads its environment
 * once, at its first line, so each case needs a fresh process. */
static char *in_child(char *const *env)
{
    static char out[4096];
    char path[] = "/tmp/kvt_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    pid_t pid = kvt_test_fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, 2);
        char *argv[] = {"test_log", "--child", NULL};
        execve("/proc/self/exe", argv, env);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ssize_t n = pread(fd, out, sizeof out - 1, 0);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    return out;
}

static void test_default_stderr(void **state)
{
    char *env[] = {"KVTIER_LOG_FORMAT=plain", NULL};
    char *out = in_child(env);
    assert_string_equal(out, "kvtier: warn: a warning\n");
}

static void test_env_level_and_destination(void **state)
{
    char *debug[] = {"KVTIER_LOG_LEVEL=debug", "KVTIER_LOG_FORMAT=plain", NULL};
    assert_string_equal(in_child(debug),
                        "kvtier: warn: a warning\nkvtier: info: some info\nkvtier: debug: a detail\n");
    char *off[] = {"KVTIER_LOG_LEVEL=debug", "KVTIER_LOG=off", NULL};
    assert_string_equal(in_child(off), "");
    char file[] = "/tmp/kvt_test_log_dest_XXXXXX";
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    char dest[64];
    snprintf(dest, sizeof dest, "KVTIER_LOG=%s", file);
    char *to_file[] = {dest, "KVTIER_LOG_LEVEL=info", "KVTIER_LOG_FORMAT=plain", NULL};
    assert_string_equal(in_child(to_file), "");
    char got[256] = "";
    ssize_t n = pread(fd, got, sizeof got - 1, 0);
    got[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(file);
    assert_string_equal(got, "kvtier: warn: a warning\nkvtier: info: some info\n");
    char *bad[] = {"KVTIER_LOG_LEVEL=loud", "KVTIER_LOG_FORMAT=plain", NULL};
    char *out = in_child(bad);
    assert_non_null(strstr(out, "KVTIER_LOG_LEVEL=\"loud\" is not error, warn, info or debug"));
    assert_non_null(strstr(out, "kvtier: warn: a warning\n"));
    assert_null(strstr(out, "some info"));
}

/* The default format stamps each line with an ISO-8601 UTC time to the
 * millisecond; json gives one object a line; an unknown format is named
 * and text is used. */
static void test_formats(void **state)
{
    (void)state;
    char *text[] = {NULL};
    char *out = in_child(text);
    /* 2026-12-04T17:20:01.123Z kvtier: warn: a warning */
    assert_int_equal(strlen(out), 24 + 1 + strlen("kvtier: warn: a warning\n"));
    assert_true(out[4] == '-' && out[7] == '-' && out[10] == 'T' && out[13] == ':' &&
                out[16] == ':' && out[19] == '.' && out[23] == 'Z' && out[24] == ' ');
    assert_string_equal(out + 25, "kvtier: warn: a warning\n");
    char *json[] = {"KVTIER_LOG_FORMAT=json", NULL};
    out = in_child(json);
    assert_non_null(strstr(out, "\",\"level\":\"warn\",\"pid\":"));
    assert_non_null(strstr(out, ",\"msg\":\"a warning\"}\n"));
    assert_true(strncmp(out, "{\"ts\":\"", 7) == 0);
    char *bad[] = {"KVTIER_LOG_FORMAT=xml", NULL};
    out = in_child(bad);
    assert_non_null(strstr(out, "KVTIER_LOG_FORMAT=\"xml\" is not text, json or plain"));
}

/* kvt__log_reopen (kvtier serve's SIGHUP): a log file renamed away, as
 * logrotate does, is let go and the path written anew. */
static void test_reopen(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvt_test_log_rot_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64], rotated[80], dest[80], got[512];
    snprintf(path, sizeof path, "%s/log", dir);
    snprintf(rotated, sizeof rotated, "%s/log.1", dir);
    snprintf(dest, sizeof dest, "KVTIER_LOG=%s", path);
    char rot[100];
    snprintf(rot, sizeof rot, "KVTIER_TEST_ROTATED=%s", rotated);
    char *env[] = {dest, "KVTIER_LOG_FORMAT=plain", rot, NULL};
    pid_t pid = kvt_test_fork();
    if (pid == 0) {
        char *argv[] = {"test_log", "--child-reopen", NULL};
        execve("/proc/self/exe", argv, env);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(rotated, "r");
    assert_non_null(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    fclose(f);
    assert_string_equal(got, "kvtier: warn: before the rotation\n");
    f = fopen(path, "r");
    assert_non_null(f);
    n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    fclose(f);
    assert_string_equal(got, "kvtier: warn: after the rotation\n");
    unlink(path);
    unlink(rotated);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0) {
        log_three();
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--child-reopen") == 0) {
        kvt__log(KVT_LOG_WARN, "before the rotation");
        const char *path = getenv("KVTIER_LOG"), *rotated = getenv("KVTIER_TEST_ROTATED");
        if (!path || !rotated || rename(path, rotated) != 0) return 3;
        kvt__log_reopen();
        kvt__log(KVT_LOG_WARN, "after the rotation");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_levels),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_reopen),
        cmocka_unit_test(test_filtering),
        cmocka_unit_test(test_config_log_level),
        cmocka_unit_test(test_library_lines_use_it),
        cmocka_unit_test(test_default_stderr),
        cmocka_unit_test(test_env_level_and_destination),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_config.c - the option table, set/get, JSON, file and environment. */
#include "support.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/config.h"
#include "util/parse.h"

/* Asserts the thread's last error contains text, printing it if not. */
#define assert_error_has(text)                                                  \
    do {                                                                        \
        if (!strstr(kvt_last_error(), (text)))                                  \
            fail_msg("last error \"%s\" lacks \"%s\"", kvt_last_error(), text); \
    } while (0)
#define assert_error_lacks(text)                                                \
    do {                                                                        \
        if (strstr(kvt_last_error(), (text)))                                   \
            fail_msg("last error \"%s\" has \"%s\"", kvt_last_error(), text);   \
    } while (0)

static kvt_config *new_config(void)
{
    kvt_config *cfg = NULL;
    assert_ok(kvt_config_create(&cfg));
    assert_non_null(cfg);
    return cfg;
}

static void assert_value(const kvt_config *cfg, const char *name, const char *want)
{
    char buf[64];
    assert_ok(kvt_config_get(cfg, name, buf, sizeof buf));
    assert_string_equal(buf, want);
}

/* set(name, value) succeeds and get(name) then reads want. */
static void assert_round_trip(kvt_config *cfg, const char *name, const char *value,
                              const char *want)
{
    assert_ok(kvt_config_set(cfg, name, value));
    assert_value(cfg, name, want);
}

/* set(name, value) fails with KVT_EINVAL, names the option and the value
 * (and has msg, if not NULL), and leaves the option's value as it was. */
static void assert_rejected_msg(kvt_config *cfg, const char *name, const char *value,
                                const char *msg)
{
    char before[64], quoted[96];
    assert_ok(kvt_config_get(cfg, name, before, sizeof before));
    assert_status(kvt_config_set(cfg, name, value), KVT_EINVAL);
    snprintf(quoted, sizeof quoted, "option \"%s\"", name);
    assert_error_has(quoted);
    snprintf(quoted, sizeof quoted, "\"%s\"", value);
    assert_error_has(quoted);
    assert_error_has("kvt_config_set");
    if (msg) assert_error_has(msg);
    assert_value(cfg, name, before);
}
#define assert_rejected(cfg, name, value) assert_rejected_msg(cfg, name, value, NULL)

/* ------------------------------------------------------------------ */

static void test_defaults(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_value(cfg, "cpu_capacity", "1073741824");
    assert_value(cfg, "block_tokens", "16");
    assert_value(cfg, "workers", "2");
    assert_value(cfg, "max_tasks", "4096");
    assert_value(cfg, "plan_ttl_ms", "30000");
    assert_value(cfg, "eviction", "lru");
    assert_value(cfg, "huge_pages", "true");
    assert_value(cfg, "log_level", "warn");
    assert_value(cfg, "ssd_dirs", "");
    assert_value(cfg, "ssd_capacity", "17179869184");
    assert_value(cfg, "ssd_fresh", "false");
    assert_value(cfg, "io", "auto");
    assert_value(cfg, "ssd_queue_depth", "64");

    const kvt_config_values *v = kvt__config_values(cfg);
    assert_int_equal(v->cpu_capacity, 1ull << 30);
    assert_int_equal(v->block_tokens, 16);
    assert_int_equal(v->workers, 2);
    assert_int_equal(v->max_tasks, 4096);
    assert_int_equal(v->plan_ttl_ms, 30000);
    assert_int_equal(v->eviction, 0);
    assert_true(v->huge_pages);
    assert_int_equal(v->log_level, 1);
    assert_string_equal(v->ssd_dirs, "");
    assert_int_equal(v->ssd_capacity, 16ull << 30);
    assert_false(v->ssd_fresh);
    assert_int_equal(v->io, 0);
    assert_int_equal(v->ssd_queue_depth, 64);
    kvt_config_destroy(cfg);
}

static void test_option_table(void **state)
{
    (void)state;
    size_t n = kvt_config_option_count();
    assert_true(n >= 13); /* later issues add options */
    kvt_config *cfg = new_config();
    for (size_t i = 0; i < n; i++) {
        kvt_option_info o;
        assert_ok(kvt_config_option(i, &o));
        assert_non_null(o.name);
        assert_true(o.name[0] != '\0');
        assert_non_null(o.help);
        assert_true(strlen(o.help) > 10);
        /* env = "KVTIER_" + upper-case name */
        char env[96];
        int k = snprintf(env, sizeof env, "KVTIER_");
        for (const char *p = o.name; *p; p++) env[k++] = (char)toupper((unsigned char)*p);
        env[k] = '\0';
        assert_string_equal(o.env, env);
        assert_true(strcmp(o.type, "size") == 0 || strcmp(o.type, "uint") == 0 ||
                    strcmp(o.type, "enum") == 0 || strcmp(o.type, "bool") == 0 ||
                    strcmp(o.type, "string") == 0);
        /* The default is a valid value, and it is what create set. */
        char got[4096], again[4096];
        assert_ok(kvt_config_get(cfg, o.name, got, sizeof got));
        assert_ok(kvt_config_set(cfg, o.name, o.default_value));
        assert_ok(kvt_config_get(cfg, o.name, again, sizeof again));
        assert_string_equal(got, again);
        /* Names are unique. */
        for (size_t j = 0; j < i; j++) {
            kvt_option_info p;
            assert_ok(kvt_config_option(j, &p));
            assert_string_not_equal(p.name, o.name);
        }
    }
    kvt_option_info o = {.name = "untouched"};
    assert_status(kvt_config_option(n, &o), KVT_EINVAL);
    char want[64];
    snprintf(want, sizeof want, "index %zu is out of range (%zu options)", n, n);
    assert_error_has(want);
    assert_string_equal(o.name, "untouched");
    assert_status(kvt_config_option(0, NULL), KVT_EINVAL);
    assert_error_has("kvt_config_option: out is NULL");
    kvt_config_destroy(cfg);
}

static void test_size(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_round_trip(cfg, "cpu_capacity", "2GiB", "2147483648");
    assert_round_trip(cfg, "cpu_capacity", "2G", "2147483648");
    assert_round_trip(cfg, "cpu_capacity", "2gib", "2147483648");
    assert_round_trip(cfg, "cpu_capacity", "64K", "65536");
    assert_round_trip(cfg, "cpu_capacity", "3MiB", "3145728");
    assert_round_trip(cfg, "cpu_capacity", "1.5GiB", "1610612736");
    assert_round_trip(cfg, "cpu_capacity", "1 GiB", "1073741824");
    assert_round_trip(cfg, "cpu_capacity", "5MB", "5000000");
    assert_round_trip(cfg, "cpu_capacity", "2TB", "2000000000000");
    assert_round_trip(cfg, "cpu_capacity", "123456789", "123456789");
    assert_round_trip(cfg, "cpu_capacity", "4096", "4096");    /* the minimum */
    assert_round_trip(cfg, "cpu_capacity", "4KiB", "4096");
    assert_round_trip(cfg, "cpu_capacity", "1024TiB", "1125899906842624"); /* the maximum */
    /* Exact bytes past 2^53 would not survive a double. */
    assert_round_trip(cfg, "cpu_capacity", "1125899906842623", "1125899906842623");
    assert_int_equal(kvt__config_values(cfg)->cpu_capacity, 1125899906842623ull);

    assert_rejected_msg(cfg, "cpu_capacity", "4095",
                        "out of range (must be 4096..1125899906842624 bytes)");
    assert_rejected(cfg, "cpu_capacity", "1025TiB");
    assert_rejected(cfg, "cpu_capacity", "0");
    assert_rejected(cfg, "cpu_capacity", "");
    assert_rejected_msg(cfg, "cpu_capacity", "12XB", "is not a size");
    assert_rejected(cfg, "cpu_capacity", "-1G");
    assert_rejected(cfg, "cpu_capacity", "0x100000");
    assert_rejected(cfg, "cpu_capacity", "1e9");
    assert_rejected(cfg, "cpu_capacity", "1G ");
    assert_rejected(cfg, "cpu_capacity", " 1G");
    assert_rejected(cfg, "cpu_capacity", "GiB");
    assert_rejected(cfg, "cpu_capacity", ".");
    assert_rejected(cfg, "cpu_capacity", "99999999999999999999");
    assert_rejected(cfg, "cpu_capacity", "17179869184TiB"); /* overflows 64 bits */
    kvt_config_destroy(cfg);
}

static void test_parse_size_exact(void **state)
{
    (void)state;
    uint64_t v = 0;
    assert_true(kvt__parse_size("18446744073709551615", &v));
    assert_true(v == UINT64_MAX);
    assert_false(kvt__parse_size("18446744073709551616", &v));
    assert_true(kvt__parse_size("9007199254740993", &v));
    assert_true(v == 9007199254740993ull);
    assert_true(kvt__parse_size("10000000000000000000", &v));
    assert_true(v == 10000000000000000000ull);
    assert_true(kvt__parse_size("16777215TiB", &v));
    assert_true(v == 16777215ull << 40);
    assert_false(kvt__parse_size("16777216TiB", &v));
    assert_true(kvt__parse_size(".5K", &v));
    assert_int_equal(v, 512);
    assert_true(kvt__parse_size("0.25MiB", &v));
    assert_int_equal(v, 262144);
    assert_false(kvt__parse_size("0x10", &v));
    assert_false(kvt__parse_size("1e3", &v));
    assert_false(kvt__parse_size("inf", &v));
    assert_false(kvt__parse_size("1.2.3", &v));
    assert_false(kvt__parse_size(NULL, &v));
}

static void test_uint(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_round_trip(cfg, "workers", "1", "1");
    assert_round_trip(cfg, "workers", "64", "64");
    assert_round_trip(cfg, "workers", "007", "7");
    assert_int_equal(kvt__config_values(cfg)->workers, 7);
    assert_rejected_msg(cfg, "workers", "65",
                        "kvt_config_set: option \"workers\": \"65\" is out of range (must be 1..64)");
    assert_rejected(cfg, "workers", "0");
    assert_rejected(cfg, "workers", "-1");
    assert_rejected(cfg, "workers", "+3");
    assert_rejected(cfg, "workers", " 3");
    assert_rejected(cfg, "workers", "3x");
    assert_rejected_msg(cfg, "workers", "two",
                        "is not an unsigned decimal integer (must be 1..64)");
    assert_rejected(cfg, "workers", "");
    assert_rejected(cfg, "workers", "4294967297"); /* would wrap to 1 in 32 bits */
    assert_rejected(cfg, "workers", "99999999999999999999999");

    assert_round_trip(cfg, "max_tasks", "16", "16");
    assert_round_trip(cfg, "max_tasks", "1048576", "1048576");
    assert_rejected(cfg, "max_tasks", "15");
    assert_rejected(cfg, "max_tasks", "1048577");
    assert_round_trip(cfg, "block_tokens", "256", "256");
    assert_rejected(cfg, "block_tokens", "0");
    assert_round_trip(cfg, "plan_ttl_ms", "86400000", "86400000");
    assert_rejected(cfg, "plan_ttl_ms", "86400001");
    assert_rejected(cfg, "plan_ttl_ms", "10s");
    kvt_config_destroy(cfg);
}

static void test_enum(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_round_trip(cfg, "eviction", "lfu", "lfu");
    assert_int_equal(kvt__config_values(cfg)->eviction, 1);
    assert_round_trip(cfg, "eviction", "LRU", "lru"); /* read back canonical */
    assert_int_equal(kvt__config_values(cfg)->eviction, 0);
    assert_rejected_msg(cfg, "eviction", "mru",
                        "kvt_config_set: option \"eviction\": \"mru\" is not one of lru, lfu");
    assert_rejected(cfg, "eviction", "");
    assert_rejected(cfg, "eviction", "lru ");
    assert_rejected(cfg, "eviction", "0");

    static const char *levels[] = {"error", "warn", "info", "debug"};
    for (uint32_t i = 0; i < 4; i++) {
        assert_round_trip(cfg, "log_level", levels[i], levels[i]);
        assert_int_equal(kvt__config_values(cfg)->log_level, i);
    }
    assert_rejected_msg(cfg, "log_level", "trace",
                        "is not one of error, warn, info, debug");
    kvt_config_destroy(cfg);
}

static void test_bool(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    static const char *no[] = {"false", "0", "no", "off", "FALSE", "Off"};
    static const char *yes[] = {"true", "1", "yes", "on", "TRUE", "Yes"};
    for (int i = 0; i < 6; i++) {
        assert_round_trip(cfg, "huge_pages", no[i], "false");
        assert_false(kvt__config_values(cfg)->huge_pages);
        assert_round_trip(cfg, "huge_pages", yes[i], "true");
        assert_true(kvt__config_values(cfg)->huge_pages);
    }
    assert_rejected_msg(cfg, "huge_pages", "maybe", "is not a boolean");
    assert_rejected(cfg, "huge_pages", "");
    assert_rejected(cfg, "huge_pages", "2");
    kvt_config_destroy(cfg);
}

static kvt_status load(kvt_config *cfg, const char *json);

static void test_string(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_round_trip(cfg, "ssd_dirs", "/mnt/nvme0/kv,/mnt/nvme1/kv", "/mnt/nvme0/kv,/mnt/nvme1/kv");
    assert_string_equal(kvt__config_values(cfg)->ssd_dirs, "/mnt/nvme0/kv,/mnt/nvme1/kv");
    assert_round_trip(cfg, "ssd_dirs", "", "");
    /* The field holds 1023 bytes and a NUL. */
    size_t cap = sizeof kvt__config_values(cfg)->ssd_dirs;
    char *s = malloc(cap + 1);
    assert_non_null(s);
    memset(s, 'd', cap);
    s[cap] = '\0';
    assert_status(kvt_config_set(cfg, "ssd_dirs", s), KVT_EINVAL);
    assert_error_has("option \"ssd_dirs\"");
    assert_error_has("is 1024 bytes long (at most 1023)");
    assert_value(cfg, "ssd_dirs", "");
    s[cap - 1] = '\0';
    assert_ok(kvt_config_set(cfg, "ssd_dirs", s));
    char *got = malloc(cap);
    assert_non_null(got);
    assert_ok(kvt_config_get(cfg, "ssd_dirs", got, cap));
    assert_string_equal(got, s);
    assert_status(kvt_config_get(cfg, "ssd_dirs", got, cap - 1), KVT_EINVAL);
    assert_error_has("needs 1024 bytes");
    free(got);
    free(s);
    /* JSON: strings only. */
    assert_ok(load(cfg, "{\"ssd_dirs\": \"/a\"}"));
    assert_value(cfg, "ssd_dirs", "/a");
    assert_status(load(cfg, "{\"ssd_dirs\": 5}"), KVT_EINVAL);
    assert_error_has("option \"ssd_dirs\" is a string, not a number");
    kvt_config_destroy(cfg);
}

static void test_ssd_options(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_round_trip(cfg, "io", "uring", "uring");
    assert_int_equal(kvt__config_values(cfg)->io, 1);
    assert_round_trip(cfg, "io", "threads", "threads");
    assert_int_equal(kvt__config_values(cfg)->io, 2);
    assert_rejected_msg(cfg, "io", "aio", "is not one of auto, uring, threads");
    assert_round_trip(cfg, "ssd_capacity", "2TiB", "2199023255552");
    assert_rejected(cfg, "ssd_capacity", "1K");
    assert_round_trip(cfg, "ssd_fresh", "yes", "true");
    assert_round_trip(cfg, "ssd_queue_depth", "4096", "4096");
    assert_rejected_msg(cfg, "ssd_queue_depth", "0", "must be 1..4096");
    kvt_config_destroy(cfg);
}

static void test_unknown_names(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    char buf[64];
    assert_status(kvt_config_set(cfg, "cpu_capacty", "1G"), KVT_EINVAL);
    assert_error_has("kvt_config_set: unknown option \"cpu_capacty\" (did you mean \"cpu_capacity\"?)");
    assert_status(kvt_config_set(cfg, "Workers", "3"), KVT_EINVAL);
    assert_error_has("did you mean \"workers\"?");
    assert_status(kvt_config_set(cfg, "evictoin", "lru"), KVT_EINVAL);
    assert_error_has("did you mean \"eviction\"?");
    assert_status(kvt_config_set(cfg, "zzzzzzzzzz", "3"), KVT_EINVAL);
    assert_error_has("unknown option \"zzzzzzzzzz\"");
    assert_error_lacks("did you mean");
    assert_status(kvt_config_set(cfg, "", "3"), KVT_EINVAL);
    assert_error_has("unknown option \"\"");
    char long_name[300];
    memset(long_name, 'w', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_status(kvt_config_set(cfg, long_name, "3"), KVT_EINVAL);
    assert_error_has("unknown option");
    assert_status(kvt_config_get(cfg, "wrokers", buf, sizeof buf), KVT_EINVAL);
    assert_error_has("kvt_config_get: unknown option \"wrokers\" (did you mean \"workers\"?)");
    assert_value(cfg, "workers", "2");
    kvt_config_destroy(cfg);
}

static void test_get_buffer(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    char buf[16];
    memset(buf, 'x', sizeof buf);
    /* "1073741824" needs 11 bytes. */
    assert_ok(kvt_config_get(cfg, "cpu_capacity", buf, 11));
    assert_string_equal(buf, "1073741824");
    memset(buf, 'x', sizeof buf);
    assert_status(kvt_config_get(cfg, "cpu_capacity", buf, 10), KVT_EINVAL);
    assert_error_has("buf_len is 10");
    assert_error_has("cpu_capacity");
    assert_error_has("needs 11 bytes");
    assert_int_equal(buf[0], 'x'); /* out-parameters untouched on failure */
    assert_status(kvt_config_get(cfg, "workers", buf, 0), KVT_EINVAL);
    assert_ok(kvt_config_get(cfg, "workers", buf, 2));
    assert_string_equal(buf, "2");
    kvt_config_destroy(cfg);
}

static void test_error_cleared_on_success(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_status(kvt_config_set(cfg, "workers", "0"), KVT_EINVAL);
    assert_true(kvt_last_error()[0] != '\0');
    assert_ok(kvt_config_set(cfg, "workers", "3"));
    assert_string_equal(kvt_last_error(), "");
    kvt_config_destroy(cfg);
}

/* ------------------------------------------------------------------ */
/* JSON                                                               */
/* ------------------------------------------------------------------ */

static kvt_status load(kvt_config *cfg, const char *json)
{
    return kvt_config_load_json(cfg, json, strlen(json));
}

static void test_json_good(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_ok(load(cfg, "{\"cpu_capacity\": \"2GiB\", \"workers\": 4, \"huge_pages\": false,\n"
                        " \"eviction\": \"lfu\", \"max_tasks\": \"1024\", \"log_level\": \"debug\","
                        " \"block_tokens\": 32, \"plan_ttl_ms\": 5000}"));
    assert_value(cfg, "cpu_capacity", "2147483648");
    assert_value(cfg, "workers", "4");
    assert_value(cfg, "huge_pages", "false");
    assert_value(cfg, "eviction", "lfu");
    assert_value(cfg, "max_tasks", "1024");
    assert_value(cfg, "log_level", "debug");
    assert_value(cfg, "block_tokens", "32");
    assert_value(cfg, "plan_ttl_ms", "5000");
    /* Sizes as numbers are bytes; booleans as strings; an empty object. */
    assert_ok(load(cfg, "{\"cpu_capacity\": 1048576, \"huge_pages\": \"on\"}"));
    assert_value(cfg, "cpu_capacity", "1048576");
    assert_value(cfg, "huge_pages", "true");
    assert_ok(load(cfg, "  {}  \n"));
    assert_ok(load(cfg, "{\"workers\": 5.0}")); /* an integral number */
    assert_value(cfg, "workers", "5");
    assert_ok(load(cfg, "{\"cpu_capacity\": 4.5e6}"));
    assert_value(cfg, "cpu_capacity", "4500000");
    /* len bounds the text: what follows is not read. */
    const char *text = "{\"workers\": 6}garbage";
    assert_ok(kvt_config_load_json(cfg, text, strlen("{\"workers\": 6}")));
    assert_value(cfg, "workers", "6");
    assert_string_equal(kvt_last_error(), "");
    kvt_config_destroy(cfg);
}

static void test_json_all_or_nothing(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_status(load(cfg, "{\"workers\": 8, \"cpu_capacity\": \"2G\", \"eviction\": \"mru\"}"),
                  KVT_EINVAL);
    assert_error_has("kvt_config_load_json: option \"eviction\": \"mru\" is not one of lru, lfu");
    assert_value(cfg, "workers", "2");
    assert_value(cfg, "cpu_capacity", "1073741824");
    assert_value(cfg, "eviction", "lru");
    /* An unknown key after good ones. */
    assert_status(load(cfg, "{\"workers\": 8, \"wrokers\": 9}"), KVT_EINVAL);
    assert_error_has("unknown option \"wrokers\" (did you mean \"workers\"?)");
    assert_value(cfg, "workers", "2");
    /* A key given twice is a mistake, not "last one wins". */
    assert_status(load(cfg, "{\"workers\": 8, \"workers\": 9}"), KVT_EINVAL);
    assert_error_has("option \"workers\" appears more than once");
    assert_value(cfg, "workers", "2");
    kvt_config_destroy(cfg);
}

static void test_json_not_object(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    static const char *bad[] = {"[1, 2]", "\"workers\"", "42", "true", "null", "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_status(load(cfg, bad[i]), KVT_EINVAL);
        assert_error_has("kvt_config_load_json: the JSON text must be an object");
    }
    kvt_config_destroy(cfg);
}

static void test_json_broken(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_status(load(cfg, "{\"workers\": 4,"), KVT_EINVAL);
    assert_error_has("kvt_config_load_json: invalid JSON at line 1");
    assert_status(load(cfg, "{\"workers\": 4,\n"), KVT_EINVAL);
    assert_error_has("invalid JSON at line 1, column 15 (byte 14, the end of the text)");
    assert_status(load(cfg, "{\n  \"workers\": 4,\n  \"eviction\" \"lru\"\n}"), KVT_EINVAL);
    assert_error_has("invalid JSON at line 3, column 14 (byte 31, near '\"lru\"')");
    assert_status(load(cfg, "{\"workers\": 4} x"), KVT_EINVAL);
    assert_error_has("unexpected text after the JSON value at line 1, column 16");
    assert_error_has("near 'x'");
    assert_status(load(cfg, "{} {}"), KVT_EINVAL);
    assert_error_has("unexpected text after the JSON value");
    assert_status(load(cfg, "{\"workers\": 4}\n\n\t}"), KVT_EINVAL);
    assert_error_has("at line 3, column 2");
    assert_status(load(cfg, "{'workers': 4}"), KVT_EINVAL);
    assert_error_has("invalid JSON");
    assert_status(kvt_config_load_json(cfg, "{}", 0), KVT_EINVAL);
    assert_error_has("empty");
    assert_status(load(cfg, "   "), KVT_EINVAL);
    assert_error_has("invalid JSON");
    /* A NUL inside the given length is not JSON whitespace. */
    assert_status(kvt_config_load_json(cfg, "{}\0", 3), KVT_EINVAL);
    assert_error_has("byte 2");
    /* A truncated buffer: len cuts the text short. */
    assert_status(kvt_config_load_json(cfg, "{\"workers\": 4}", 5), KVT_EINVAL);
    assert_error_has("invalid JSON");
    assert_value(cfg, "workers", "2");
    kvt_config_destroy(cfg);
}

/* Issue 14 item 10: cJSON keeps strings NUL-terminated, so a \u0000 (or a
 * raw NUL) inside a string used to be accepted and cut the value there. */
static void test_json_nul(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    static const char esc[] = "{\"ssd_dirs\": \"/tmp/a\\u0000/b\"}";
    assert_status(kvt_config_load_json(cfg, esc, sizeof esc - 1), KVT_EINVAL);
    assert_error_has("NUL character");
    assert_error_has("column 21");
    assert_value(cfg, "ssd_dirs", "");
    static const char raw[] = "{\"ssd_dirs\": \"/tmp/a\0/b\"}";
    assert_status(kvt_config_load_json(cfg, raw, sizeof raw - 1), KVT_EINVAL);
    assert_error_has("NUL character");
    /* An escaped backslash followed by "u0000" is plain text, not a NUL. */
    static const char text[] = "{\"ssd_dirs\": \"/tmp/a\\\\u0000\"}";
    assert_ok(kvt_config_load_json(cfg, text, sizeof text - 1));
    assert_value(cfg, "ssd_dirs", "/tmp/a\\u0000");
    static const char key[] = "{\"workers\\u0000x\": 3}";
    assert_status(kvt_config_load_json(cfg, key, sizeof key - 1), KVT_EINVAL);
    kvt_config_destroy(cfg);
}

/* Issue 14 item 7: rank-local options (declared in the option table) stay
 * out of the group's configuration digest, whatever their length (a value
 * over 256 bytes made it fail); a must-agree option changes it, and the
 * digests name the option that differs. */
static void test_digest(void **state)
{
    (void)state;
    kvt_config *a = new_config(), *b = new_config();
    uint64_t da, db;
    assert_ok(kvt_config_digest(a, &da));
    char dirs[1024];
    memset(dirs, 'd', sizeof dirs - 1);
    dirs[0] = '/';
    dirs[sizeof dirs - 1] = '\0';
    assert_ok(kvt_config_set(b, "ssd_dirs", dirs)); /* 1023 bytes: the most it takes */
    assert_ok(kvt_config_set(b, "workers", "7"));
    assert_ok(kvt_config_set(b, "huge_pages", "false"));
    assert_ok(kvt_config_set(b, "log_level", "debug"));
    assert_ok(kvt_config_set(b, "io", "threads"));
    assert_ok(kvt_config_set(b, "ssd_queue_depth", "8"));
    assert_ok(kvt_config_set(b, "ssd_fresh", "true"));
    assert_ok(kvt_config_digest(b, &db));
    assert_int_equal(da, db);
    static const char *const agree[][2] = {
        {"cpu_capacity", "2GiB"}, {"block_tokens", "32"}, {"max_tasks", "100"},
        {"plan_ttl_ms", "5000"}, {"eviction", "lfu"}, {"ssd_capacity", "1GiB"},
    };
    for (size_t i = 0; i < sizeof agree / sizeof agree[0]; i++) {
        kvt_config *c = new_config();
        assert_ok(kvt_config_set(c, agree[i][0], agree[i][1]));
        uint64_t dc;
        assert_ok(kvt_config_digest(c, &dc));
        assert_true(dc != da);
        char which[128], want[64];
        assert_int_equal(kvt__config_digest_diff(dc, da, which, sizeof which), 1);
        snprintf(want, sizeof want, "\"%s\"", agree[i][0]);
        assert_string_equal(which, want);
        kvt_config_destroy(c);
    }
    char which[8];
    assert_int_equal(kvt__config_digest_diff(da, da, which, sizeof which), 0);
    assert_string_equal(which, "");
    /* Issue 14 item 5: a difference that goes unnamed (the option's 5-bit
     * field collides, about 1 value in 32) is said to be one, in words,
     * never an empty name. */
    kvt_config *c = new_config();
    uint64_t dc = da;
    uint32_t v = 17;
    for (; v < 100000; v++) { /* a block_tokens whose field collides with 16's */
        char num[16];
        snprintf(num, sizeof num, "%u", v);
        assert_ok(kvt_config_set(c, "block_tokens", num));
        assert_ok(kvt_config_digest(c, &dc));
        if ((uint32_t)dc == (uint32_t)da) break;
    }
    assert_true(v < 100000 && dc != da);
    char told[256];
    assert_int_equal(kvt__config_digest_diff(dc, da, told, sizeof told), 0);
    if (!strstr(told, "an option the digest cannot tell") || !strstr(told, "one difference in 32") ||
        !strstr(told, "kvtier config --dump"))
        fail_msg("%s", told);
    kvt_config_destroy(c);
    kvt_config_destroy(a);
    kvt_config_destroy(b);
}

static void test_json_wrong_types(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    static const struct { const char *json, *msg; } cases[] = {
        {"{\"workers\": true}", "option \"workers\" is a uint, not a boolean"},
        {"{\"eviction\": 1}", "option \"eviction\" is an enum, not a number"},
        {"{\"huge_pages\": 1}", "option \"huge_pages\" is a bool, not a number"},
        {"{\"workers\": null}", "option \"workers\" is null"},
        {"{\"workers\": [1]}", "option \"workers\" is an array"},
        {"{\"workers\": {\"n\": 1}}", "option \"workers\" is an object"},
        {"{\"workers\": 2.5}", "option \"workers\": 2.5 is not a non-negative integer"},
        {"{\"workers\": -1}", "option \"workers\": -1 is not a non-negative integer"},
        {"{\"cpu_capacity\": 1e300}", "option \"cpu_capacity\""},
        {"{\"cpu_capacity\": 9007199254740994}", "up to 2^53"},
        {"{\"workers\": 65}", "option \"workers\": \"65\" is out of range"},
        {"{\"workers\": \"\"}", "option \"workers\": \"\" is not an unsigned"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_status(load(cfg, cases[i].json), KVT_EINVAL);
        assert_error_has(cases[i].msg);
        assert_error_has("kvt_config_load_json");
    }
    assert_value(cfg, "workers", "2");
    kvt_config_destroy(cfg);
}

/* ------------------------------------------------------------------ */
/* Files                                                              */
/* ------------------------------------------------------------------ */

static void tmp_path(char *buf, size_t len, const char *name)
{
    const char *dir = getenv("KVTIER_TEST_TMP");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700); /* ctest's scratch directory may not exist yet */
    snprintf(buf, len, "%s/test_config_%ld_%s", dir, (long)getpid(), name);
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_file(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    char path[512];
    tmp_path(path, sizeof path, "good.json");
    const char *good = "{\n  \"workers\": 3,\n  \"cpu_capacity\": \"256MiB\"\n}\n";
    write_file(path, good, strlen(good));
    assert_ok(kvt_config_load_file(cfg, path));
    assert_value(cfg, "workers", "3");
    assert_value(cfg, "cpu_capacity", "268435456");

    /* A bad value: the message names the file and the option. */
    const char *bad = "{\n  \"workers\": 1,\n  \"workers_x\": 3\n}\n";
    write_file(path, bad, strlen(bad));
    assert_status(kvt_config_load_file(cfg, path), KVT_EINVAL);
    assert_error_has(path);
    assert_error_has("unknown option \"workers_x\"");
    assert_value(cfg, "workers", "3");
    const char *broken = "{\n  \"workers\": 1\n  \"block_tokens\": 3\n}\n";
    write_file(path, broken, strlen(broken));
    assert_status(kvt_config_load_file(cfg, path), KVT_EINVAL);
    assert_error_has(path);
    assert_error_has("invalid JSON at line 3");
    unlink(path);

    /* Missing: names the path and the reason. */
    assert_status(kvt_config_load_file(cfg, path), KVT_ENOTFOUND);
    assert_error_has("kvt_config_load_file: cannot open");
    assert_error_has(path);
    assert_error_has("No such file or directory");

    /* A directory cannot be read as a file; a FIFO is refused at once, not
     * waited on for a writer (issue 14 item 10: open() blocked forever). */
    const char *dir = getenv("KVTIER_TEST_TMP");
    if (!dir || !*dir) dir = "/tmp";
    assert_status(kvt_config_load_file(cfg, dir), KVT_EINVAL);
    assert_error_has(dir);
    assert_error_has("is a directory, not a regular file");
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_status(kvt_config_load_file(cfg, path), KVT_EINVAL);
    assert_error_has("is a FIFO, not a regular file");
    unlink(path);

    /* Bounded: 1 MiB is the most read; exactly 1 MiB still loads. */
    size_t big = (1u << 20) + 1;
    char *text = malloc(big);
    assert_non_null(text);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 2] = '}';
    write_file(path, text, big);
    assert_status(kvt_config_load_file(cfg, path), KVT_EINVAL);
    assert_error_has("larger than 1048576 bytes");
    write_file(path, text, big - 1);
    assert_ok(kvt_config_load_file(cfg, path));
    free(text);
    unlink(path);

    /* An empty file. */
    write_file(path, "", 0);
    assert_status(kvt_config_load_file(cfg, path), KVT_EINVAL);
    assert_error_has("empty");
    unlink(path);
    kvt_config_destroy(cfg);
}

/* ------------------------------------------------------------------ */
/* Environment                                                        */
/* ------------------------------------------------------------------ */

static void test_env(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    assert_ok(kvt_config_load_env(cfg)); /* ctest sets KVTIER_TEST_TMP: allowed */
    assert_value(cfg, "workers", "2");

    setenv("KVTIER_WORKERS", "8", 1);
    setenv("KVTIER_EVICTION", "lfu", 1);
    setenv("KVTIER_CPU_CAPACITY", "512MiB", 1);
    setenv("KVTIER_HUGE_PAGES", "off", 1);
    setenv("KVTIER_IO", "threads", 1); /* an option (it was an allow-list entry) */
    setenv("KVTIER_LOG", "stderr", 1); /* not options, but known */
    setenv("KVTIER_TEST_TMP", "/tmp", 0);
    setenv("KVTIERX", "1", 1); /* not KVTIER_ */
    assert_ok(kvt_config_load_env(cfg));
    assert_value(cfg, "workers", "8");
    assert_value(cfg, "eviction", "lfu");
    assert_value(cfg, "cpu_capacity", "536870912");
    assert_value(cfg, "huge_pages", "false");
    assert_value(cfg, "io", "threads");
    assert_value(cfg, "max_tasks", "4096");

    /* A bad value names the variable and the option; nothing is applied. */
    kvt_config *fresh = new_config();
    setenv("KVTIER_MAX_TASKS", "1", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("kvt_config_load_env: KVTIER_MAX_TASKS: option \"max_tasks\": \"1\" is out of range");
    assert_value(fresh, "workers", "2");
    assert_value(fresh, "eviction", "lru");
    unsetenv("KVTIER_MAX_TASKS");

    /* An unknown KVTIER_ variable is a typo until proven otherwise. */
    setenv("KVTIER_FOO", "1", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("KVTIER_FOO is not a kvtier option");
    assert_value(fresh, "workers", "2");
    unsetenv("KVTIER_FOO");
    setenv("KVTIER_WOKRERS", "3", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("KVTIER_WOKRERS is not a kvtier option (did you mean KVTIER_WORKERS?)");
    unsetenv("KVTIER_WOKRERS");
    setenv("KVTIER_", "3", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("KVTIER_ is not a kvtier option");
    unsetenv("KVTIER_");
    /* Names are case-sensitive, like every environment variable. */
    setenv("KVTIER_workers", "3", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("KVTIER_workers");
    unsetenv("KVTIER_workers");
    /* Empty values are values, and must parse. */
    setenv("KVTIER_WORKERS", "", 1);
    assert_status(kvt_config_load_env(fresh), KVT_EINVAL);
    assert_error_has("KVTIER_WORKERS");

    unsetenv("KVTIER_WORKERS");
    unsetenv("KVTIER_EVICTION");
    unsetenv("KVTIER_CPU_CAPACITY");
    unsetenv("KVTIER_HUGE_PAGES");
    unsetenv("KVTIER_IO");
    unsetenv("KVTIER_LOG");
    unsetenv("KVTIERX");
    assert_ok(kvt_config_load_env(fresh));
    assert_value(fresh, "workers", "2");
    kvt_config_destroy(fresh);
    kvt_config_destroy(cfg);
}

/* ------------------------------------------------------------------ */
/* Arguments                                                          */
/* ------------------------------------------------------------------ */

static void test_null_args(void **state)
{
    (void)state;
    kvt_config *cfg = new_config();
    char buf[32];
    assert_status(kvt_config_create(NULL), KVT_EINVAL);
    assert_error_has("kvt_config_create: out is NULL");
    assert_status(kvt_config_set(NULL, "workers", "2"), KVT_EINVAL);
    assert_error_has("kvt_config_set: cfg is NULL");
    assert_status(kvt_config_set(cfg, NULL, "2"), KVT_EINVAL);
    assert_error_has("kvt_config_set: name is NULL");
    assert_status(kvt_config_set(cfg, "workers", NULL), KVT_EINVAL);
    assert_error_has("kvt_config_set: value is NULL");
    assert_status(kvt_config_get(NULL, "workers", buf, sizeof buf), KVT_EINVAL);
    assert_error_has("kvt_config_get: cfg is NULL");
    assert_status(kvt_config_get(cfg, NULL, buf, sizeof buf), KVT_EINVAL);
    assert_error_has("kvt_config_get: name is NULL");
    assert_status(kvt_config_get(cfg, "workers", NULL, sizeof buf), KVT_EINVAL);
    assert_error_has("kvt_config_get: buf is NULL");
    assert_status(kvt_config_load_json(NULL, "{}", 2), KVT_EINVAL);
    assert_error_has("kvt_config_load_json: cfg is NULL");
    assert_status(kvt_config_load_json(cfg, NULL, 2), KVT_EINVAL);
    assert_error_has("kvt_config_load_json: json is NULL");
    assert_status(kvt_config_load_file(NULL, "/tmp/x.json"), KVT_EINVAL);
    assert_error_has("kvt_config_load_file: cfg is NULL");
    assert_status(kvt_config_load_file(cfg, NULL), KVT_EINVAL);
    assert_error_has("kvt_config_load_file: path is NULL");
    assert_status(kvt_config_load_env(NULL), KVT_EINVAL);
    assert_error_has("kvt_config_load_env: cfg is NULL");
    assert_status(kvt_config_option(0, NULL), KVT_EINVAL);
    assert_error_has("kvt_config_option: out is NULL");
    kvt_config_destroy(NULL); /* no-op */
    kvt_config_destroy(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_json_nul),
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_option_table),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_parse_size_exact),
        cmocka_unit_test(test_uint),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_ssd_options),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_get_buffer),
        cmocka_unit_test(test_error_cleared_on_success),
        cmocka_unit_test(test_json_good),
        cmocka_unit_test(test_json_all_or_nothing),
        cmocka_unit_test(test_json_not_object),
        cmocka_unit_test(test_json_broken),
        cmocka_unit_test(test_json_wrong_types),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_null_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

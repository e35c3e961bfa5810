/* trace.c - the Mooncake JSONL trace reader (see trace.h). Input is
 * untrusted (a file from anywhere; tests/fuzz/fuzz_trace.c feeds it random
 * bytes): every field is type- and range-checked, every size is bounded
 * before it is multiplied, and every failure names the line. */
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <unistd.h>
#include "util/file.h"
#include "util/parse.h"

#define ID_NONE UINT32_MAX
#define MAX_JSON_ID 9007199254740992.0 /* 2^53: larger doubles are not exact integers */
#define TRACE_MAX_FILE (4ull << 30)    /* refuse files over 4 GiB up front */

/* Original id -> dense id, open addressing (load <= 1/2), and each dense
 * id's parent (the id before it in every request that holds it). */
typedef struct id_map {
    uint64_t *keys;
    uint32_t *vals;   /* ID_NONE: empty slot */
    uint64_t slots;   /* a power of two */
    uint32_t *parent; /* by dense id */
    uint32_t count, parent_cap;
} id_map;

typedef struct parser {
    trace t;
    id_map m;
    uint64_t req_cap, block_cap;
    uint64_t line;
    char *err;
    size_t err_len;
} parser;

static int trace_fail(parser *p, const char *fmt, ...)
{
    int n = snprintf(p->err, p->err_len, "line %llu: ", (unsigned long long)p->line);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->err_len) vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static bool map_grow(id_map *m)
{
    uint64_t slots = m->slots ? m->slots * 2 : 1024;
    uint64_t *keys = malloc(slots * sizeof *keys);
    uint32_t *vals = malloc(slots * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return false;
    }
    memset(vals, 0xff, slots * sizeof *vals);
    for (uint64_t i = 0; i < m->slots; i++) {
        if (m->vals[i] == ID_NONE) continue;
        uint64_t s = mix(m->keys[i]) & (slots - 1);
        while (vals[s] != ID_NONE) s = (s + 1) & (slots - 1);
        keys[s] = m->keys[i];
        vals[s] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->slots = slots;
    return true;
}

/* The dense id of key, adding it (with parent ID_NONE pending) if new.
 * *fresh says whether it was added. ID_NONE on allocation failure. */
static uint32_t map_get(id_map *m, uint64_t key, bool *fresh)
{
    if ((uint64_t)(m->count + 1) * 2 > m->slots && !map_grow(m)) return ID_NONE;
    uint64_t s = mix(key) & (m->slots - 1);
    while (m->vals[s] != ID_NONE) {
        if (m->keys[s] == key) {
            *fresh = false;
            return m->vals[s];
        }
        s = (s + 1) & (m->slots - 1);
    }
    if (m->count == m->parent_cap) {
        uint32_t cap = m->parent_cap ? m->parent_cap * 2 : 1024;
        uint32_t *par = realloc(m->parent, (size_t)cap * sizeof *par);
        if (!par) return ID_NONE;
        m->parent = par;
        m->parent_cap = cap;
    }
    m->keys[s] = key;
    m->vals[s] = m->count;
    *fresh = true;
    return m->count++;
}

static void map_free(id_map *m)
{
    free(m->keys);
    free(m->vals);
    free(m->parent);
    memset(m, 0, sizeof *m);
}

/* A non-negative integer JSON number no larger than max (exact in a double). */
static int get_uint(parser *p, const cJSON *obj, const char *name, double max, bool required,
                    uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!v) {
        *out = 0;
        return required ? trace_fail(p, "%s is missing", name) : 0;
    }
    if (!cJSON_IsNumber(v)) return trace_fail(p, "%s is not a number", name);
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d != floor(d) || d > max)
        return trace_fail(p, "%s is %g (want an integer in 0..%.0f)", name, d, max);
    *out = (uint64_t)d;
    return 0;
}

static int push_block(parser *p, uint32_t id)
{
    if (p->t.total_blocks == p->block_cap) {
        uint64_t cap = p->block_cap ? p->block_cap * 2 : 4096;
        uint32_t *b = realloc(p->t.blocks, cap * sizeof *b);
        if (!b) return trace_fail(p, "out of memory");
        p->t.blocks = b;
        p->block_cap = cap;
    }
    p->t.blocks[p->t.total_blocks++] = id;
    return 0;
}

/* Appends the request's ids, checking each follows the same parent as
 * everywhere else (ids are prefix hashes; this also refuses repeats). */
static int add_ids(parser *p, const cJSON *arr)
{
    uint32_t prev = ID_NONE, i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble != floor(v->valuedouble) || v->valuedouble > MAX_JSON_ID)
            return trace_fail(p, "hash_ids[%u] is not a non-negative integer below 2^53", i);
        uint64_t key = (uint64_t)v->valuedouble;
        bool fresh = false;
        uint32_t id = map_get(&p->m, key, &fresh);
        if (id == ID_NONE) return trace_fail(p, "out of memory");
        if (fresh) p->m.parent[id] = prev;
        else if (p->m.parent[id] != prev)
            return trace_fail(p, "hash_ids[%u] (%llu) follows a different block than it did earlier "
                        "(hash ids must be prefix hashes: one id, one prefix)",
                        i, (unsigned long long)key);
        if (push_block(p, id)) return -1;
        prev = id;
        i++;
    }
    return 0;
}

static int check_ids(parser *p, const cJSON *arr, uint64_t input, uint32_t *n)
{
    if (!arr) return trace_fail(p, "hash_ids is missing");
    if (!cJSON_IsArray(arr)) return trace_fail(p, "hash_ids is not an array");
    int count = cJSON_GetArraySize(arr);
    uint64_t need = (input + TRACE_BLOCK_TOKENS - 1) / TRACE_BLOCK_TOKENS;
    if (count < 0 || (uint64_t)count > need)
        return trace_fail(p, "%d hash_ids for input_length %llu (at most %llu blocks of %u tokens)",
                    count, (unsigned long long)input, (unsigned long long)need,
                    TRACE_BLOCK_TOKENS);
    if (p->t.total_blocks + (uint64_t)count > TRACE_MAX_TOTAL_BLOCKS)
        return trace_fail(p, "the trace holds more than %u hash ids", TRACE_MAX_TOTAL_BLOCKS);
    *n = (uint32_t)count;
    return 0;
}

static int push_req(parser *p, const trace_req *r)
{
    if (p->t.num_reqs == TRACE_MAX_REQUESTS)
        return trace_fail(p, "more than %u requests", TRACE_MAX_REQUESTS);
    if (p->t.num_reqs == p->req_cap) {
        uint64_t cap = p->req_cap ? p->req_cap * 2 : 1024;
        trace_req *q = realloc(p->t.reqs, cap * sizeof *q);
        if (!q) return trace_fail(p, "out of memory");
        p->t.reqs = q;
        p->req_cap = cap;
    }
    p->t.reqs[p->t.num_reqs++] = *r;
    return 0;
}

static int parse_object(parser *p, const cJSON *obj)
{
    if (!cJSON_IsObject(obj)) return trace_fail(p, "not a JSON object");
    uint64_t ts, in, out;
    if (get_uint(p, obj, "timestamp", MAX_JSON_ID, false, &ts) ||
        get_uint(p, obj, "input_length", TRACE_MAX_INPUT, true, &in) ||
        get_uint(p, obj, "output_length", TRACE_MAX_INPUT, false, &out))
        return -1;
    if (in == 0) return trace_fail(p, "input_length is 0");
    uint32_t n = 0;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, "hash_ids");
    if (check_ids(p, arr, in, &n)) return -1;
    trace_req r = {.timestamp = ts, .input_length = (uint32_t)in, .output_length = (uint32_t)out,
                   .first = p->t.total_blocks, .num_blocks = n};
    if (add_ids(p, arr)) return -1;
    if (n > p->t.max_blocks) p->t.max_blocks = n;
    p->t.total_input += in;
    return push_req(p, &r);
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

static int parse_line(parser *p, const char *s, size_t n)
{
    if (blank(s, n)) return 0;
    size_t nul = kvt__json_find_nul(s, n);
    if (nul != SIZE_MAX)
        return trace_fail(p, "a NUL character (raw or \\u0000) at column %zu would cut a string "
                          "short", nul + 1);
    const char *end = NULL;
    cJSON *obj = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    if (!obj) {
        size_t col = end && end >= s && end <= s + n ? (size_t)(end - s) + 1 : 1;
        return trace_fail(p, "not valid JSON (at column %zu)", col);
    }
    int rc = parse_object(p, obj);
    cJSON_Delete(obj);
    return rc;
}

static void parser_free(parser *p)
{
    trace_free(&p->t);
    map_free(&p->m);
}

int trace_parse(const char *buf, size_t len, trace *out, char *err, size_t err_len)
{
    parser p = {.err = err, .err_len = err_len};
    if (err_len) err[0] = '\0';
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (buf + pos)) : len - pos;
        p.line++;
        if (parse_line(&p, buf + pos, n)) {
            parser_free(&p);
            return -1;
        }
        pos += n + 1;
    }
    if (p.t.num_reqs == 0) {
        p.line = 0;
        snprintf(err, err_len, "no requests (the trace is empty)");
        parser_free(&p);
        return -1;
    }
    p.t.num_unique = p.m.count;
    map_free(&p.m);
    *out = p.t;
    return 0;
}

/* Reads the whole file (bounded by TRACE_MAX_FILE). */
static char *read_file(const char *path, size_t *len, char *err, size_t err_len)
{
    mode_t mode = 0;
    int fd = kvt__open_regular(AT_FDCWD, path, O_RDONLY, &mode);
    if (fd == KVT_NOT_REGULAR) {
        snprintf(err, err_len, "%s is %s, not a regular file", path, kvt__file_kind(mode));
        return NULL;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *b = ncap <= TRACE_MAX_FILE ? realloc(buf, ncap) : NULL;
            if (!b) {
                snprintf(err, err_len, "%s: larger than %llu bytes or out of memory", path,
                         (unsigned long long)TRACE_MAX_FILE);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, err_len, "%s: read error", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int trace_load(const char *path, trace *out, char *err, size_t err_len)
{
    size_t len = 0;
    char *buf = read_file(path, &len, err, err_len);
    if (!buf) return -1;
    char msg[512];
    int rc = trace_parse(buf, len, out, msg, sizeof msg);
    free(buf);
    if (rc) snprintf(err, err_len, "%s: %s", path, msg);
    return rc;
}

void trace_free(trace *t)
{
    free(t->reqs);
    free(t->blocks);
    memset(t, 0, sizeof *t);
}

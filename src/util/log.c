/* log.c - see log.h. One process-wide logger: a level threshold (atomic),
 * and a handler or a FILE behind a read-write lock, so that once
 * kvt_set_log_handler returns no line is still inside the old handler. */
#include "util/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "util/config.h"
#include "util/err.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_level = KVT_LOG_WARN;
static pthread_rwlock_t g_mu = PTHREAD_RWLOCK_INITIALIZER;
static kvt_log_fn g_fn;   /* under g_mu */
static void *g_user;      /* under g_mu */
static FILE *g_dest;      /* stderr, a file, or NULL (off); a file is replaced under g_mu */
static char g_path[512];  /* the file's path (KVTIER_LOG), else "" */
static atomic_bool g_reopen; /* kvt__log_reopen asked; the next line reopens g_path */
static enum { FMT_TEXT, FMT_PLAIN, FMT_JSON } g_format; /* set once in init */
static char g_env_note[200]; /* a complaint about the environment, logged once */

static const char *const LEVEL_NAMES[] = {"error", "warn", "info", "debug"};

static void init(void)
{
    kvt_log_level level = KVT_LOG_WARN;
    const char *dest = NULL;
    char note[120] = "";
    if (!kvt__config_log_env(&level, &dest, note, sizeof note))
        snprintf(g_env_note, sizeof g_env_note, "%s; logging at warn", note);
    atomic_store(&g_level, (int)level);
    const char *fmt = kvt__config_env("KVTIER_LOG_FORMAT");
    if (fmt && !strcmp(fmt, "json")) g_format = FMT_JSON;
    else if (fmt && !strcmp(fmt, "plain")) g_format = FMT_PLAIN;
    else if (fmt && *fmt && strcmp(fmt, "text") != 0 && !g_env_note[0])
        snprintf(g_env_note, sizeof g_env_note, "KVTIER_LOG_FORMAT=\"%.40s\" is not text, json "
                 "or plain; logging as text", fmt);
    g_dest = stderr;
    if (!dest || !*dest || strcmp(dest, "stderr") == 0) return;
    if (strcmp(dest, "off") == 0 || strcmp(dest, "none") == 0) {
        g_dest = NULL;
        return;
    }
    FILE *f = fopen(dest, "ae"); /* kept open; reopened on kvt__log_reopen (SIGHUP) */
    if (f) {
        setvbuf(f, NULL, _IOLBF, 0);
        g_dest = f;
        snprintf(g_path, sizeof g_path, "%s", dest);
    } else {
        snprintf(g_env_note, sizeof g_env_note, "KVTIER_LOG: cannot open \"%.100s\"; logging to stderr",
                 dest);
    }
}

void kvt__log_reopen(void)
{
    atomic_store(&g_reopen, true); /* async-signal-safe: the next line does the work */
}

/* A log file renamed away (logrotate) is closed and the path opened anew;
 * if that fails the old file stays. */
static void reopen(void)
{
    if (!g_path[0]) return;
    FILE *f = fopen(g_path, "ae");
    if (!f) return;
    setvbuf(f, NULL, _IOLBF, 0);
    pthread_rwlock_wrlock(&g_mu);
    FILE *old = g_dest;
    g_dest = f;
    pthread_rwlock_unlock(&g_mu);
    if (old && old != stderr) fclose(old);
}

/* ISO-8601 UTC with milliseconds: 2026-12-04T17:20:01.123Z */
static void timestamp(char out[32])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* line as a JSON string's contents (quotes, backslashes and control bytes
 * escaped), cut to fit out. */
static void json_escape(char *out, size_t cap, const char *line)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)line; *p && o + 7 < cap; p++) {
        if (*p == '"' || *p == '\\') {
            out[o++] = '\\';
            out[o++] = (char)*p;
        } else if (*p < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", *p);
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
}

static void emit(kvt_log_level level, const char *line)
{
    if (atomic_exchange(&g_reopen, false)) reopen();
    char ts[32] = "";
    if (g_format != FMT_PLAIN) timestamp(ts);
    pthread_rwlock_rdlock(&g_mu);
    if (g_fn) {
        g_fn(g_user, level, line);
    } else if (g_dest && g_format == FMT_JSON) {
        char esc[KVT_LOG_LINE_MAX * 2];
        json_escape(esc, sizeof esc, line);
        fprintf(g_dest, "{\"ts\":\"%s\",\"level\":\"%s\",\"pid\":%ld,\"msg\":\"%s\"}\n", ts,
                LEVEL_NAMES[level], (long)getpid(), esc);
    } else if (g_dest) {
        /* one fprintf per line: stdio locks the FILE, so lines never interleave */
        fprintf(g_dest, "%s%skvtier: %s: %s\n", ts, ts[0] ? " " : "", LEVEL_NAMES[level], line);
    }
    pthread_rwlock_unlock(&g_mu);
}

bool kvt__log_on(kvt_log_level level)
{
    pthread_once(&g_once, init);
    return (int)level <= atomic_load_explicit(&g_level, memory_order_relaxed);
}

void kvt__vlog(kvt_log_level level, const char *fmt, va_list ap)
{
    if (!kvt__log_on(level)) return;
    static atomic_flag noted = ATOMIC_FLAG_INIT;
    if (g_env_note[0] && !atomic_flag_test_and_set(&noted)) emit(KVT_LOG_WARN, g_env_note);
    char line[KVT_LOG_LINE_MAX];
    vsnprintf(line, sizeof line, fmt, ap);
    emit(level, line);
}

void kvt__log(kvt_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt__vlog(level, fmt, ap);
    va_end(ap);
}

kvt_status kvt_set_log_handler(kvt_log_fn fn, void *user)
{
    kvt__clear_error();
    pthread_once(&g_once, init);
    pthread_rwlock_wrlock(&g_mu);
    g_fn = fn;
    g_user = fn ? user : NULL;
    pthread_rwlock_unlock(&g_mu);
    return KVT_OK;
}

kvt_status kvt__log_set_level(kvt_log_level level, const char *fn)
{
    KVT_CHECK_ARG((int)level >= KVT_LOG_ERROR && (int)level <= KVT_LOG_DEBUG,
                  "%s: level %d is not KVT_LOG_ERROR..KVT_LOG_DEBUG", fn, (int)level);
    pthread_once(&g_once, init);
    atomic_store(&g_level, (int)level);
    return KVT_OK;
}

kvt_status kvt_set_log_level(kvt_log_level level)
{
    kvt__clear_error();
    return kvt__log_set_level(level, "kvt_set_log_level");
}

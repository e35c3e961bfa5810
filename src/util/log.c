/* log.c - see log.h. One process-wide logger: a level threshold (atomic),
 * and a handler or a FILE behind a read-write lock, so that once
 * kvt_set_log_handler returns no line is still inside the old handler. */
#include "util/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "util/config.h"
#include "util/err.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_level = KVT_LOG_WARN;
static pthread_rwlock_t g_mu = PTHREAD_RWLOCK_INITIALIZER;
static kvt_log_fn g_fn;   /* under g_mu */
static void *g_user;      /* under g_mu */
static FILE *g_dest;      /* set once in init: stderr, a file, or NULL (off) */
static char g_env_note[160]; /* a complaint about the environment, logged once */

static const char *const LEVEL_NAMES[] = {"error", "warn", "info", "debug"};

static void init(void)
{
    kvt_log_level level = KVT_LOG_WARN;
    const char *dest = NULL;
    char note[120] = "";
    if (!kvt__config_log_env(&level, &dest, note, sizeof note))
        snprintf(g_env_note, sizeof g_env_note, "%s; logging at warn", note);
    atomic_store(&g_level, (int)level);
    g_dest = stderr;
    if (!dest || !*dest || strcmp(dest, "stderr") == 0) return;
    if (strcmp(dest, "off") == 0 || strcmp(dest, "none") == 0) {
        g_dest = NULL;
        return;
    }
    FILE *f = fopen(dest, "ae"); /* kept open for the process's life */
    if (f) {
        setvbuf(f, NULL, _IOLBF, 0);
        g_dest = f;
    } else {
        snprintf(g_env_note, sizeof g_env_note, "KVTIER_LOG: cannot open \"%.100s\"; logging to stderr",
                 dest);
    }
}

static void emit(kvt_log_level level, const char *line)
{
    pthread_rwlock_rdlock(&g_mu);
    if (g_fn) {
        g_fn(g_user, level, line);
    } else if (g_dest) {
        /* one fprintf per line: stdio locks the FILE, so lines never interleave */
        fprintf(g_dest, "kvtier: %s: %s\n", LEVEL_NAMES[level], line);
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

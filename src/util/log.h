/* log.h - the library's one logger. Lines go to the handler an engine set
 * with kvt_set_log_handler, else to the destination named by KVTIER_LOG
 * (stderr by default), formatted by KVTIER_LOG_FORMAT: text (the default:
 * "2026-12-04T17:20:01.123Z kvtier: info: server: ...", an ISO-8601 UTC
 * time, the level, then the line, which starts with its subsystem), json
 * (one object a line: ts, level, pid, msg) or plain (text without the
 * time, for a journal that stamps lines itself). The threshold starts at KVTIER_LOG_LEVEL (else the
 * log_level option's default, warn) and follows kvt_set_log_level and the
 * log_level of each kvt_cache_create's config.
 *
 * KVT_LOG checks the level before its arguments are evaluated, so a debug
 * line costs one atomic load when debug is off. Not for the data path: a
 * line takes a read lock and formats into a stack buffer. */
#ifndef KVT_UTIL_LOG_H
#define KVT_UTIL_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include "kvtier.h"

/* Longest line delivered; longer ones are cut. */
#define KVT_LOG_LINE_MAX 1024

bool kvt__log_on(kvt_log_level level);
void kvt__log(kvt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvt__vlog(kvt_log_level level, const char *fmt, va_list ap);

/* Asks the logger to reopen its file (KVTIER_LOG=path) before its next
 * line: a log file renamed by logrotate is let go. Async-signal-safe (a
 * SIGHUP handler calls it); a no-op when logging to stderr or a handler. */
void kvt__log_reopen(void);

/* Sets the threshold (kvt_set_log_level, kvt_cache_create); fn names the
 * public function in the message for a level out of range. */
kvt_status kvt__log_set_level(kvt_log_level level, const char *fn);

#define KVT_LOG(level, ...)                                \
    do {                                                   \
        if (kvt__log_on(level)) kvt__log(level, __VA_ARGS__); \
    } while (0)

#endif

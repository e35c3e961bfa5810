#include "util/err.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[KVT_ERRMSG_MAX];

kvt_status kvt__vfail(kvt_status status, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    return status;
}

kvt_status kvt__fail(kvt_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt__vfail(status, fmt, ap);
    va_end(ap);
    return status;
}

void kvt__clear_error(void) { last_error[0] = '\0'; }

const char *kvt_last_error(void) { return last_error; }

const char *kvt_strerror(kvt_status status)
{
    switch (status) {
#define KVT_STATUS_TEXT_(name, value, text) \
    case KVT_##name:                        \
        return text;
        KVT_STATUS_MAP(KVT_STATUS_TEXT_)
#undef KVT_STATUS_TEXT_
    }
    return "unknown status";
}

const char *kvt_status_name(kvt_status status)
{
    switch (status) {
#define KVT_STATUS_NAME_(name, value, text) \
    case KVT_##name:                        \
        return "KVT_" #name;
        KVT_STATUS_MAP(KVT_STATUS_NAME_)
#undef KVT_STATUS_NAME_
    }
    return "KVT_UNKNOWN";
}

unsigned kvt_version(void) { return KVT_VERSION_HEX; }
const char *kvt_version_string(void) { return KVT_VERSION_STRING; }

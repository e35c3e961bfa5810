#include "util/err.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[KVT_ERRMSG_MAX];

kvt_status kvt__vfail(kvt_status status, const char *fmt, va_list ap)
{
    /* Formatted aside first: callers wrap the previous message
     * (kvt__fail(st, "...: %s", kvt_last_error())), and vsnprintf into the
     * buffer it reads from garbles it (overlapping copy, undefined). */
    char msg[KVT_ERRMSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof last_error);
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

kvt_status kvt__wrap_error(kvt_status status, const char *prefix)
{
    char inner[KVT_ERRMSG_MAX];
    memcpy(inner, last_error, sizeof inner);
    /* Truncation of an over-long message is acceptable; it stays terminated. */
    int n = snprintf(last_error, sizeof last_error, "%s: ", prefix);
    if (n > 0 && (size_t)n < sizeof last_error)
        memcpy(last_error + n, inner, strnlen(inner, sizeof last_error - (size_t)n - 1) + 1);
    last_error[sizeof last_error - 1] = '\0';
    return status;
}

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

size_t kvt_abi_struct_size(const char *name)
{
#define KVT_ABI_(type) {#type, sizeof(type)}
    static const struct { const char *name; size_t size; } table[] = {
        KVT_ABI_(kvt_option_info),   KVT_ABI_(kvt_component_spec), KVT_ABI_(kvt_layer_spec),
        KVT_ABI_(kvt_geometry_info), KVT_ABI_(kvt_request),        KVT_ABI_(kvt_engine_memory),
        KVT_ABI_(kvt_key),
        KVT_ABI_(kvt_match),         KVT_ABI_(kvt_store_plan),     KVT_ABI_(kvt_task_result),
        KVT_ABI_(kvt_cache_stats),   KVT_ABI_(kvt_verify_result),
        KVT_ABI_(kvt_pd_net_params), KVT_ABI_(kvt_pd_rank),        KVT_ABI_(kvt_pd_params),
        KVT_ABI_(kvt_pd_room_params), KVT_ABI_(kvt_pd_room_info),  KVT_ABI_(kvt_pd_bootstrap_stats),
        KVT_ABI_(kvt_tier_stats),    KVT_ABI_(kvt_quota_usage),    KVT_ABI_(kvt_cluster_counters),
        KVT_ABI_(kvt_server_info),
    };
#undef KVT_ABI_
    if (!name) return 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0) return table[i].size;
    return 0;
}

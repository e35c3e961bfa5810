/* clock.h - monotonic time and deadlines. Every wait in kvtier has one. */
#ifndef KVT_UTIL_CLOCK_H
#define KVT_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t kvt__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Absolute monotonic deadline timeout_ms from now (timeout_ms >= 0). */
static inline uint64_t kvt__deadline_ns(int64_t timeout_ms)
{
    return kvt__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

static inline struct timespec kvt__ns_to_timespec(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    return ts;
}

#endif

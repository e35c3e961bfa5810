#include "util/parse.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>

bool kvt__parse_u64(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0])) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool size_multiplier(const char *suffix, uint64_t *mult)
{
    static const struct { const char *name; uint64_t mult; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
        {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
        {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
    };
    while (*suffix == ' ') suffix++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(suffix, units[i].name) == 0) {
            *mult = units[i].mult;
            return true;
        }
    }
    return false;
}

/* Digits, an optional '.' and fraction digits, then a unit. The integer
 * part is exact (no detour through double); the fraction is rounded to the
 * nearest byte. No signs, exponents, hex or locale-dependent separators. */
bool kvt__parse_size(const char *s, uint64_t *out)
{
    if (!s) return false;
    const char *p = s;
    uint64_t whole = 0;
    bool digits = false;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10) return false;
        whole = whole * 10 + d;
        digits = true;
    }
    double frac = 0, scale = 1;
    if (*p == '.') {
        for (p++; isdigit((unsigned char)*p); p++) {
            if (scale < 1e18) { /* further digits are below any byte */
                scale *= 10;
                frac += (*p - '0') / scale;
            }
            digits = true;
        }
    }
    uint64_t mult;
    if (!digits || !size_multiplier(p, &mult)) return false;
    if (mult != 0 && whole > UINT64_MAX / mult) return false;
    uint64_t bytes = whole * mult;
    /* frac < 1 and mult <= 2^40, so the product is exact enough and small. */
    uint64_t extra = (uint64_t)llround(frac * (double)mult);
    if (bytes > UINT64_MAX - extra) return false;
    *out = bytes + extra;
    return true;
}

bool kvt__parse_bool(const char *s, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    if (!s) return false;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = true; return true; }
        if (strcasecmp(s, no[i]) == 0) { *out = false; return true; }
    }
    return false;
}

void kvt__format_size(uint64_t bytes, char *buf, unsigned len)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) { v /= 1024.0; i++; }
    if (i == 0) snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, len, "%.1f %s", v, names[i]);
}

size_t kvt__json_find_nul(const char *json, size_t len)
{
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '\0') return i;
        if (!in_string) {
            in_string = c == '"';
            continue;
        }
        if (c == '"') {
            in_string = false;
        } else if (c == '\\' && i + 1 < len) {
            if (json[i + 1] == 'u' && i + 5 < len && memcmp(json + i + 2, "0000", 4) == 0)
                return i;
            i++; /* the escaped character; a \\ never starts another escape */
        }
    }
    return SIZE_MAX;
}

bool kvt__host_is_loopback(const char *host)
{
    struct in_addr a;
    struct in6_addr a6;
    if (!host) return false;
    /* A numeric address only: "127.example.com" is a name any resolver may
     * send anywhere. */
    if (inet_pton(AF_INET, host, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return !strcmp(host, "localhost");
}

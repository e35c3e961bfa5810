#include "util/parse.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

static bool size_multiplier(const char *suffix, double *mult)
{
    static const struct { const char *name; double mult; } units[] = {
        {"", 1}, {"B", 1},
        {"K", 1024.0}, {"KiB", 1024.0}, {"KB", 1e3},
        {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},
        {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
        {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    while (*suffix == ' ') suffix++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(suffix, units[i].name) == 0 &&
            (strlen(suffix) < 2 || strcmp(suffix, units[i].name) == 0 ||
             strcasecmp(suffix, units[i].name) == 0)) {
            *mult = units[i].mult;
            return true;
        }
    }
    return false;
}

bool kvt__parse_size(const char *s, uint64_t *out)
{
    if (!s || !(isdigit((unsigned char)s[0]) || s[0] == '.')) return false;
    char *end = NULL;
    double v = strtod(s, &end);
    double mult;
    if (end == s || !size_multiplier(end, &mult)) return false;
    double bytes = v * mult;
    if (!(bytes >= 0) || bytes >= 18446744073709551615.0) return false;
    *out = (uint64_t)llround(bytes);
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

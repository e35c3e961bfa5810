/* parse.h - strict parsing of option values: the whole string must parse. */
#ifndef KVT_UTIL_PARSE_H
#define KVT_UTIL_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "4096", "64K", "2MiB", "1.5GiB", "1G" (K/M/G/T = powers of 1024; KB/MB/GB
 * = powers of 1000). false on anything else or on overflow. */
bool kvt__parse_size(const char *s, uint64_t *out);
/* Decimal unsigned integer without sign or suffix. */
bool kvt__parse_u64(const char *s, uint64_t *out);
/* "1", "0", "true", "false", "yes", "no", "on", "off". */
bool kvt__parse_bool(const char *s, bool *out);
/* The offset of the first NUL character inside a JSON string of json[0..len):
 * a raw NUL byte or a \u0000 escape. cJSON keeps strings NUL-terminated, so
 * such a value would be silently cut there; callers refuse it. SIZE_MAX when
 * there is none. */
size_t kvt__json_find_nul(const char *json, size_t len);
/* Formats bytes as "1.5 GiB" into buf. */
void kvt__format_size(uint64_t bytes, char *buf, unsigned len);

/* Whether host (a numeric IPv4 or IPv6 address, or a name) is this machine
 * only: 127.0.0.0/8, ::1 (any spelling), ::ffff:127.x.x.x, or "localhost"
 * (no other name is resolved). Endpoints beyond it need a secret; the
 * metrics endpoint (metrics/http.c) needs metrics_insecure. The one
 * loopback test: util, so metrics and events may use it (docs/design.md:
 * they sit below net). */
bool kvt__host_is_loopback(const char *host);

#endif

/* events_json.c - a KV event batch as one JSON line (events_json.h). The
 * batch is decoded with msgpack-c, checked for vLLM's shape, and written
 * to a memory stream first, so a malformed one writes nothing. */
#include "events_json.h"

#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *const STORED_FIELDS[] = {"block_hashes", "parent_block_hash", "token_ids",
                                            "block_size", "lora_id", "medium", "lora_name"};
static const char *const REMOVED_FIELDS[] = {"block_hashes", "medium"};

static void json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* Any msgpack value: bin as a hex string (block hashes), maps refused
 * (vLLM's array-like form has none). depth bounds nesting. */
static bool value(FILE *f, const msgpack_object *o, int depth)
{
    if (depth > 8) return false;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: fputs("null", f); return true;
    case MSGPACK_OBJECT_BOOLEAN: fputs(o->via.boolean ? "true" : "false", f); return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: fprintf(f, "%llu", (unsigned long long)o->via.u64); return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: fprintf(f, "%lld", (long long)o->via.i64); return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: fprintf(f, "%.6f", o->via.f64); return true;
    case MSGPACK_OBJECT_STR: json_string(f, o->via.str.ptr, o->via.str.size); return true;
    case MSGPACK_OBJECT_BIN:
        fputc('"', f);
        for (uint32_t i = 0; i < o->via.bin.size; i++) fprintf(f, "%02x", (unsigned char)o->via.bin.ptr[i]);
        fputc('"', f);
        return true;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i) fputc(',', f);
            if (!value(f, &o->via.array.ptr[i], depth + 1)) return false;
        }
        fputc(']', f);
        return true;
    default: return false;
    }
}

static bool is_tag(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           !memcmp(o->via.str.ptr, s, o->via.str.size);
}

/* ["Tag", fields...] as {"type":"Tag","field":...}. */
static bool event(FILE *f, const msgpack_object *e, char *err, size_t err_len)
{
    if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size == 0 ||
        e->via.array.ptr[0].type != MSGPACK_OBJECT_STR) {
        snprintf(err, err_len, "an event is not a tagged array");
        return false;
    }
    const msgpack_object *v = e->via.array.ptr;
    uint32_t n = e->via.array.size - 1;
    const char *const *names = NULL;
    uint32_t nnames = 0;
    if (is_tag(v, "BlockStored")) names = STORED_FIELDS, nnames = 7;
    else if (is_tag(v, "BlockRemoved")) names = REMOVED_FIELDS, nnames = 2;
    else if (!is_tag(v, "AllBlocksCleared")) {
        snprintf(err, err_len, "an event of unknown type \"%.*s\"", (int)(v->via.str.size > 64 ? 64 : v->via.str.size),
                 v->via.str.ptr);
        return false;
    }
    if (n < nnames) {
        snprintf(err, err_len, "a %.*s event has %u fields, not %u", (int)v->via.str.size,
                 v->via.str.ptr, n, nnames);
        return false;
    }
    fputs("{\"type\":", f);
    json_string(f, v->via.str.ptr, v->via.str.size);
    for (uint32_t i = 0; i < n; i++) {
        if (i < nnames) fprintf(f, ",\"%s\":", names[i]);
        else fprintf(f, ",\"field%u\":", i + 1); /* a newer publisher's extra fields */
        if (!value(f, &v[i + 1], 1)) {
            snprintf(err, err_len, "a field of a %.*s event is not a msgpack value kvtier reads",
                     (int)v->via.str.size, v->via.str.ptr);
            return false;
        }
    }
    fputc('}', f);
    return true;
}

static bool batch(FILE *f, int64_t seq, const msgpack_object *b, char *err, size_t err_len)
{
    if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size < 2 ||
        (b->via.array.ptr[0].type != MSGPACK_OBJECT_FLOAT64 &&
         b->via.array.ptr[0].type != MSGPACK_OBJECT_FLOAT32) ||
        b->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY) {
        snprintf(err, err_len, "not an EventBatch [ts, events, data_parallel_rank]");
        return false;
    }
    fprintf(f, "{\"seq\":%lld,\"ts\":%.6f", (long long)seq, b->via.array.ptr[0].via.f64);
    if (b->via.array.size > 2) {
        fputs(",\"data_parallel_rank\":", f);
        if (!value(f, &b->via.array.ptr[2], 1)) {
            snprintf(err, err_len, "data_parallel_rank is not a msgpack value kvtier reads");
            return false;
        }
    }
    fputs(",\"events\":[", f);
    const msgpack_object *evs = &b->via.array.ptr[1];
    for (uint32_t i = 0; i < evs->via.array.size; i++) {
        if (i) fputc(',', f);
        if (!event(f, &evs->via.array.ptr[i], err, err_len)) return false;
    }
    fputs("]}\n", f);
    return true;
}

/* msgpack-c sizes its zone from the counts a header claims before it
 * reads the elements (an array32 of 2^32 entries in a 10-byte message asks
 * for 64 GiB): so the bytes are walked first, and every count and length
 * must fit in what is left (an element takes at least one byte), nesting
 * at most 16 deep. Returns the end of the value at p, or NULL. */
#define SHAPE_DEPTH 16

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

static const uint8_t *shape(const uint8_t *p, const uint8_t *end, int depth)
{
    if (p >= end || depth > SHAPE_DEPTH) return NULL;
    uint8_t t = *p++;
    uint64_t items = 0, bytes = 0;
    size_t left = (size_t)(end - p);
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return p;
    if ((t & 0xf0) == 0x90) items = t & 0x0f;
    else if ((t & 0xf0) == 0x80) items = 2u * (t & 0x0f);
    else if ((t & 0xe0) == 0xa0) bytes = t & 0x1f;
    else {
        static const struct { uint8_t t; uint8_t len; uint8_t kind; } h[] = {
            /* kind 0: fixed payload of len bytes; 1: str/bin length in len
             * bytes; 2: ext (length, then a type byte); 3: array; 4: map */
            {0xcc, 1, 0}, {0xcd, 2, 0}, {0xce, 4, 0}, {0xcf, 8, 0}, {0xd0, 1, 0}, {0xd1, 2, 0},
            {0xd2, 4, 0}, {0xd3, 8, 0}, {0xca, 4, 0}, {0xcb, 8, 0}, {0xd4, 2, 0}, {0xd5, 3, 0},
            {0xd6, 5, 0}, {0xd7, 9, 0}, {0xd8, 17, 0}, {0xd9, 1, 1}, {0xda, 2, 1}, {0xdb, 4, 1},
            {0xc4, 1, 1}, {0xc5, 2, 1}, {0xc6, 4, 1}, {0xc7, 1, 2}, {0xc8, 2, 2}, {0xc9, 4, 2},
            {0xdc, 2, 3}, {0xdd, 4, 3}, {0xde, 2, 4}, {0xdf, 4, 4},
        };
        size_t i = 0;
        while (i < sizeof h / sizeof h[0] && h[i].t != t) i++;
        if (i == sizeof h / sizeof h[0]) return NULL; /* 0xc1: never used */
        if (h[i].kind == 0) return left >= h[i].len ? p + h[i].len : NULL;
        if (left < h[i].len) return NULL;
        uint64_t n = be(p, h[i].len);
        p += h[i].len;
        left -= h[i].len;
        if (h[i].kind == 3) items = n;
        else if (h[i].kind == 4) items = 2 * n;
        else bytes = n + (h[i].kind == 2);
    }
    if (bytes) return bytes <= left ? p + bytes : NULL;
    if (items > left) return NULL;
    for (uint64_t k = 0; k < items && p; k++) p = shape(p, end, depth + 1);
    return p;
}

int kvt_events_batch_json(FILE *out, int64_t seq, const void *payload, size_t len, char *err,
                          size_t err_len)
{
    const uint8_t *end = (const uint8_t *)payload + len;
    const uint8_t *stop = len ? shape(payload, end, 0) : NULL;
    if (stop != end) {
        snprintf(err, err_len, "not one well-formed msgpack value of %zu bytes (or nested more "
                 "than %d deep)", len, SHAPE_DEPTH);
        return -1;
    }
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc = -1;
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = NULL;
    if (msgpack_unpack_next(&u, payload, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        snprintf(err, err_len, "not one msgpack value (%zu bytes)", len);
    } else if (off != len) {
        snprintf(err, err_len, "%zu bytes after the batch", len - off);
    } else if (!(mem = open_memstream(&text, &text_len))) {
        snprintf(err, err_len, "out of memory");
    } else {
        bool ok = batch(mem, seq, &u.data, err, err_len);
        fclose(mem);
        if (ok) {
            fwrite(text, 1, text_len, out);
            rc = 0;
        }
    }
    free(text);
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* test_net_frame.c - the group's frame and handshake codecs and the connector's DOWN
 * records: round trips, and every kind of damage the decoders must reject with a message. */
#include "support.h"

#include <string.h>
#include "group/frame.h"
#include "connector/wire.h"

static size_t make(uint8_t *buf, uint16_t op, uint64_t seq, const char *payload)
{
    size_t len = strlen(payload);
    kvt_frame f = {.version = KVT_PROTO_VERSION, .op = op, .epoch = 7, .seq = seq,
                   .channel = KVT_CH_STEP, .sender = 3, .receiver = 0, .len = (uint32_t)len};
    kvt__frame_encode(buf, &f, payload);
    memcpy(buf + KVT_FRAME_HDR, payload, len);
    return KVT_FRAME_HDR + len;
}

static void test_roundtrip(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t n = make(buf, KVT_OP_STEP_UP, 42, "hello");
    kvt_frame f;
    assert_ok(kvt__frame_decode(buf, n, KVT_PROTO_VERSION, &f));
    assert_int_equal(f.seq, 42);
    assert_int_equal(f.epoch, 7);
    assert_int_equal(f.sender, 3);
    assert_int_equal(f.op, KVT_OP_STEP_UP);
    assert_int_equal(f.len, 5);
    assert_memory_equal(f.payload, "hello", 5);
}

static void test_damage(void **state)
{
    (void)state;
    uint8_t buf[256];
    kvt_frame f;
    size_t n = make(buf, KVT_OP_STEP_UP, 1, "payload");
    assert_status(kvt__frame_decode(buf, 10, KVT_PROTO_VERSION, &f), KVT_EPROTO);
    assert_status(kvt__frame_decode(buf, n - 1, KVT_PROTO_VERSION, &f), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "says 7 payload bytes"));
    for (size_t i = 0; i < n; i++) { /* every single-byte flip is caught */
        buf[i] ^= 0x01;
        kvt_status st = kvt__frame_decode(buf, n, KVT_PROTO_VERSION, &f);
        assert_true(st == KVT_EPROTO || st == KVT_ECORRUPT || st == KVT_EVERSION);
        buf[i] ^= 0x01;
    }
    assert_ok(kvt__frame_decode(buf, n, KVT_PROTO_VERSION, &f));
    assert_status(kvt__frame_decode(buf, n, KVT_PROTO_VERSION + 1, &f), KVT_EVERSION);
    assert_int_equal(f.sender, 3); /* known even for another version */
    assert_non_null(strstr(kvt_last_error(), "protocol version 3, this rank 4"));
    assert_status(kvt__frame_decode(NULL, 0, 1, &f), KVT_EPROTO);
}

static void test_hello_and_note(void **state)
{
    (void)state;
    kvt_hello h, g;
    memset(&h, 0, sizeof h);
    memset(&g, 0, sizeof g);
    h = (kvt_hello){0x10203, 2, 1, 2, 3, 1, 0, 1, 3, 0xabcdefull, 0x1234ull, 9};
    uint8_t buf[KVT_HELLO_LEN];
    kvt__hello_encode(buf, &h);
    assert_ok(kvt__hello_decode(buf, sizeof buf, &g));
    assert_int_equal(g.lib_version, 0x10203);
    assert_int_equal(g.tp_rank, 1);
    assert_int_equal(g.role, 3);
    assert_int_equal(g.geometry_digest, 0xabcdefull);
    assert_int_equal(g.config_digest, 0x1234ull);
    assert_int_equal(g.epoch, 9);
    assert_status(kvt__hello_decode(buf, sizeof buf - 1, &g), KVT_EPROTO);
    uint8_t note[64];
    size_t n = kvt__note_encode(note, sizeof note, 5, "rank 2 raised\x01");
    uint32_t w;
    char text[32];
    assert_ok(kvt__note_decode(note, n, &w, text, sizeof text));
    assert_int_equal(w, 5);
    assert_string_equal(text, "rank 2 raised?");
    assert_status(kvt__note_decode(note, 3, &w, text, sizeof text), KVT_EPROTO);
}

/* The connector's DOWN: a decision's status must be OK or a failure code
 * (the engine gets it in kvt_conn_event.status); anything else is refused
 * with the record named. */
static void test_down_statuses(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t len = kvt__wire_down_size(1, 1, 0);
    assert_true(len <= sizeof buf);
    const int32_t load_st[] = {KVT_OK, KVT_ECANCELED, 5, KVT_EVERSION - 1, KVT_OK};
    const int32_t store_st[] = {KVT_EBUSY, KVT_OK, KVT_OK, KVT_OK, 1};
    for (int i = 0; i < 5; i++) {
        memset(buf, 0, sizeof buf);
        kvt__wire_head(buf, 0, 1, 1, 0);
        kvt_down_load l = {.rid = 9, .tokens = 16, .status = load_st[i]};
        kvt_down_store st = {.rid = 10, .status = store_st[i]};
        kvt__wire_put_load(buf + KVT_WIRE_HEAD, &l);
        kvt__wire_put_sdec(buf + KVT_WIRE_HEAD + KVT_DNL_SIZE, &st);
        kvt_down_view v;
        kvt_status r = kvt__wire_down_parse(buf, len, &v);
        if (i < 2) {
            assert_int_equal(r, KVT_OK);
            continue;
        }
        assert_int_equal(r, KVT_EPROTO);
        assert_non_null(strstr(kvt_last_error(), i < 4 ? "load 0 (rid 9) has unknown status"
                                                       : "store 0 (rid 10) has unknown status 1"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_damage),
        cmocka_unit_test(test_hello_and_note),
        cmocka_unit_test(test_down_statuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* cmd_events.c - `kvtier events --endpoint E [--replay R [--from N]]
 * [--count N] [--timeout-ms MS] [--topic T] [--secret-file F]`: a node server's KV events
 * (docs/events.md) as JSON lines, one per batch, for a person. With
 * --replay the kept batches from --from come first, then (with
 * --endpoint) the live ones after them, each once and in order: the live
 * stream is subscribed before the replay is asked, a batch the replay
 * printed is skipped, and a gap is fetched from the replay. Exit 0; 1 when the replay does
 * not answer in time, a batch is malformed, or --timeout-ms passes with no
 * batch; 2 on usage. Every wait is bounded by --timeout-ms (default: none
 * for the live stream, 5 s for a replay). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "cli_util.h"
#include "cmds.h"
#include "events/events.h"
#include "events_json.h"
#include "server/auth.h"
#include "util/clock.h"

#define MAX_FRAME (64u << 20) /* a batch larger than this is not one kvtier sends */

static int usage(FILE *f, int rc)
{
    fprintf(f,
            "usage: kvtier events --endpoint E [--count N] [--timeout-ms MS] [--topic T]\n"
            "       kvtier events --replay R [--from N] [--endpoint E] [--count N]\n"
            "  --endpoint E    the server's events_endpoint (SUB): print batches as they come\n"
            "  --replay R      its events_replay_endpoint: first the kept batches from --from\n"
            "  --from N        the first sequence number to replay (default 0)\n"
            "  --count N       stop after N batches\n"
            "  --timeout-ms MS stop (exit 1) when no batch came for MS (default: wait; a\n"
            "                  replay's answer waits 5000 at most)\n"
            "  --topic T       only batches of this topic (default: all)\n"
            "  --secret-file F the server's events_secret_file: speak CURVE with the keys it\n"
            "                  gives (a server with a secret lets nobody else in)\n"
            "Each batch is one JSON line: {\"seq\":..,\"ts\":..,\"data_parallel_rank\":..,\n"
            "\"events\":[{\"type\":\"BlockStored\",\"block_hashes\":[\"<hex>\",..],..},..]}.\n");
    return rc;
}

/* One frame as a message (any size up to MAX_FRAME); its length or -1. */
static int recv_msg(void *s, zmq_msg_t *m, bool *more)
{
    if (zmq_msg_recv(m, s, 0) < 0) return -1;
    *more = zmq_msg_more(m);
    return zmq_msg_size(m) > MAX_FRAME ? -1 : (int)zmq_msg_size(m);
}

static int64_t be64(const void *p)
{
    const unsigned char *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return (int64_t)v;
}

/* Frames of one message into m[0..max); their count, -1 on a receive
 * error or timeout (the rest of a longer message is read and dropped). */
static int recv_frames(void *s, zmq_msg_t *m, int max)
{
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_t *dst = n < max ? &m[n] : &tmp;
        zmq_msg_init(dst);
        if (recv_msg(s, dst, &more) < 0) {
            zmq_msg_close(dst);
            for (int i = 0; i < n && i < max; i++) zmq_msg_close(&m[i]);
            return -1;
        }
        if (n >= max) zmq_msg_close(&tmp);
        n++;
    }
    return n;
}

static void close_frames(zmq_msg_t *m, int n, int max)
{
    for (int i = 0; i < n && i < max; i++) zmq_msg_close(&m[i]);
}

/* One batch printed; 0, or 1 when it is malformed (said on stderr). */
static int print_batch(zmq_msg_t *seq, zmq_msg_t *payload)
{
    char err[256];
    if (zmq_msg_size(seq) != 8) {
        fprintf(stderr, "kvtier events: a sequence frame of %zu bytes, not 8\n", zmq_msg_size(seq));
        return 1;
    }
    if (kvt_events_batch_json(stdout, be64(zmq_msg_data(seq)), zmq_msg_data(payload),
                              zmq_msg_size(payload), err, sizeof err) != 0) {
        fprintf(stderr, "kvtier events: batch %lld: %s\n", (long long)be64(zmq_msg_data(seq)), err);
        return 1;
    }
    fflush(stdout);
    return 0;
}

/* --secret-file's keys; NULL: plain ZeroMQ. */
static const kvt_events_keys *curve_keys;

/* s as the CURVE client the server's ZAP handler lets in. */
static int curve_client(void *s, const char *ep)
{
    const kvt_events_keys *k = curve_keys;
    if (!k) return 0;
    if (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, k->server_public, 40) == 0 &&
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k->client_public, 40) == 0 &&
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k->client_secret, 40) == 0)
        return 0;
    fprintf(stderr, "kvtier events: %s: CURVE: %s\n", ep, zmq_strerror(zmq_errno()));
    return 1;
}

/* What --count leaves and where the printed sequence stands. */
typedef struct ev_progress {
    bool counted;  /* --count given */
    uint64_t left; /* batches still to print (when counted) */
    int64_t next;  /* the sequence after the last printed */
} ev_progress;

/* The replay: batches from `from` until the end marker or --count;
 * pg->next becomes the sequence after the last printed. */
static int replay(void *ctx, const char *ep, uint64_t from, uint64_t timeout, ev_progress *pg)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int ms = timeout ? (int)timeout : 5000, zero = 0;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof ms);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(from >> (56 - 8 * i));
    int rc = 1;
    if (curve_client(s, ep)) {
    } else if (zmq_connect(s, ep) != 0) {
        fprintf(stderr, "kvtier events: --replay %s: %s\n", ep, zmq_strerror(zmq_errno()));
    } else if (zmq_send(s, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(s, b, 8, 0) < 0) {
        fprintf(stderr, "kvtier events: --replay %s: %s\n", ep, zmq_strerror(zmq_errno()));
    } else {
        for (;;) {
            zmq_msg_t m[3];
            int n = recv_frames(s, m, 3);
            if (n < 0) {
                fprintf(stderr, "kvtier events: --replay %s did not answer within %d ms (is it "
                        "the server's events_replay_endpoint%s?)\n", ep, ms,
                        curve_keys ? ", and its events_secret_file" :
                        "? A server with events_secret_file answers only --secret-file");
                break;
            }
            bool end = n == 3 && zmq_msg_size(&m[1]) == 8 && be64(zmq_msg_data(&m[1])) == -1;
            int bad = n != 3 ? (fprintf(stderr, "kvtier events: a replay answer of %d frames\n", n), 1)
                      : end  ? 0
                             : print_batch(&m[1], &m[2]);
            if (!bad && !end) pg->next = be64(zmq_msg_data(&m[1])) + 1;
            close_frames(m, n, 3);
            if (bad) break;
            if (!end && pg->counted) pg->left--;
            if (end || (pg->counted && pg->left == 0)) {
                rc = 0;
                break;
            }
        }
    }
    zmq_close(s);
    return rc;
}

/* The live stream's socket, subscribed and connecting (before any replay,
 * so what is published meanwhile waits in it); NULL after saying why. */
static void *live_open(void *ctx, const char *ep, const char *topic, uint64_t timeout)
{
    void *s = zmq_socket(ctx, ZMQ_SUB);
    int ms = timeout ? (int)timeout : 200, zero = 0;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof ms);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SUBSCRIBE, topic ? topic : "", topic ? strlen(topic) : 0);
    if (curve_client(s, ep)) {
        zmq_close(s);
        return NULL;
    }
    if (zmq_connect(s, ep) != 0) {
        fprintf(stderr, "kvtier events: --endpoint %s: %s\n", ep, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}


/* Batches from the live socket s until --count or the timeout. With a
 * replay endpoint rep, in sequence order and each once: a batch the
 * replay printed already is skipped, and one past the next expected (the
 * ones between were published before this subscription joined) first has
 * the gap printed from the replay. */
static int live(void *ctx, void *s, const char *ep, const char *rep, uint64_t timeout,
                ev_progress *pg)
{
    int rc = 0;
    uint64_t last_ns = kvt__now_ns(); /* --timeout-ms runs from the last batch printed */
    while (!cli_stop && !(pg->counted && pg->left == 0)) {
        zmq_msg_t m[3];
        int n = recv_frames(s, m, 3);
        if (n < 0) {
            if (zmq_errno() == EAGAIN && !timeout) continue; /* waiting for the next batch */
            if (!cli_stop) {
                fprintf(stderr, "kvtier events: no batch from %s within %llu ms%s\n", ep,
                        (unsigned long long)timeout,
                        curve_keys ? " (with --secret-file: is it the server's events_secret_file?)"
                                   : " (a server with events_secret_file sends only to --secret-file)");
                rc = 1;
            }
            break;
        }
        if (n != 3 || zmq_msg_size(&m[1]) != 8) {
            fprintf(stderr, "kvtier events: a message of %d frames, not 3 with an 8-byte "
                    "sequence\n", n);
            close_frames(m, n, 3);
            rc = 1;
            break;
        }
        int64_t seq = be64(zmq_msg_data(&m[1]));
        if (rep && seq > pg->next) {
            int64_t before = pg->next;
            rc = replay(ctx, rep, (uint64_t)pg->next, timeout, pg);
            if (pg->next != before) last_ns = kvt__now_ns();
        }
        bool print = !rc && !(pg->counted && pg->left == 0) && !(rep && seq < pg->next);
        if (print) rc = print_batch(&m[1], &m[2]);
        close_frames(m, n, 3);
        if (rc) break;
        if (!print && timeout && kvt__now_ns() - last_ns > timeout * 1000000ull) {
            /* only batches before --from (or printed already) came meanwhile */
            fprintf(stderr, "kvtier events: no batch from %s past sequence %lld within %llu "
                    "ms\n", ep, (long long)pg->next - 1, (unsigned long long)timeout);
            rc = 1;
            break;
        }
        if (print) {
            pg->next = seq + 1;
            if (pg->counted) pg->left--;
            last_ns = kvt__now_ns();
        }
    }
    return rc;
}

int kvt_cmd_events(int argc, char **argv)
{
    const char *ep = NULL, *rep = NULL, *topic = NULL, *secret_file = NULL;
    uint64_t from = 0, count = 0, timeout = 0;
    bool from_given = false;
    static const char *const takes_value[] = {"--endpoint", "--replay", "--topic", "--secret-file",
                                              "--from", "--count", "--timeout-ms", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("events", a, false);
        if (!v) return cli_bad_arg("events", a, true);
        i++;
        if (!strcmp(a, "--endpoint")) ep = v;
        else if (!strcmp(a, "--replay")) rep = v;
        else if (!strcmp(a, "--topic")) topic = v;
        else if (!strcmp(a, "--secret-file")) secret_file = v;
        else if (!strcmp(a, "--from") && demo_parse_u64(v, &from)) from_given = true;
        else if (!strcmp(a, "--count") && demo_parse_u64(v, &count) && count >= 1) {}
        else if (!strcmp(a, "--timeout-ms") && demo_parse_u64(v, &timeout) && timeout >= 1 &&
                 timeout <= 3600000) {}
        else return cli_bad_value("events", a, v);
    }
    if (!ep && !rep) return usage(stderr, 2);
    if (from_given && !rep) {
        fprintf(stderr, "kvtier events: --from needs --replay (the live stream starts where "
                "it is)\n");
        return 2;
    }
    kvt_events_keys keys;
    if (secret_file) {
        uint8_t *secret = NULL;
        size_t len = 0;
        kvt_status st = kvt__srv_secret_load(secret_file, "kvtier events: --secret-file", &secret, &len);
        if (!st) st = kvt__events_curve_keys(secret, len, &keys);
        kvt__srv_secret_free(secret, len);
        if (st) {
            fprintf(stderr, "%s\n", kvt_last_error());
            return 1;
        }
        curve_keys = &keys;
    }
    cli_stop_on_signals();
    void *ctx = zmq_ctx_new();
    ev_progress pg = {.counted = count > 0, .left = count, .next = (int64_t)from};
    void *sub = ep ? live_open(ctx, ep, topic, timeout) : NULL;
    int rc = ep && !sub;
    if (!rc && rep) rc = replay(ctx, rep, from, timeout, &pg);
    if (!rc && sub) rc = live(ctx, sub, ep, rep, timeout, &pg);
    if (sub) zmq_close(sub);
    zmq_ctx_term(ctx);
    return rc;
}

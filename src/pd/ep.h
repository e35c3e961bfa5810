/* ep.h - what a sender and a receiver share: the room table and its state
 * machine, connections (one thread each, doing all I/O of that link), the
 * service thread (accepts on a sender, enforces room deadlines on both).
 *
 * Locking: ep->mu guards the room table, every room's fields and the conn
 * list; it is never held across I/O. A connection's control queue has its
 * own mutex. A room is refcounted: a connection thread working on a room's
 * pages holds a reference, so clear() never frees memory in use. */
#ifndef KVT_PD_EP_H
#define KVT_PD_EP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include "net/stream.h"
#include "pd/desc.h"
#include "pd/mac.h"
#include "pd/wire.h"
#include "pd/xfer.h"

#define PD_ROOM_BUCKETS 4096
#define PD_MAX_ROOMS 65536
#define PD_MAX_CONNS 256
/* Sender: connections that have not registered yet (authenticating, or
 * silent) hold at most this many link slots; a new one evicts the oldest.
 * Each must authenticate within min(peer_timeout_ms, PD_GREET_MS). */
#define PD_MAX_GREETING 16
#define PD_GREET_MS 2000u
/* Rooms decode ranks may open before this prefill rank's engine claims
 * them: per decode identity (its address and position, over all of its
 * links: a rank that reconnects or dials many times shares one budget), and
 * in all, so the engine's own kvt_pd_sender_room always finds half of the
 * table free whatever strangers do. */
#define PD_MAX_UNCLAIMED (PD_MAX_ROOMS / 16)
#define PD_MAX_UNCLAIMED_ALL (PD_MAX_ROOMS / 2)
#define PD_BATCH_BYTES (8u << 20) /* one DATA frame: amortises headers and syscalls */
#define PD_BATCH_BYTES_UCX (64u << 20) /* over UCX (capped by max_frame): longer per-entry runs */
#define PD_CHUNK_BYTES (1u << 20) /* a batch moves (and is hashed) in chunks this big: cache-sized */
/* A DATA batch (up to 64 MiB) lands within PD_LAND_FACTOR x peer_timeout_ms
 * in all: its payload and checksums within (PD_LAND_FACTOR - 2) x, failing
 * sooner only when peer_timeout_ms pass without a byte (a slow link that
 * keeps moving is not a silent peer; the bound still ends a trickling
 * one); a hand-off to the checksum thread blocked within that (one more),
 * and the thread's last chunks (one more). clear and abort wait for a
 * landing that long (+1 s). */
#define PD_LAND_FACTOR 4u
#define PD_MSG 160
/* Decode pages per DATA batch, at most: each page has a streaming hash
 * state (~576 B) on both sides, so this bounds them to ~2.3 MiB a link
 * whatever the page size (tiny pages make more, smaller batches). */
#define PD_BATCH_MAX_PAGES 4096u

typedef struct pd_ep pd_ep;
typedef struct pd_room pd_room;

typedef struct pd_frame {
    struct pd_frame *next;
    uint16_t type;
    uint64_t room;
    uint32_t gen;
    size_t len;
    uint8_t data[];
} pd_frame;

typedef struct pd_job {
    struct pd_job *next;
    pd_room *room; /* referenced */
    uint32_t target, gen;
    bool begun;
    uint32_t next_page, end_page, first_page;
} pd_job;

typedef struct pd_conn {
    pd_ep *ep;
    uint32_t idx;
    kvt_stream *s;
    pthread_t th;
    bool started;
    int wake[2];
    pthread_mutex_t qmu;
    pd_frame *qhead, *qtail;
    uint32_t qlen;
    pd_desc peer;
    pd_plan plan;
    bool has_plan;
    uint32_t expected;  /* receiver: decode ranks that open each room on this peer */
    uint32_t max_frame; /* the smaller of both sides' max_frame: nothing larger is sent */
    uint32_t unclaimed; /* sender: rooms this link opened that the engine has not claimed */
    char host[48];      /* sender: the peer's address (its identity with peer's position) */
    char addr[64];      /* sender: host:port, for messages */
    atomic_bool dead;
    atomic_bool finished;
    bool registered; /* sender: passed the handshake and registration */
    atomic_bool evicted; /* sender: shut down to make room for a newer connection */
    int fd;              /* sender: the TCP socket (kept under UCX too), for eviction */
    uint64_t accepted_ns, used_ns; /* sender: accept; the last ROOM frame (or registration) */
    uint64_t last_rx, last_tx;
    pd_job *jobs, *jobs_tail; /* sender: guarded by ep->mu */
    pd_mac *mac;  /* the link's frame keys (pd/mac.h); NULL without a secret */
    uint8_t tag[PD_TAG_LEN]; /* sender: a DATA frame's tag, while it goes out */
    pd_iovs iov;
    uint64_t *sums;
    uint32_t sums_cap;
    pd_hashes hs; /* a DATA batch's page hashes, fed chunk by chunk */
    struct pd_hasher *hasher; /* feeds hs on its own thread (ep->hash_thread), from the first batch */
    bool hasher_failed;       /* could not start one: this link hashes on its own thread */
    uint8_t *body;
    size_t body_cap;
    uint64_t batches;
    char name[128];
} pd_conn;

typedef struct pd_target {
    uint32_t conn;
    uint32_t gen;   /* the decode rank's generation of the room */
    uint32_t *pages, num_pages;
    bool done_sent; /* the sender sent this target's DONE */
    bool done;      /* and the decode rank acknowledged it */
} pd_target;

struct pd_room {
    uint64_t id;
    pd_room *next;
    int refs;
    bool cleared, claimed, started;
    uint32_t gen;     /* receiver: this opening's generation (wire.h) */
    uint32_t landing; /* receiver: link threads writing a batch into the pages now */
    uint32_t opener;  /* sender: the link that created it unclaimed (UINT32_MAX: none) */
    kvt_pd_poll state;
    kvt_status err;
    char msg[PD_MSG];
    uint64_t deadline_ns, failed_ns;
    uint64_t bytes;
    uint32_t abort_acks, peers;
    uint32_t prefix, ntok;
    /* sender */
    uint32_t expected, ntargets, tcap, acked;
    pd_target *targets;
    uint32_t *src_pages, n_src, src_ntok;
    bool have_input;
    /* receiver */
    uint32_t *dst_pages, n_dst;
    uint32_t *next_page;
    uint8_t *peer_done;
    uint32_t ndone, sent_reqs;
};

typedef struct pd_ep_hooks {
    /* Handles one frame (body read into c->body); a non-OK status kills the link. */
    kvt_status (*frame)(pd_conn *c, const pd_hdr *h);
    /* Sender: does one unit of data work; *busy = more is pending. */
    kvt_status (*work)(pd_conn *c, bool *busy);
    /* The link died: fail the rooms it carried (ep->mu held); returns how
     * many rooms that failed. */
    uint32_t (*dead)(pd_conn *c, kvt_status st, const char *why);
    /* A queued frame went out (ep->mu not held). */
    void (*sent)(pd_conn *c, const pd_frame *f);
} pd_ep_hooks;

struct pd_ep {
    int role;
    const pd_ep_hooks *hooks;
    kvt_pd_net_params net;
    uint8_t *secret;
    char bind_host[64];
    kvt_stream_auth auth;
    pd_desc desc;
    kvt_geometry *geo;
    kvt_page_map *map;
    uint32_t engine_pages;
    uint32_t t_boot, t_wait, t_xfer;
    bool hash_thread; /* each link hashes on a checksum thread (params.checksum_threads) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pd_room *buckets[PD_ROOM_BUCKETS];
    uint32_t nrooms;
    uint32_t unclaimed; /* sender: rooms decode ranks opened, not claimed (all links) */
    uint32_t next_gen; /* receiver: generation of the next opened room */
    pd_conn *conns[PD_MAX_CONNS];
    uint32_t nconns;
    int lfd;
    uint16_t port;
    pthread_t svc;
    bool svc_started;
    atomic_bool stop;
    uint64_t corrupt_batch; /* tests: flip a checksum of this batch (1-based; 0: never), */
    uint32_t corrupt_index; /* that of its page corrupt_index % pages (0: the first) */
    _Atomic uint32_t stall_landing_ms; /* tests: a receiver's link thread sleeps this long
                                        * after each batch's checksums (a descheduled thread) */
};

/* A listener (sender, bootstrap) beyond loopback needs a secret or
 * allow_insecure: KVT_EINVAL naming the address otherwise. */
kvt_status pd_net_exposed(const kvt_pd_net_params *n, const char *fn);
/* Validates net params and fills defaults; copies the secret into *secret
 * (the caller frees) and the host into host[64]. */
kvt_status pd_net_defaults(kvt_pd_net_params *n, uint8_t **secret, char *host, const char *fn);
/* Setup shared by both roles (copies params, builds desc and page map). */
kvt_status pd_ep_init(pd_ep *ep, const kvt_pd_params *p, int role, const char *fn);
void pd_ep_fini(pd_ep *ep);
void pd_ep_stop(pd_ep *ep);
/* Called by the service thread every tick (senders accept here). */
typedef void (*pd_tick_fn)(pd_ep *ep);
/* tick NULL: the thread only sleeps a tick between deadline checks. */
kvt_status pd_ep_start_service_tick(pd_ep *ep, pd_tick_fn tick);

/* Connections. */
kvt_status pd_conn_new(pd_ep *ep, kvt_stream *s, pd_conn **out);
kvt_status pd_conn_start(pd_conn *c, void *(*fn)(void *));
void *pd_conn_main(void *arg); /* the I/O loop */
/* Queues a control frame (copied) and wakes the thread. */
void pd_conn_queue(pd_conn *c, const pd_hdr *h, const void *body, size_t blen);
void pd_conn_queue_msg(pd_conn *c, uint16_t type, uint64_t room, uint32_t gen, kvt_status st,
                       const char *msg);
/* Takes the oldest queued frame off the queue (NULL: none); the caller frees it. */
pd_frame *pd_conn_pop_frame(pd_conn *c);
/* Sends one frame of header and body now (conn thread or before the thread
 * starts); DATA frames and their payload go out through sender.c. */
kvt_status pd_conn_send(pd_conn *c, const pd_hdr *h, const void *body, size_t blen);
/* Reads one frame's header and body (bounded by max_frame) into c->body,
 * checking their tags on an authenticated link (KVT_EAUTH naming the link);
 * a DATA frame's payload and tag are the caller's to read (on_data). */
kvt_status pd_conn_read(pd_conn *c, pd_hdr *h, uint64_t deadline_ns);
uint64_t pd_conn_deadline(const pd_conn *c);
/* The bound of a DATA batch's payload and checksums, and of a drained one
 * (PD_LAND_FACTOR). */
uint64_t pd_conn_land_deadline(const pd_conn *c);
void pd_conn_free(pd_conn *c);
/* Hashes entry e's pieces of decode pages [ja, jb) of the link's batch into
 * c->hs (state j - base): on the link's checksum thread when the endpoint
 * has them (started at the first chunk; hasher.h), else right here. x must
 * stay valid, and the pages unchanged, until pd_conn_hashed returns. */
kvt_status pd_conn_hash(pd_conn *c, const pd_xfer *x, uint32_t e, uint32_t ja, uint32_t jb,
                        uint32_t base);
/* The direction a link's DATA tag runs in: tx on a sender, rx on a
 * receiver (NULL: not authenticated). */
pd_mac_dir *pd_conn_data_mac(pd_conn *c);
/* Waits until every chunk pd_conn_hash took is in c->hs (at once without a
 * checksum thread): before reading digests, resetting the states, or
 * letting the batch's pages go, on failure as on success. */
kvt_status pd_conn_hashed(pd_conn *c);

/* Rooms (ep->mu held). */
pd_room *pd_room_find(pd_ep *ep, uint64_t id);
kvt_status pd_room_add(pd_ep *ep, uint64_t id, pd_room **out);
void pd_room_unref(pd_room *r);
void pd_room_remove(pd_ep *ep, pd_room *r);
/* The engine claimed r, or it goes: its opener's unclaimed count drops. */
void pd_room_unclaimed_done(pd_ep *ep, pd_room *r);
/* Forward-only: ignored when not later than the current state or terminal. */
void pd_room_advance(pd_ep *ep, pd_room *r, kvt_pd_poll to);
/* The state poll/wait/info report: a failed room still reads TRANSFERRING
 * while a batch is being written into its pages, so that an engine that
 * sees FAILED (or returns from clear/abort) can reuse the pages at once. */
kvt_pd_poll pd_room_seen_state(const pd_room *r);
/* Waits (ep->mu held) until no batch is landing in r, up to the link
 * deadline that bounds every landing; KVT_ETIMEDOUT with a message if not. */
kvt_status pd_room_wait_landed(pd_ep *ep, pd_room *r, const char *fn);
/* The generation a room's frames to link conn carry (ep->mu held). */
uint32_t pd_room_gen(const pd_ep *ep, const pd_room *r, uint32_t conn);
/* Fails a live room (no-op when terminal); returns whether it changed. */
bool pd_room_fail(pd_ep *ep, pd_room *r, kvt_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool pd_room_terminal(const pd_room *r);

/* One request/response with the bootstrap service: sends h + body, reads
 * the answer into *resp_body (malloc'd, may be NULL) on PD_F_OK/PD_F_TOPO;
 * PD_F_REFUSE becomes its status with the service's message, PD_F_RETRY
 * KVT_EAGAIN. m: the connection's frame keys (mac.h; NULL: none). */
kvt_status pd_bootstrap_call_ex(kvt_stream *s, pd_mac *m, const pd_hdr *h, const void *body,
                                const kvt_pd_net_params *net, uint64_t dl, const char *what,
                                uint8_t **resp_body, uint32_t *resp_len);
kvt_status pd_bootstrap_call(kvt_stream *s, pd_mac *m, const pd_hdr *h, const void *body,
                             const kvt_pd_net_params *net, uint64_t dl, const char *what);
/* Tests: the endpoint inside a public handle. */
pd_ep *pd_sender_ep(kvt_pd_sender *s);
pd_ep *pd_receiver_ep(kvt_pd_receiver *r);

void pd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The peer of socket fd: host[hn] and "host:port" in addr[an] ("?" when
 * the socket cannot say). */
void pd_peer_addr(int fd, char *host, size_t hn, char *addr, size_t an);

/* Pages one DATA batch of link c may carry: its checksum trailer fits in
 * max_frame, and PD_BATCH_MAX_PAGES bounds the hash states. The sender cuts
 * batches by it and the receiver refuses more, so both use this one. */
static inline uint32_t pd_batch_max_pages(const pd_conn *c)
{
    return c->max_frame / 8 < PD_BATCH_MAX_PAGES ? c->max_frame / 8 : PD_BATCH_MAX_PAGES;
}

/* Public-API helpers shared by sender and receiver. */
kvt_status pd_ep_poll(pd_ep *ep, uint64_t room, kvt_pd_poll *out, const char *fn);
kvt_status pd_ep_wait(pd_ep *ep, uint64_t room, int64_t timeout_ms, kvt_pd_poll *out, const char *fn);
kvt_status pd_ep_clear(pd_ep *ep, uint64_t room, const char *fn);
kvt_status pd_ep_info(pd_ep *ep, uint64_t room, kvt_pd_room_info *out, const char *fn);
/* Fails the room and sends ABORT to conns[idx] for each idx in peers. */
kvt_status pd_ep_abort(pd_ep *ep, uint64_t room, const char *reason, const char *fn);
/* The conns a room involves (ep->mu held); returns the count written. */
uint32_t pd_room_conns(pd_ep *ep, pd_room *r, uint32_t *out, uint32_t max);
/* Tells a failed room's peers (except `except`) why (ep->mu held). */
void pd_room_notify(pd_ep *ep, pd_room *r, uint32_t except);

#endif

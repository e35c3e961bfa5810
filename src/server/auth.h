/* auth.h - who may attach to the node server and what it may use
 * (docs/server.md, Security): the socket's group, the peer's credentials,
 * the shared secret, and the namespaces each client may use. */
#ifndef KVT_SERVER_AUTH_H
#define KVT_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvtier.h"

#define KVT_SRV_MAX_GROUPS 64   /* a peer's groups looked at (SO_PEERGROUPS) */
#define KVT_SRV_MAX_NS_RULES 64
#define KVT_SRV_MAX_NS_NAMES 256 /* over all rules */
#define KVT_SRV_SECRET_MIN 16
#define KVT_SRV_SECRET_MAX 1024

/* A peer as SO_PEERCRED and SO_PEERGROUPS describe it. */
typedef struct kvt_srv_peer {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gid_t groups[KVT_SRV_MAX_GROUPS];
    uint32_t ngroups;
} kvt_srv_peer;

/* One rule of server_namespaces: WHO=NS[,NS...]. */
typedef struct kvt_srv_ns_rule {
    enum { NS_WHO_UID, NS_WHO_GID, NS_WHO_ANY } who;
    uint32_t id;
    uint32_t first, count; /* its names: ns_names[first .. first + count) */
} kvt_srv_ns_rule;

typedef struct kvt_srv_ns_rules {
    bool on; /* false: the option is empty, every namespace allowed */
    kvt_srv_ns_rule rule[KVT_SRV_MAX_NS_RULES];
    uint32_t nrules;
    char *names[KVT_SRV_MAX_NS_NAMES]; /* "-" the default namespace, "*" any */
    uint32_t nnames;
} kvt_srv_ns_rules;

/* Parses server_namespaces; KVT_EINVAL names the bad rule. */
kvt_status kvt__srv_ns_parse(const char *spec, kvt_srv_ns_rules *out);
void kvt__srv_ns_free(kvt_srv_ns_rules *r);
/* Whether a rule matching peer lists namespace ns (ns_len bytes). */
bool kvt__srv_ns_allowed(const kvt_srv_ns_rules *r, const kvt_srv_peer *peer, const void *ns,
                         uint32_t ns_len);

/* The gid of group name; KVT_EINVAL naming it when there is no such group. */
kvt_status kvt__srv_group(const char *name, gid_t *out);
/* The credentials of the peer of a connected Unix socket. */
kvt_status kvt__srv_peer(int fd, kvt_srv_peer *out);
/* Whether peer is, or belongs to, gid. */
bool kvt__srv_peer_in_group(const kvt_srv_peer *peer, gid_t gid);

/* Reads the secret file (16..1024 bytes, a regular file); who names the
 * option for messages. The caller frees *out with sodium_free semantics:
 * kvt__srv_secret_free. */
kvt_status kvt__srv_secret_load(const char *path, const char *who, uint8_t **out, size_t *len);
void kvt__srv_secret_free(uint8_t *p, size_t len);

#endif

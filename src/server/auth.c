/* auth.c - who may attach to the node server and which namespaces it may
 * use (auth.h). Everything here parses operator input (options) or reads
 * kernel-reported credentials; nothing trusts what a client says of itself. */
#include "server/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/parse.h"

static const char OPT[] = "server_namespaces";

static kvt_status parse_who(const char *who, kvt_srv_ns_rule *r)
{
    uint64_t id = 0;
    if (!strcmp(who, "*")) {
        r->who = NS_WHO_ANY;
        return KVT_OK;
    }
    bool uid = !strncmp(who, "uid:", 4), gid = !strncmp(who, "gid:", 4);
    if ((uid || gid) && kvt__parse_u64(who + 4, &id) && id <= UINT32_MAX) {
        r->who = uid ? NS_WHO_UID : NS_WHO_GID;
        r->id = (uint32_t)id;
        return KVT_OK;
    }
    return kvt__fail(KVT_EINVAL, "%s: \"%s\" is not uid:N, gid:N or *", OPT, who);
}

/* NS[,NS...] of one rule into r's names. */
static kvt_status parse_names(char *list, kvt_srv_ns_rules *r, kvt_srv_ns_rule *rule)
{
    rule->first = r->nnames;
    char *save = NULL;
    for (char *n = strtok_r(list, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
        if (!*n) continue;
        if (r->nnames == KVT_SRV_MAX_NS_NAMES)
            return kvt__fail(KVT_EINVAL, "%s: more than %u namespaces", OPT, KVT_SRV_MAX_NS_NAMES);
        if (!(r->names[r->nnames] = strdup(n))) return kvt__fail(KVT_ENOMEM, "%s: no memory", OPT);
        r->nnames++;
    }
    rule->count = r->nnames - rule->first;
    return KVT_OK;
}

static kvt_status parse_rule(char *text, kvt_srv_ns_rules *r)
{
    char *eq = strchr(text, '=');
    if (!eq) return kvt__fail(KVT_EINVAL, "%s: rule \"%s\" has no '=' (WHO=NS[,NS...])", OPT, text);
    *eq = '\0';
    if (r->nrules == KVT_SRV_MAX_NS_RULES)
        return kvt__fail(KVT_EINVAL, "%s: more than %u rules", OPT, KVT_SRV_MAX_NS_RULES);
    kvt_srv_ns_rule *rule = &r->rule[r->nrules];
    kvt_status st = parse_who(text, rule);
    if (!st) st = parse_names(eq + 1, r, rule);
    if (!st) r->nrules++;
    return st;
}

kvt_status kvt__srv_ns_parse(const char *spec, kvt_srv_ns_rules *out)
{
    memset(out, 0, sizeof *out);
    char *copy = strdup(spec);
    if (!copy) return kvt__fail(KVT_ENOMEM, "%s: no memory", OPT);
    kvt_status st = KVT_OK;
    char *save = NULL;
    for (char *t = strtok_r(copy, ";", &save); t && !st; t = strtok_r(NULL, ";", &save)) {
        while (*t == ' ') t++;
        if (*t) st = parse_rule(t, out);
    }
    free(copy);
    out->on = out->nrules > 0;
    if (st) kvt__srv_ns_free(out);
    return st;
}

void kvt__srv_ns_free(kvt_srv_ns_rules *r)
{
    for (uint32_t i = 0; i < r->nnames; i++) free(r->names[i]);
    memset(r, 0, sizeof *r);
}

static bool rule_matches(const kvt_srv_ns_rule *rule, const kvt_srv_peer *p)
{
    switch (rule->who) {
    case NS_WHO_ANY: return true;
    case NS_WHO_UID: return p->uid == rule->id;
    default: return kvt__srv_peer_in_group(p, rule->id);
    }
}

static bool name_matches(const char *name, const void *ns, uint32_t ns_len)
{
    if (!strcmp(name, "*")) return true;
    if (!strcmp(name, "-")) return ns_len == 0;
    return strlen(name) == ns_len && memcmp(name, ns, ns_len) == 0;
}

bool kvt__srv_ns_allowed(const kvt_srv_ns_rules *r, const kvt_srv_peer *peer, const void *ns,
                         uint32_t ns_len)
{
    if (!r->on) return true;
    for (uint32_t i = 0; i < r->nrules; i++) {
        const kvt_srv_ns_rule *rule = &r->rule[i];
        if (!rule_matches(rule, peer)) continue;
        for (uint32_t j = rule->first; j < rule->first + rule->count; j++)
            if (name_matches(r->names[j], ns, ns_len)) return true;
    }
    return false;
}

kvt_status kvt__srv_group(const char *name, gid_t *out)
{
    struct group g, *res = NULL;
    char buf[16384];
    int e = getgrnam_r(name, &g, buf, sizeof buf, &res);
    if (e || !res)
        return kvt__fail(KVT_EINVAL, "kvt_server_create: server_socket_group \"%s\" is not a group "
                         "on this host%s%s", name, e ? ": " : "", e ? strerror(e) : "");
    *out = res->gr_gid;
    return KVT_OK;
}

kvt_status kvt__srv_peer(int fd, kvt_srv_peer *out)
{
    memset(out, 0, sizeof *out);
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return kvt__fail(KVT_ESYS, "SO_PEERCRED failed: %s", strerror(errno));
    out->pid = cr.pid;
    out->uid = cr.uid;
    out->gid = cr.gid;
    /* Supplementary groups (Linux 4.13+); a peer in more than the bound is
     * judged by the first KVT_SRV_MAX_GROUPS (the kernel fails with ERANGE:
     * then its primary group alone counts). */
    len = sizeof out->groups;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, out->groups, &len) == 0)
        out->ngroups = len / sizeof(gid_t);
    return KVT_OK;
}

bool kvt__srv_peer_in_group(const kvt_srv_peer *peer, gid_t gid)
{
    if (peer->gid == gid) return true;
    for (uint32_t i = 0; i < peer->ngroups; i++)
        if (peer->groups[i] == gid) return true;
    return false;
}

kvt_status kvt__srv_secret_load(const char *path, const char *who, uint8_t **out, size_t *len)
{
    /* sodium_malloc aborts before it (idempotent, thread-safe: every
     * caller, the CLI's included, is covered here) */
    if (sodium_init() < 0) return kvt__fail(KVT_ESYS, "%s: libsodium failed to initialise", who);
    uint8_t *buf = sodium_malloc(KVT_SRV_SECRET_MAX + 1);
    if (!buf) return kvt__fail(KVT_ENOMEM, "%s: no memory for the secret", who);
    ssize_t n = 0;
    kvt_status st = kvt__read_user_file(path, who, "secret", buf, KVT_SRV_SECRET_MAX + 1, &n);
    if (st) {
        sodium_free(buf);
        return st;
    }
    if (n < KVT_SRV_SECRET_MIN || n > KVT_SRV_SECRET_MAX) {
        sodium_free(buf);
        return kvt__fail(KVT_EINVAL, "%s: secret file %s holds %s%zd bytes (16..1024)", who, path,
                         n > KVT_SRV_SECRET_MAX ? "over " : "", n > KVT_SRV_SECRET_MAX ?
                         (ssize_t)KVT_SRV_SECRET_MAX : n);
    }
    *out = buf;
    *len = (size_t)n;
    return KVT_OK;
}

void kvt__srv_secret_free(uint8_t *p, size_t len)
{
    (void)len;
    if (p) sodium_free(p);
}

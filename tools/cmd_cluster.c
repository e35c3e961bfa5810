/* cmd_cluster.c - `kvtier cluster status --redis ADDR [--prefix P]
 * [--redis-password-file F] [--json]`: what the cluster directory (docs/cluster.md) says now: how it
 * is reached (one Redis, a Sentinel's primary, a Redis Cluster) and every
 * node with a live lease: its id, where peers pull from it, its epoch
 * (one more at each start), how long its lease has left, and the blocks
 * and bytes it holds, with how many of those blocks have a CPU copy and how
 * many a durable SSD copy (as it last wrote them, with its lease renewal;
 * "-" where a node of an older version wrote no tiers). Exit 0; 1 when
 * the directory cannot be read; 2 on usage. Bounded by --timeout-ms per
 * Redis round trip (default 2000). It registers as no node: it opens the
 * directory as a watcher (node id "kvtier-cli-<pid>", no lease kept). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "cluster/dir.h"
#include "cmds.h"
#include "kvtier.h"

#define MAX_NODES 1024

static int usage(FILE *f, int rc)
{
    fprintf(f,
            "usage: kvtier cluster status --redis ADDR [--redis-password-file F]\n"
            "                             [--redis-user NAME] [--sentinel-password-file F]\n"
            "                             [--prefix P] [--timeout-ms MS] [--json]\n"
            "  --redis ADDR    the nodes' cluster_redis: host:port, sentinel://H:P/NAME or\n"
            "                  cluster://H:P[,H:P]\n"
            "  --redis-password-file F  the nodes' cluster_redis_password_file (Redis AUTH)\n"
            "  --redis-user NAME  the nodes' cluster_redis_user (a Redis ACL user)\n"
            "  --sentinel-password-file F  the nodes' cluster_sentinel_password_file\n"
            "  --prefix P      the directory's key prefix (default kvt:)\n"
            "  --timeout-ms MS one Redis round trip's bound (default 2000)\n"
            "  --json          one JSON object: {\"topology\":..,\"nodes\":[{\"node\",\"addr\",\n"
            "                  \"epoch\",\"lease_left_ms\",\"blocks\",\"bytes\",\"cpu_blocks\",\n"
            "                  \"ssd_blocks\"},..]} (the tiers' null for a node that wrote none)\n");
    return rc;
}

/* A tier's block count, or what stands for none (an older node's holding). */
static const char *tier_count(const kvt_dir_holding *h, uint64_t v, const char *none, char *buf,
                              size_t len)
{
    if (!h->tiers) return none;
    snprintf(buf, len, "%llu", (unsigned long long)v);
    return buf;
}

static void print_json(const char *topo, const kvt_dir_node *v, uint32_t n, uint32_t total)
{
    printf("{\"topology\":\"%s\",\"node_count\":%u,\"nodes\":[", topo, total);
    for (uint32_t i = 0; i < n; i++) {
        const kvt_dir_holding *h = &v[i].held;
        char c[24], s[24];
        printf("%s{\"node\":\"%s\",\"addr\":\"%s\",\"epoch\":%llu,\"lease_left_ms\":%lld,"
               "\"blocks\":%llu,\"bytes\":%llu,\"cpu_blocks\":%s,\"ssd_blocks\":%s}", i ? "," : "",
               v[i].node, v[i].addr, (unsigned long long)v[i].epoch, (long long)v[i].lease_left_ms,
               (unsigned long long)h->blocks, (unsigned long long)h->bytes,
               tier_count(h, h->cpu_blocks, "null", c, sizeof c),
               tier_count(h, h->ssd_blocks, "null", s, sizeof s));
    }
    printf("]}\n");
}

static void print_text(const char *topo, const kvt_dir_node *v, uint32_t n, uint32_t total)
{
    printf("directory: %s\nnodes: %u\n", topo, total);
    if (n)
        printf("%-24s %-24s %8s %14s %10s %10s %10s %14s\n", "NODE", "PULL ADDRESS", "EPOCH",
               "LEASE LEFT MS", "BLOCKS", "CPU", "SSD", "BYTES");
    for (uint32_t i = 0; i < n; i++) {
        const kvt_dir_holding *h = &v[i].held;
        char c[24], s[24];
        printf("%-24s %-24s %8llu %14lld %10llu %10s %10s %14llu\n", v[i].node, v[i].addr,
               (unsigned long long)v[i].epoch, (long long)v[i].lease_left_ms,
               (unsigned long long)h->blocks, tier_count(h, h->cpu_blocks, "-", c, sizeof c),
               tier_count(h, h->ssd_blocks, "-", s, sizeof s), (unsigned long long)h->bytes);
    }
}

static int status_main(int argc, char **argv)
{
    const char *redis = NULL, *prefix = NULL, *pwfile = NULL, *user = NULL, *spwfile = NULL;
    uint64_t timeout = 2000;
    bool json = false;
    static const char *const takes_value[] = {"--redis", "--prefix", "--redis-password-file",
                                              "--redis-user", "--sentinel-password-file",
                                              "--timeout-ms", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("cluster status", a, false);
        if (!v) return cli_bad_arg("cluster status", a, true);
        i++;
        if (!strcmp(a, "--redis")) redis = v;
        else if (!strcmp(a, "--prefix")) prefix = v;
        else if (!strcmp(a, "--redis-password-file")) pwfile = v;
        else if (!strcmp(a, "--redis-user")) user = v;
        else if (!strcmp(a, "--sentinel-password-file")) spwfile = v;
        else if (!demo_parse_u64(v, &timeout) || timeout < 1 || timeout > 600000)
            return cli_bad_value("cluster status", a, v); /* --timeout-ms */
    }
    if (!redis) return usage(stderr, 2);
    char node[KVT_DIR_NODE_MAX];
    snprintf(node, sizeof node, "kvtier-cli-%ld", (long)getpid());
    char password[KVT_DIR_PASSWORD_MAX + 1] = "", spw[KVT_DIR_PASSWORD_MAX + 1] = "";
    kvt_dir_config dc = {.redis = redis, .password = password, .user = user,
                         .sentinel_password = spw, .prefix = prefix,
                         .node = node,
                         .lease_ms = 100, .timeout_ms = (uint32_t)timeout, .watch_only = true};
    kvt_dir *d = NULL;
    kvt_status st = pwfile ? kvt__dir_password_load(pwfile, "--redis-password-file", password)
                           : KVT_OK;
    if (!st && spwfile) st = kvt__dir_password_load(spwfile, "--sentinel-password-file", spw);
    if (!st) st = kvt__dir_open(&d, &dc);
    explicit_bzero(password, sizeof password);
    explicit_bzero(spw, sizeof spw);
    kvt_dir_node *v = calloc(MAX_NODES, sizeof *v);
    uint32_t n = 0;
    if (!st && !v) st = KVT_ENOMEM;
    if (!st) st = kvt__dir_nodes(d, v, MAX_NODES, &n);
    if (st) {
        fprintf(stderr, "kvtier cluster status: %s (%s)\n", kvt_last_error(), kvt_status_name(st));
        kvt__dir_close(d);
        free(v);
        return 1;
    }
    char topo[256];
    kvt__dir_topology(d, topo, sizeof topo);
    uint32_t shown = n < MAX_NODES ? n : MAX_NODES;
    if (json) print_json(topo, v, shown, n);
    else print_text(topo, v, shown, n);
    kvt__dir_close(d);
    free(v);
    return 0;
}

int kvt_cmd_cluster(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "status")) return status_main(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return usage(stdout, 0);
    if (argc < 2) return usage(stderr, 2);
    return cli_bad_arg("cluster", argv[1], false);
}

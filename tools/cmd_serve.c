/* cmd_serve.c - `kvtier serve [--socket PATH] [--config FILE] [options]`:
 * the node server in the foreground (docs/server.md). SIGTERM or SIGINT
 * stop it cleanly: clients are disconnected (their tasks released) and
 * pending SSD writes get server_stop_ms to become durable. SIGHUP reopens
 * the log file (KVTIER_LOG=path; logrotate). Under systemd (NOTIFY_SOCKET
 * set) it sends READY=1 once it listens and STOPPING=1 when it stops.
 * Exit 0 on a clean stop, 1 on failure, 2 on usage. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "cli_util.h"
#include "cmds.h"
#include "util/log.h"

static kvt_server *g_server;

static void on_signal(int sig)
{
    if (sig == SIGHUP) {
        kvt__log_reopen(); /* async-signal-safe: one atomic store */
        return;
    }
    kvt_server_stop(g_server); /* async-signal-safe: one write to a pipe */
}

/* systemd's notification protocol (sd_notify(3)) by hand: one datagram to
 * the socket NOTIFY_SOCKET names ('@' is the abstract namespace). Best
 * effort: a missing or full socket is not the server's failure. */
static void notify_systemd(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t len = path ? strlen(path) : 0;
    if (len < 2 || len >= sizeof a.sun_path || (path[0] != '/' && path[0] != '@')) return;
    memcpy(a.sun_path, path, len);
    if (path[0] == '@') a.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    (void)sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&a,
                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
    close(fd);
}

/* --layers: *geo becomes a geometry of `layers` layers like the preset's
 * first (presets are uniform), as one pipeline-parallel stage holds them.
 * 0, or 1 with the reason printed. */
static int stage_geometry(kvt_geometry **geo, uint64_t layers)
{
    kvt_geometry_info gi;
    kvt_layer_spec spec;
    kvt_status st = kvt_geometry_info_get(*geo, &gi);
    if (!st) st = kvt_geometry_layer(*geo, 0, &spec);
    if (st) return demo_error("--layers", st);
    if (layers > gi.num_layers) {
        fprintf(stderr, "kvtier: --layers %llu: the model has %u layers (a stage holds "
                "some of them)\n", (unsigned long long)layers, gi.num_layers);
        return 1;
    }
    kvt_geometry *stage = NULL;
    st = kvt_geometry_create(&stage, (uint32_t)layers, gi.tokens_per_page, gi.layout);
    if (!st) st = kvt_geometry_set_layers(stage, 0, (uint32_t)layers, &spec);
    if (st) {
        kvt_geometry_destroy(stage);
        return demo_error("--layers", st);
    }
    kvt_geometry_destroy(*geo);
    *geo = stage;
    return 0;
}

static int usage(FILE *f, int rc)
{
    fprintf(f,
            "usage: kvtier serve [--socket PATH] [--config FILE] [--model M] [--tp N] [--page T]\n"
            "                    [--layers L] [--set NAME=VALUE]...\n"
            "  --socket PATH   the Unix socket clients attach to (option server_socket: it may\n"
            "                  come from --config, KVTIER_SERVER_SOCKET or --set instead)\n"
            "  --config FILE   a JSON object of options (kvtier config --dump lists them);\n"
            "                  KVTIER_* environment variables apply on top, then --set\n"
            "  (no --model)    serve any geometry: each engine attaches with its own (any\n"
            "                  model, TP slice, dtype, page size); up to server_max_geometries\n"
            "                  (default 4) at once, each in its own share of the capacities\n"
            "  --model M       declare the geometry served instead: tiny, llama3-8b,\n"
            "                  llama3-70b, deepseek-v3; its tier is made at start and holds\n"
            "                  the whole capacity (server_max_geometries 1 unless set)\n"
            "  --tp N          with --model: tensor-parallel size of the ranks (default 1)\n"
            "  --page T        with --model: the engines' tokens per page (default 16)\n"
            "  --layers L      with --model: serve L of the model's layers, one pipeline-\n"
            "                  parallel stage's share (default: all; presets' layers are alike)\n"
            "  --set N=V       one option, e.g. --set cpu_capacity=8GiB --set ssd_dirs=/nvme/kv\n"
            "Signals: TERM/INT stop cleanly; HUP reopens the log file (KVTIER_LOG=path).\n"
            "Logs: KVTIER_LOG (stderr, off or a file), KVTIER_LOG_FORMAT (text, json, plain).\n"
            "systemd: Type=notify works (READY=1 once listening, STOPPING=1 at stop).\n");
    return rc;
}

int kvt_cmd_serve(int argc, char **argv)
{
    const char *socket_path = NULL, *config = NULL, *model = NULL;
    uint64_t tp = 0, page = 0, layers = 0;
    kvt_config *cfg = NULL;
    kvt_status st = kvt_config_create(&cfg);
    if (st) return demo_error("config", st);
    int rc = 2;
    /* An operator's server logs attaches and detaches (info); a config
     * file, KVTIER_LOG_LEVEL or --set log_level=... override this. */
    if ((st = kvt_config_set(cfg, "log_level", "info"))) {
        kvt_config_destroy(cfg);
        return demo_error("log_level", st);
    }
    const char *sets[64];
    int nsets = 0;
    static const char *const takes_value[] = {"--socket", "--config", "--model", "--tp", "--page",
                                              "--layers", "--set", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            rc = usage(stdout, 0);
            goto out;
        }
        if (!cli_arg_in(a, takes_value) || !v) {
            rc = cli_bad_arg("serve", a, cli_arg_in(a, takes_value));
            goto out;
        }
        i++;
        if (!strcmp(a, "--socket")) socket_path = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tp") && demo_parse_u64(v, &tp) && tp >= 1 && tp <= 1024) {}
        else if (!strcmp(a, "--page") && demo_parse_u64(v, &page) && page >= 1 && page <= 65536) {}
        else if (!strcmp(a, "--layers") && demo_parse_u64(v, &layers) && layers >= 1) {}
        else if (!strcmp(a, "--set") && nsets < 64) sets[nsets++] = v;
        else if (!strcmp(a, "--set")) {
            fprintf(stderr, "kvtier serve: more than 64 --set options; put the rest in a "
                            "--config file (kvtier serve --help)\n");
            rc = 2;
            goto out;
        } else {
            rc = cli_bad_value("serve", a, v);
            goto out;
        }
    }
    if (!model && (tp || page || layers)) {
        fprintf(stderr, "kvtier serve: --tp, --page and --layers describe a --model; without "
                "one the server takes each client's own geometry\n");
        goto bad;
    }
    if (config && (st = kvt_config_load_file(cfg, config))) {
        rc = demo_error(config, st);
        goto out;
    }
    if ((st = kvt_config_load_env(cfg))) {
        rc = demo_error("environment", st);
        goto out;
    }
    for (int i = 0; i < nsets; i++) {
        char name[128];
        const char *eq = strchr(sets[i], '=');
        if (!eq || (size_t)(eq - sets[i]) >= sizeof name) {
            rc = cli_bad_value("serve", "--set", sets[i]);
            goto out;
        }
        memcpy(name, sets[i], (size_t)(eq - sets[i]));
        name[eq - sets[i]] = '\0';
        if ((st = kvt_config_set(cfg, name, eq + 1))) {
            rc = demo_error(sets[i], st);
            goto out;
        }
    }
    if (socket_path && (st = kvt_config_set(cfg, "server_socket", socket_path))) {
        rc = demo_error("--socket", st);
        goto out;
    }
    char configured[128] = "";
    if (kvt_config_get(cfg, "server_socket", configured, sizeof configured) || !configured[0]) {
        fprintf(stderr, "kvtier serve: no socket: give --socket PATH (or server_socket in "
                "--config, KVTIER_SERVER_SOCKET, or --set server_socket=PATH)\n");
        goto bad;
    }
    kvt_geometry *geo = NULL;
    if (model && (st = kvt_geometry_preset(&geo, model, page ? (uint32_t)page : 16,
                                           tp ? (uint32_t)tp : 1))) {
        rc = demo_error("--model", st);
        goto out;
    }
    if (layers && (rc = stage_geometry(&geo, layers))) {
        kvt_geometry_destroy(geo);
        goto out;
    }
    /* A SIGTERM or SIGINT during create waits (blocked) until there is a
     * server to stop, so the socket and lock files are always cleaned up. */
    sigset_t stop_sigs, old_mask;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGTERM);
    sigaddset(&stop_sigs, SIGINT);
    sigprocmask(SIG_BLOCK, &stop_sigs, &old_mask);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    st = kvt_server_create(&g_server, cfg, geo);
    kvt_geometry_destroy(geo);
    /* the cluster tier's threads start with the stop signals blocked too */
    kvt_cluster *cluster = NULL;
    char redis[512] = "";
    if (!st) (void)kvt_config_get(cfg, "cluster_redis", redis, sizeof redis); /* keeps st's message otherwise */
    if (!st && redis[0] && (st = kvt_cluster_join(g_server, &cluster))) {
        kvt_server_destroy(g_server);
        g_server = NULL;
    }
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    if (st) {
        rc = demo_error("serve", st);
        goto out;
    }
    notify_systemd("READY=1\nSTATUS=serving");
    st = kvt_server_run(g_server);
    notify_systemd("STOPPING=1");
    rc = st ? demo_error("stop", st) : 0;
    kvt_cluster_leave(cluster);
    kvt_server_destroy(g_server);
    g_server = NULL;
out:
    kvt_config_destroy(cfg);
    return rc;
bad:
    kvt_config_destroy(cfg);
    return usage(stderr, 2);
}

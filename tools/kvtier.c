/* kvtier.c - the `kvtier` command line: one subcommand per job. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cli_util.h"
#include "cmds.h"
#include "kvtier.h"

static void usage(FILE *to)
{
    fprintf(to,
            "kvtier %s - KV-cache offload and transfer engine\n"
            "\n"
            "usage: kvtier <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo                 an emulated engine serving multi-turn chat through the cache\n"
            "  config --dump        every option with its value, default and environment variable\n"
            "  fsck DIR[,DIR..]     check (or --repair) an SSD tier's cache directories\n"
            "  pd bootstrap|prefill|decode   run a prefill -> decode KV hand-off by hand\n"
            "  replay --trace FILE  replay a Mooncake trace through the index and tiers: hit rates\n"
            "  plan --trace FILE    hit rate against CPU and SSD capacity, as CSV and an SVG plot\n"
            "  trace synth --out F  write a multi-turn chat trace (Mooncake JSONL) to replay\n"
            "  serve --socket PATH  the node cache server engine processes attach to (foreground)\n"
            "  stats --socket PATH  a running server's figures (--json, --watch like top)\n"
            "  events --endpoint E  a server's KV events (vLLM's format) as JSON lines\n"
            "  cluster status --redis ADDR   the cluster directory: nodes, epochs, leases\n"
            "  bench copy           gather/scatter throughput vs memcpy on this machine\n"
            "  bench index          prefix-index lookups per second and bytes per block\n"
            "  bench ssd            SSD tier write/read throughput vs raw O_DIRECT io_uring\n"
            "  bench group          rank-group step latency, inproc and loopback TCP\n"
            "  bench pd             prefill -> decode hand-off vs a raw TCP stream and ucx_perftest\n"
            "  bench client         a client of kvtier serve vs an in-process cache; control round trip\n"
            "  bench engine         SGLang / vLLM plugin call patterns, in-process and served, vs memcpy\n"
            "  bench cluster        pulls between node servers vs a raw TCP stream; directory vs redis-benchmark\n"
            "  version              the library version\n"
            "\n"
            "Each command takes --help; most take --json for one JSON object on stdout.\n",
            kvt_version_string());
}

typedef struct subcommand {
    const char *name;
    int (*main)(int argc, char **argv);
} subcommand;

static const subcommand bench_cmds[] = {
    {"copy", kvt_bench_copy_main},
    {"index", kvt_bench_index_main},
    {"ssd", kvt_bench_ssd_main},
    {"group", kvt_bench_group_main},
    {"pd", kvt_bench_pd_main},
    {"client", kvt_bench_client_main},
    {"engine", kvt_bench_engine_main},
    {"cluster", kvt_bench_cluster_main},
};

static bool is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

/* `--help` anywhere after a command: its usage on stdout, exit 0, nothing
 * run. Every command prints its usage when handed --help alone; a few
 * print it to stderr (as for a bad argument), so stderr goes to stdout
 * for the call and the status is 0 whatever it said. */
static int help_of(int (*cmd)(int, char **), const char *name)
{
    char *argv[] = {(char *)name, "--help", NULL};
    fflush(NULL);
    int saved = dup(STDERR_FILENO);
    if (saved >= 0) dup2(STDOUT_FILENO, STDERR_FILENO);
    (void)cmd(2, argv);
    fflush(NULL);
    if (saved >= 0) {
        dup2(saved, STDERR_FILENO);
        close(saved);
    }
    return 0;
}

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) return false;
        if (is_help(argv[i])) return true;
    }
    return false;
}

static int dispatch(const subcommand *cmds, size_t n, const char *what, int argc, char **argv)
{
    if (argc >= 1 && argv[0][0] == '-' && wants_help(argc + 1, argv - 1)) {
        printf("usage: kvtier %s <", what);
        for (size_t i = 0; i < n; i++) printf("%s%s", i ? "|" : "", cmds[i].name);
        printf("> [options]   (each takes --help)\n");
        return 0;
    }
    if (argc < 1) {
        fprintf(stderr, "kvtier %s: which one? (", what);
        for (size_t i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", cmds[i].name);
        fprintf(stderr, ")\n");
        return 2;
    }
    for (size_t i = 0; i < n; i++)
        if (strcmp(argv[0], cmds[i].name) == 0)
            return wants_help(argc, argv) ? help_of(cmds[i].main, cmds[i].name)
                                          : cmds[i].main(argc, argv);
    fprintf(stderr, "kvtier %s: unknown subcommand \"%s\"\n", what, argv[0]);
    return 2;
}

static int version_main(int argc, char **argv)
{
    if (argc >= 2 && !is_help(argv[1])) return cli_bad_arg("version", argv[1], false);
    printf("kvtier %s\n", kvt_version_string());
    return 0;
}

static int bench_main(int argc, char **argv)
{
    return dispatch(bench_cmds, sizeof bench_cmds / sizeof bench_cmds[0], "bench", argc - 1, argv + 1);
}

static const subcommand top_cmds[] = {
    {"demo", kvt_cmd_demo},
    {"config", kvt_cmd_config},
    {"fsck", kvt_cmd_fsck},
    {"pd", kvt_cmd_pd},
    {"replay", kvt_cmd_replay},
    {"plan", kvt_cmd_plan},
    {"trace", kvt_cmd_trace},
    {"serve", kvt_cmd_serve},
    {"stats", kvt_cmd_stats},
    {"events", kvt_cmd_events},
    {"cluster", kvt_cmd_cluster},
    {"bench", bench_main},
    {"version", version_main},
};

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "help") == 0 || (argv[1][0] == '-' && wants_help(argc, argv))) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) return version_main(0, NULL);
    for (size_t i = 0; i < sizeof top_cmds / sizeof top_cmds[0]; i++) {
        if (strcmp(argv[1], top_cmds[i].name) != 0) continue;
        /* bench and pd are groups: their own dispatch handles --help */
        bool group = top_cmds[i].main == bench_main || top_cmds[i].main == kvt_cmd_pd;
        if (!group && wants_help(argc - 1, argv + 1)) return help_of(top_cmds[i].main, argv[1]);
        return top_cmds[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "kvtier: unknown command \"%s\" (try kvtier --help)\n", argv[1]);
    return 2;
}

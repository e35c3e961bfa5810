/* cmds.h - the `kvtier` subcommands; each returns the process exit code. */
#ifndef KVT_TOOLS_CMDS_H
#define KVT_TOOLS_CMDS_H

#include <stdbool.h>

int kvt_cmd_config(int argc, char **argv); /* kvtier config --dump [--json] [--file F] */
int kvt_cmd_demo(int argc, char **argv);   /* kvtier demo [--json] [--quick] ... */
/* kvtier demo --server [--json] [--model M] (demo_server.c) */
int kvt_demo_server(const char *model, bool json);
/* kvtier demo --cluster [--json] (demo_cluster.c) */
int kvt_demo_cluster(bool json);
int kvt_cmd_fsck(int argc, char **argv);   /* kvtier fsck DIR[,DIR2...] [--repair] [--json] */
int kvt_cmd_pd(int argc, char **argv);     /* kvtier pd bootstrap|prefill|decode ... */
int kvt_cmd_replay(int argc, char **argv); /* kvtier replay --trace FILE [...] */
int kvt_cmd_plan(int argc, char **argv);
int kvt_cmd_trace(int argc, char **argv);  /* kvtier trace synth --out FILE [...] */
int kvt_cmd_stats(int argc, char **argv);  /* kvtier stats --socket PATH [--json] [--watch] */
int kvt_cmd_events(int argc, char **argv); /* kvtier events --endpoint E | --replay R */
int kvt_cmd_cluster(int argc, char **argv); /* kvtier cluster status --redis ADDR [--json] */
int kvt_cmd_serve(int argc, char **argv);  /* kvtier serve --socket PATH [--config F] ... */   /* kvtier plan --trace FILE [--out-csv F] [--out-svg F] */

#endif

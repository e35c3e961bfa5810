/* cluster_procs.h - the processes `kvtier demo --cluster` and `kvtier bench
 * cluster` run: a redis-server and `kvtier serve` nodes on loopback, and a
 * scrape of a node's /metrics. Fork and exec only: call them before the
 * calling process starts threads (clients), as the tests' rule says. */
#ifndef KVT_TOOLS_CLUSTER_PROCS_H
#define KVT_TOOLS_CLUSTER_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A free TCP port on 127.0.0.1 now (0 when none could be had). */
uint16_t cp_free_port(void);
/* argv run with stdout and stderr appended to log; the pid or -1. */
pid_t cp_spawn_logged(const char *log, char *const argv[]);
/* Waits until path exists, pid dies or ms pass: true when it exists. */
bool cp_wait_file(const char *path, pid_t pid, uint32_t ms);
/* redis-server on 127.0.0.1:port, no persistence, its files in dir; once
 * it wrote its pid file (it listens then): the pid, else -1 with the reason
 * on stderr. */
pid_t cp_start_redis(const char *dir, uint16_t port, const char *log);
/* The same as a replica of 127.0.0.1:primary. */
pid_t cp_start_replica(const char *dir, uint16_t port, uint16_t primary, const char *log);
/* A Sentinel on 127.0.0.1:port monitoring primary as name (quorum 1, down
 * after 1 s), its config in dir; the pid or -1. */
pid_t cp_start_sentinel(const char *dir, uint16_t port, const char *name, uint16_t primary,
                        const char *log);
/* The port of the primary the Sentinel on sport names for name, or 0. */
uint16_t cp_sentinel_primary(uint16_t sport, const char *name);
/* True once the Sentinel knows a replica of name and that replica (on
 * replica) is in sync with its primary: a failover can promote it. */
bool cp_sentinel_ready(uint16_t sport, const char *name, uint16_t replica);
/* Sends sig to *pid, reaps it, sets *pid to 0 (nothing when <= 0). */
void cp_kill_wait(pid_t *pid, int sig);
/* One sample of a Prometheus endpoint on 127.0.0.1:port (a 2 s bound), or
 * dflt when it does not answer or has no such sample. */
uint64_t cp_metric(uint16_t port, const char *name, uint64_t dflt);

#endif

/* cluster_procs.c - processes for the cluster demo and bench (cluster_procs.h). */
#include "cluster_procs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "util/clock.h"

uint16_t cp_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    uint16_t port = 0;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

pid_t cp_spawn_logged(const char *log, char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

bool cp_wait_file(const char *path, pid_t pid, uint32_t ms)
{
    uint64_t until = kvt__now_ns() + (uint64_t)ms * 1000000ull;
    struct stat sb;
    while (stat(path, &sb) != 0) {
        if (waitpid(pid, NULL, WNOHANG) == pid || kvt__now_ns() > until) return false;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

/* redis-server with argv (its pid file, which it writes once it listens,
 * is pidfile). */
static pid_t start_and_wait(char *const argv[], const char *pidfile, uint16_t port, const char *log)
{
    unlink(pidfile);
    pid_t pid = cp_spawn_logged(log, argv);
    if (pid > 0 && cp_wait_file(pidfile, pid, 20000)) return pid;
    if (pid > 0) cp_kill_wait(&pid, SIGKILL);
    fprintf(stderr, "redis-server did not start on port %u (Debian's redis-server: run "
            "scripts/deps.sh; its log: %s)\n", port, log);
    return -1;
}

static pid_t start_redis_as(const char *dir, uint16_t port, const char *log, const char *of)
{
    char p[16], pidfile[512];
    snprintf(p, sizeof p, "%u", port);
    snprintf(pidfile, sizeof pidfile, "%s/redis-%u.pid", dir, port);
    char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", (char *)dir, "--pidfile", pidfile,
                    of ? "--replicaof" : NULL, (char *)of, NULL};
    return start_and_wait(argv, pidfile, port, log);
}

pid_t cp_start_redis(const char *dir, uint16_t port, const char *log)
{
    return start_redis_as(dir, port, log, NULL);
}

pid_t cp_start_replica(const char *dir, uint16_t port, uint16_t primary, const char *log)
{
    char of[32];
    snprintf(of, sizeof of, "127.0.0.1 %u", primary);
    return start_redis_as(dir, port, log, of);
}

pid_t cp_start_sentinel(const char *dir, uint16_t port, const char *name, uint16_t primary,
                        const char *log)
{
    char conf[512], pidfile[512];
    snprintf(conf, sizeof conf, "%s/sentinel-%u.conf", dir, port);
    snprintf(pidfile, sizeof pidfile, "%s/sentinel-%u.pid", dir, port);
    FILE *f = fopen(conf, "w");
    if (!f) return -1;
    fprintf(f, "port %u\nbind 127.0.0.1\ndir %s\npidfile %s\nsentinel monitor %s 127.0.0.1 %u 1\n"
            "sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
            port, dir, pidfile, name, primary, name, name);
    fclose(f);
    char *argv[] = {"redis-server", conf, "--sentinel", NULL};
    return start_and_wait(argv, pidfile, port, log);
}

static redisReply *command(uint16_t port, const char *cmd)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) r = redisCommand(c, cmd);
    if (c) redisFree(c);
    return r;
}

uint16_t cp_sentinel_primary(uint16_t sport, const char *name)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "SENTINEL get-master-addr-by-name %s", name);
    redisReply *r = command(sport, cmd);
    uint16_t port = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->str)
        port = (uint16_t)atoi(r->element[1]->str);
    if (r) freeReplyObject(r);
    return port;
}

bool cp_sentinel_ready(uint16_t sport, const char *name, uint16_t replica)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "SENTINEL replicas %s", name);
    redisReply *r = command(sport, cmd);
    bool known = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1;
    if (r) freeReplyObject(r);
    r = command(replica, "INFO replication");
    bool sync = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "master_link_status:up");
    if (r) freeReplyObject(r);
    return known && sync;
}

void cp_kill_wait(pid_t *pid, int sig)
{
    if (*pid <= 0) return;
    kill(*pid, sig);
    waitpid(*pid, NULL, 0);
    *pid = 0;
}

/* One HTTP/1.0 GET of 127.0.0.1:port/metrics into buf (NUL-ended). */
static bool scrape(uint16_t port, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {2, 0};
    bool ok = fd >= 0 && !setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) &&
              !setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) &&
              !connect(fd, (struct sockaddr *)&a, sizeof a);
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    ok = ok && write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1);
    size_t n = 0;
    ssize_t r;
    while (ok && n + 1 < cap && (r = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    if (fd >= 0) close(fd);
    return ok && n > 0;
}

uint64_t cp_metric(uint16_t port, const char *name, uint64_t dflt)
{
    size_t cap = 1 << 18;
    char *body = malloc(cap), key[128];
    int k = snprintf(key, sizeof key, "\n%s ", name);
    uint64_t v = dflt;
    const char *p;
    if (body && k > 0 && (size_t)k < sizeof key && scrape(port, body, cap) && (p = strstr(body, key)))
        v = strtoull(p + k, NULL, 10);
    free(body);
    return v;
}

/* space.c - the SSD space a server of any geometry needs, checked at start.
 *
 * Its geometries' SSD tiers are sparse and draw on one ssd_capacity
 * (cache/share.h); each store checks the budget's room when it opens, at
 * its geometry's first attach. That is late for an operator: a capacity the
 * disk cannot hold should stop `kvtier serve` at start, naming both
 * numbers, as a declared geometry's preallocated tier does. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "server/server.h"
#include "util/err.h"
#include "util/file.h"

uint64_t kvt__srv_ssd_held(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sum = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] != 'g') continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s/kvtier.data", dir, e->d_name);
        sum += kvt__disk_bytes(p);
    }
    closedir(d);
    return sum;
}

kvt_status kvt__srv_check_ssd_space(const char *ssd_dirs, uint64_t ssd_capacity)
{
    char dirs[1024];
    snprintf(dirs, sizeof dirs, "%s", ssd_dirs);
    uint32_t n = 0;
    for (const char *c = dirs; *c; c++) n += *c == ',';
    n++;
    uint64_t share = (ssd_capacity + n - 1) / n;
    char *save = NULL;
    for (char *d = strtok_r(dirs, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        struct statvfs vfs;
        if (!*d || statvfs(d, &vfs) != 0) continue; /* the store names what is wrong */
        uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize, held = kvt__srv_ssd_held(d);
        if (share > free_bytes + held)
            return kvt__fail(KVT_ENOSPC, "kvt_server_create: SSD directory %s: its filesystem "
                             "has %llu bytes free (and the tiers there hold %llu), less than its "
                             "share of ssd_capacity (%llu of %llu bytes over %u directories): "
                             "lower ssd_capacity or free space", d,
                             (unsigned long long)free_bytes, (unsigned long long)held,
                             (unsigned long long)share, (unsigned long long)ssd_capacity, n);
    }
    return KVT_OK;
}

/* file.c - see file.h. */
#include "util/file.h"

#include <stdio.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>
#include "util/err.h"

int kvt__open_regular(int dir_fd, const char *path, int flags, mode_t *mode)
{
    int fd = openat(dir_fd, path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (mode) *mode = st.st_mode;
        return KVT_NOT_REGULAR;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

const char *kvt__file_kind(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

uint64_t kvt__mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f) return 0;
    char line[128];
    unsigned long long avail = 0, huge_free = 0, huge_kb = 0, v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) avail = v;
        else if (sscanf(line, "HugePages_Free: %llu", &v) == 1) huge_free = v;
        else if (sscanf(line, "Hugepagesize: %llu kB", &v) == 1) huge_kb = v;
    }
    fclose(f);
    return ((uint64_t)avail + (uint64_t)huge_free * huge_kb) * 1024u;
}

uint64_t kvt__disk_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return (uint64_t)st.st_blocks * 512u;
}

kvt_status kvt__read_user_file(const char *path, const char *who, const char *kind, void *buf,
                               size_t cap, ssize_t *n)
{
    mode_t mode = 0;
    int fd = kvt__open_regular(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, &mode);
    if (fd == KVT_NOT_REGULAR)
        return kvt__fail(KVT_EINVAL, "%s: %s file %s is %s", who, kind, path, kvt__file_kind(mode));
    if (fd < 0)
        return kvt__fail(KVT_EINVAL, "%s: cannot open %s file %s: %s", who, kind, path,
                         strerror(errno));
    *n = read(fd, buf, cap);
    int e = errno;
    close(fd);
    if (*n < 0) return kvt__fail(KVT_EINVAL, "%s: cannot read %s: %s", who, path, strerror(e));
    return KVT_OK;
}

/* file.h - opening files named by a user without trusting what they are:
 * a FIFO must not block the open, a directory or device must not be read
 * as data. */
#ifndef KVT_UTIL_FILE_H
#define KVT_UTIL_FILE_H

#include <sys/types.h>

/* Opens path (relative to dir_fd; AT_FDCWD for the working directory) with
 * flags (O_RDONLY, maybe O_DIRECT) and O_NONBLOCK, so a FIFO without a
 * writer does not wait, then checks it is a regular file. Returns the
 * descriptor (O_NONBLOCK cleared again); -1 with errno set when the open
 * fails; KVT_NOT_REGULAR when it is not a regular file (*mode, if not NULL,
 * then tells what it is: see kvt__file_kind). */
#define KVT_NOT_REGULAR (-2)
int kvt__open_regular(int dir_fd, const char *path, int flags, mode_t *mode);

/* Reads at most cap bytes of the regular file path into buf (*n: how
 * many): a secret or password file an option names. who names the option
 * and kind the file in messages, KVT_EINVAL: "<who>: <kind> file <path> is
 * a directory", "<who>: cannot open <kind> file <path>: <why>", "<who>:
 * cannot read <path>: <why>". */
#include <stddef.h>
#include "kvtier.h"
kvt_status kvt__read_user_file(const char *path, const char *who, const char *kind, void *buf,
                               size_t cap, ssize_t *n);

/* "a directory", "a FIFO", "a socket", "a device", "a symbolic link",
 * "not a regular file" for the type bits of mode. */
const char *kvt__file_kind(mode_t mode);

/* The bytes a new allocation can take without swapping or the OOM killer:
 * /proc/meminfo's MemAvailable plus its free reserved huge pages
 * (HugePages_Free x Hugepagesize: a tier backed by them is not counted in
 * MemAvailable). 0 when /proc/meminfo cannot be read (then nothing is
 * known: callers skip their check). */
#include <stdint.h>
uint64_t kvt__mem_available(void);

/* The bytes path's blocks hold now, on disk or (a memfd, a tmpfs file) in
 * memory: st_blocks x 512 (POSIX leaves the unit open; Linux counts 512-byte
 * units whatever the file system's block size), so holes and punched slots
 * count nothing. stat() follows a link (/proc/PID/fd/N: the open file). 0
 * when path cannot be stat'ed or is not a regular file. */
uint64_t kvt__disk_bytes(const char *path);

#endif

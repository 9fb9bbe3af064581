/*
 * A disk that fails on command, for `disk_errors.py`: loaded into one `concord` process with
 * LD_PRELOAD, it answers EIO to the calls the script chooses, on the files under one directory.
 *
 *   CONCORD_FAULTY_DIR      the directory whose files fail (an absolute path; files opened by
 *                           another path, or relative to a directory descriptor, never fail)
 *   CONCORD_FAULTY_CONTROL  a file of at least 16 bytes the script writes while the process
 *                           runs: byte 0 says what fails (FAIL_* below, or-ed), byte 1 the
 *                           percentage of those calls that fail (0 or 100 and above: every
 *                           one), bytes 8-15 count the EIOs answered (little-endian, written
 *                           by this library)
 *
 * What a process sees is what a failing disk shows it: the system call returns -1 with errno
 * EIO, and nothing is written. Descriptors are tracked from `open` to `close`. Calls on names
 * (mkdir, rename, unlink) and writes through a memory mapping never fail.
 *
 * Build: cc -shared -fPIC -O2 -o faulty_disk.so faulty_disk.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define FAIL_WRITES 1 /* write, pwrite, writev, pwritev, ftruncate, fallocate */
#define FAIL_SYNCS 2  /* fsync, fdatasync, sync_file_range */
#define FAIL_READS 4  /* read, pread, readv, preadv */

#define TRACKED_FDS 65536

static unsigned char faulty_fd[TRACKED_FDS];
static volatile unsigned char *control;
static const char *faulty_dir;
static size_t faulty_dir_len;

__attribute__((constructor)) static void faulty_disk_init(void) {
    faulty_dir = getenv("CONCORD_FAULTY_DIR");
    faulty_dir_len = faulty_dir ? strlen(faulty_dir) : 0;
    const char *control_path = getenv("CONCORD_FAULTY_CONTROL");
    if (!control_path) return;
    int (*real_open)(const char *, int, ...) = dlsym(RTLD_NEXT, "open");
    int fd = real_open(control_path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void *mapped = mmap(NULL, 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped != MAP_FAILED) control = mapped;
}

static int under_faulty_dir(const char *path) {
    return faulty_dir_len > 0 && path && strncmp(path, faulty_dir, faulty_dir_len) == 0 &&
           (path[faulty_dir_len] == '/' || path[faulty_dir_len] == '\0');
}

static void track(int fd, const char *path) {
    if (fd >= 0 && fd < TRACKED_FDS) faulty_fd[fd] = (unsigned char)under_faulty_dir(path);
}

/* A number from 0 to 99, from a generator of the calling thread's own (xorshift). */
static unsigned percent_roll(void) {
    static __thread uint64_t state;
    if (state == 0) {
        state = ((uint64_t)(uintptr_t)&state << 16) ^ (uint64_t)getpid() ^ 0x9e3779b97f4a7c15u;
    }
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (unsigned)(state % 100);
}

/* Whether a call of kind `kind` on `fd` fails now; counts the failure if so. */
static int fails(int fd, unsigned char kind) {
    if (!control || fd < 0 || fd >= TRACKED_FDS || !faulty_fd[fd]) return 0;
    if ((control[0] & kind) == 0) return 0;
    unsigned percent = control[1];
    if (percent > 0 && percent < 100 && percent_roll() >= percent) return 0;
    __atomic_fetch_add((uint64_t *)(control + 8), 1, __ATOMIC_RELAXED);
    errno = EIO;
    return 1;
}

/* The C library's own `name`, looked up once. */
#define REAL(name)                                                     \
    ({                                                                 \
        static __typeof__(&name) real_##name;                          \
        if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name);       \
        real_##name;                                                   \
    })

static mode_t mode_of(int flags, va_list args) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(args, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = REAL(open)(path, flags, mode);
    track(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = REAL(open64)(path, flags, mode);
    track(fd, path);
    return fd;
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = REAL(openat)(dirfd, path, flags, mode);
    track(fd, path[0] == '/' ? path : NULL);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    int fd = REAL(openat64)(dirfd, path, flags, mode);
    track(fd, path[0] == '/' ? path : NULL);
    return fd;
}

int close(int fd) {
    if (fd >= 0 && fd < TRACKED_FDS) faulty_fd[fd] = 0;
    return REAL(close)(fd);
}

ssize_t write(int fd, const void *buf, size_t count) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(write)(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(pwrite)(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(pwrite64)(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(writev)(fd, iov, count);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(pwritev)(fd, iov, count, offset);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off64_t offset) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(pwritev64)(fd, iov, count, offset);
}

int ftruncate(int fd, off_t length) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(ftruncate)(fd, length);
}

int ftruncate64(int fd, off64_t length) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(ftruncate64)(fd, length);
}

int fallocate(int fd, int mode, off_t offset, off_t length) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(fallocate)(fd, mode, offset, length);
}

int fallocate64(int fd, int mode, off64_t offset, off64_t length) {
    return fails(fd, FAIL_WRITES) ? -1 : REAL(fallocate64)(fd, mode, offset, length);
}

int fsync(int fd) {
    return fails(fd, FAIL_SYNCS) ? -1 : REAL(fsync)(fd);
}

int fdatasync(int fd) {
    return fails(fd, FAIL_SYNCS) ? -1 : REAL(fdatasync)(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t count, unsigned int flags) {
    return fails(fd, FAIL_SYNCS) ? -1 : REAL(sync_file_range)(fd, offset, count, flags);
}

ssize_t read(int fd, void *buf, size_t count) {
    return fails(fd, FAIL_READS) ? -1 : REAL(read)(fd, buf, count);
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    return fails(fd, FAIL_READS) ? -1 : REAL(pread)(fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off64_t offset) {
    return fails(fd, FAIL_READS) ? -1 : REAL(pread64)(fd, buf, count, offset);
}

ssize_t readv(int fd, const struct iovec *iov, int count) {
    return fails(fd, FAIL_READS) ? -1 : REAL(readv)(fd, iov, count);
}

ssize_t preadv(int fd, const struct iovec *iov, int count, off_t offset) {
    return fails(fd, FAIL_READS) ? -1 : REAL(preadv)(fd, iov, count, offset);
}

ssize_t preadv64(int fd, const struct iovec *iov, int count, off64_t offset) {
    return fails(fd, FAIL_READS) ? -1 : REAL(preadv64)(fd, iov, count, offset);
}

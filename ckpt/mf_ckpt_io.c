/*
 * mf_ckpt_io: the checkpoint's file-I/O helpers (see mf_ckpt_io.h): whole
 * transfers through pread/pwrite, opening a file that must be regular, and
 * the directory operations a commit and a cleanup need.
 */
#include "mf_ckpt_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *mf_ckpt_file_kind(mode_t mode)
{
    return S_ISFIFO(mode) ? "a FIFO" : S_ISDIR(mode) ? "a directory" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a plain file";
}

int mf_ckpt_io_open_regular(const char *path, int flags, struct stat *st, char *err, size_t errlen)
{
    struct stat own;
    st = st ? st : &own;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | flags);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return errno = e, -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        int e = errno;
        if (S_ISREG(st->st_mode))
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
        else
            snprintf(err, errlen, "%s: %s, not a regular file: refused", path, mf_ckpt_file_kind(st->st_mode));
        close(fd);
        return errno = S_ISREG(st->st_mode) ? e : EINVAL, -1;
    }
    return fd;
}

/* All n bytes at off through pwrite (write) or pread, in transfers of at
 * most 1 GiB, again after EINTR and short ones; a transfer of no bytes fails
 * (ENOSPC writing, ENODATA reading). */
static int mf_ckpt_io_transfer_all(int fd, char *p, size_t n, uint64_t off, int write)
{
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t r = write ? pwrite(fd, p, k, (off_t)off) : pread(fd, p, k, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = write ? ENOSPC : ENODATA;
            return -1;
        }
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

int mf_ckpt_io_pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    return mf_ckpt_io_transfer_all(fd, (char *)buf, n, off, 1); /* only read from */
}

int mf_ckpt_io_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    return mf_ckpt_io_transfer_all(fd, buf, n, off, 0);
}

size_t mf_ckpt_io_dir_len(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return n;
}

int mf_ckpt_io_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

void mf_ckpt_io_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char path[4096];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

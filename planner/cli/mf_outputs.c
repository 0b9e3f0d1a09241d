/*
 * mf_outputs: see the header. The temporaries' names live in a static table
 * the signal handler reads (it only calls unlink and raise, both
 * async-signal-safe); a slot is marked live before mkstemp fills it, so a
 * signal at any point removes whatever exists.
 */
#include "mf_outputs.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_names[MF_OUTPUTS_MAX][PATH_MAX];
static volatile sig_atomic_t tmp_live[MF_OUTPUTS_MAX];
static struct sigaction old_int, old_term;

static void remove_temporaries(void)
{
    for (int i = 0; i < MF_OUTPUTS_MAX; i++)
        if (tmp_live[i]) {
            unlink(tmp_names[i]);
            tmp_live[i] = 0;
        }
}

static void on_signal(int sig)
{
    remove_temporaries();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void restore_signals(void)
{
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
}

void mf_outputs_begin(mf_outputs *o, const char *protect)
{
    memset(o, 0, sizeof *o);
    o->protect = protect;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
}

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Forgets output i's temporary after removing it. */
static void drop(int i)
{
    if (tmp_live[i])
        unlink(tmp_names[i]);
    tmp_live[i] = 0;
}

int mf_outputs_add(mf_outputs *o, const char *path, int (*write)(FILE *out, const void *ctx),
                   const void *ctx)
{
    if (o->protect && same_file(path, o->protect)) {
        fprintf(stderr, "mfsdpc: error: refusing to overwrite the input file '%s'\n", path);
        o->failed = 1;
        return -1;
    }
    if (o->n == MF_OUTPUTS_MAX || strlen(path) + sizeof ".tmp.XXXXXX" > PATH_MAX) {
        fprintf(stderr, "mfsdpc: error: cannot write '%s': %s\n", path,
                o->n == MF_OUTPUTS_MAX ? "too many outputs" : strerror(ENAMETOOLONG));
        o->failed = 1;
        return -1;
    }
    int i = o->n;
    snprintf(tmp_names[i], PATH_MAX, "%s.tmp.XXXXXX", path);
    tmp_live[i] = 1;
    int fd = mkstemp(tmp_names[i]);
    if (fd < 0) {
        tmp_live[i] = 0;
        fprintf(stderr, "mfsdpc: error: cannot create a temporary file next to '%s': %s\n", path,
                strerror(errno));
        o->failed = 1;
        return -1;
    }
    o->paths[i] = path;
    o->n++;
    FILE *out = fdopen(fd, "wb");
    int rc = out ? write(out, ctx) : -1;
    if (out && (fflush(out) != 0 || ferror(out) || fsync(fileno(out)) != 0))
        rc = -1;
    int saved = errno;
    if (out ? fclose(out) != 0 : close(fd) != 0)
        rc = -1;
    if (rc != 0) {
        drop(i);
        o->failed = 1;
        fprintf(stderr, "mfsdpc: error: cannot write '%s': %s\n", path, strerror(saved ? saved : EIO));
        return -1;
    }
    /* The usual permissions of a new file (mkstemp makes it 0600). */
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmp_names[i], 0666 & ~mask);
    return 0;
}

int mf_outputs_commit(mf_outputs *o)
{
    int rc = o->failed ? -1 : 0;
    for (int i = 0; rc == 0 && i < o->n; i++)
        if (rename(tmp_names[i], o->paths[i]) != 0) {
            fprintf(stderr, "mfsdpc: error: cannot write '%s': %s\n", o->paths[i], strerror(errno));
            rc = -1;
        } else {
            tmp_live[i] = 0;
        }
    for (int i = 0; i < o->n; i++)
        drop(i);
    restore_signals();
    return rc;
}

void mf_outputs_discard(mf_outputs *o)
{
    for (int i = 0; i < o->n; i++)
        drop(i);
    restore_signals();
}

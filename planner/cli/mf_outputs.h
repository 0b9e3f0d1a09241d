/*
 * mf_outputs: the output files of one mfsdpc command, committed together or
 * not at all (docs/reliability.md). Each output is written in full to a
 * temporary file next to it (PATH.tmp.XXXXXX, flushed and fsynced) as it is
 * added; mf_outputs_commit renames them all once every one was written, and
 * mf_outputs_discard removes them. While any temporary exists, SIGINT and
 * SIGTERM remove every temporary and end the process with the signal, so an
 * interrupted command leaves neither a partial output nor a temporary.
 *
 * One set per process at a time (the signal handler's table is static).
 */
#ifndef MF_OUTPUTS_H
#define MF_OUTPUTS_H

#include <stdio.h>

enum { MF_OUTPUTS_MAX = 4 };

typedef struct mf_outputs {
    const char *protect;                 /* borrowed: the input, never overwritten */
    int n;                               /* outputs added (written to temporaries) */
    const char *paths[MF_OUTPUTS_MAX];   /* borrowed */
    int failed;                          /* an add failed: commit refuses */
} mf_outputs;

/* Starts an empty set; installs the SIGINT/SIGTERM cleanup. */
void mf_outputs_begin(mf_outputs *o, const char *protect);

/* Writes one output to its temporary with write(out, ctx) (0 on success).
 * Refuses the input itself. On failure prints "mfsdpc: error: cannot write
 * 'PATH': why", removes that temporary and returns -1 (the set is then
 * failed: commit will refuse). */
int mf_outputs_add(mf_outputs *o, const char *path, int (*write)(FILE *out, const void *ctx),
                   const void *ctx);

/* Renames every temporary over its output, or on a failed set removes every
 * temporary; 0 when every output was replaced. (A rename that fails after
 * others -- they are in the outputs' own directories, so only a vanished
 * directory does that -- leaves those replaced; its temporary and the rest
 * are removed.) Restores the previous signal actions. */
int mf_outputs_commit(mf_outputs *o);

/* Removes every temporary (the command failed); restores the signals. */
void mf_outputs_discard(mf_outputs *o);

#endif

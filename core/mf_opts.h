/*
 * mf_opts: the one option parser of the command lines (the mfsdpc
 * subcommands, mfsdp-replay, mfsdp-ckpt, the benches and the test tools),
 * getopt_long underneath. A command lists its options in a table;
 * mf_opts_next() walks argv in order and returns one option or operand at a
 * time:
 *
 *   --name            a flag (value NULL)
 *   --name V, --name=V an option with a value; `alias` (e.g. -o) takes "-o V"
 *   --                an entry of the table like any other when listed (the
 *                     caller decides what follows); else an unknown option
 *   extra(a)          arguments the command passes through whole (the cost
 *                     options, whose values need the mesh)
 *   anything else starting with '-' (but "-" alone) is an unknown option;
 *   the rest are operands, returned where they stand.
 *
 * Stricter than plain getopt_long, on purpose: a long option is its whole
 * name (no abbreviations), an alias stands alone ("-o V", never "-oV" or
 * "-ho"), and argv is never permuted.
 *
 * Errors are printed as "CMD: error: unknown option 'A'" and
 * "CMD: error: A needs VALUE" on stderr unless `quiet` is set (the command
 * then words them itself from p->arg); the command decides whether to print
 * its usage after them. getopt's globals are reset by mf_opts_init: one
 * parse at a time.
 */
#ifndef MF_OPTS_H
#define MF_OPTS_H

#include <stdbool.h>

typedef struct mf_opt {
    const char *name;       /* "--format"; or "-o" for an option with no long name */
    const char *alias;      /* "-h", "-o": a dash and one character; NULL when none */
    const char *value;      /* what the value is, for "--x needs ..."; NULL: a flag */
    int id;                 /* returned by mf_opts_next; >= 0 */
} mf_opt;

enum {
    MF_OPTS_END = -1,       /* no arguments left */
    MF_OPTS_OPERAND = -2,   /* *val is the operand */
    MF_OPTS_EXTRA = -3,     /* *val is the whole argument, accepted by extra() */
    MF_OPTS_UNKNOWN = -4,   /* an unknown option (reported unless quiet) */
    MF_OPTS_NO_VALUE = -5,  /* an option without its value (reported unless quiet) */
};

#define MF_OPTS_MAX 32      /* options in one table */

typedef struct mf_opts {
    const char *cmd;        /* "mfsdpc explain", for messages */
    int argc;
    char **argv;
    int i;                  /* the next argument */
    const mf_opt *table;
    int nopts;              /* <= MF_OPTS_MAX */
    bool (*extra)(const char *arg); /* NULL: none */
    bool quiet;             /* print no message: the caller reports p->arg */
    const char *arg;        /* the argument mf_opts_next looked at last */
} mf_opts;

/* Starts after argv[0] (the command's or subcommand's name). */
void mf_opts_init(mf_opts *p, const char *cmd, int argc, char **argv, const mf_opt *table, int nopts,
                  bool (*extra)(const char *arg));

/* The next option's id (with *val its value, or NULL for a flag), or one of
 * the MF_OPTS_ codes above. */
int mf_opts_next(mf_opts *p, const char **val);

#endif

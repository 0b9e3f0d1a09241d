/*
 * mf_opts: the one option parser of the mfsdpc subcommands (mf_cmd_*.c).
 * A subcommand lists its options in a table; mf_opts_next() walks argv and
 * returns one option or operand at a time:
 *
 *   --name            a flag (has_value false)
 *   --name V, --name=V an option with a value; `alias` (e.g. -o) takes "-o V"
 *   extra(a)          arguments the subcommand passes through whole (the cost
 *                     options, whose values need the mesh)
 *   anything else starting with '-' (but "-" alone) is an unknown option;
 *   the rest are operands.
 *
 * Errors are printed as "mfsdpc CMD: error: ..." on stderr; the subcommand
 * decides whether to print its usage after them.
 */
#ifndef MF_OPTS_H
#define MF_OPTS_H

#include <stdbool.h>

typedef struct mf_opt {
    const char *name;       /* "--format" */
    const char *alias;      /* "-h", "-o"; NULL when none */
    const char *value;      /* what the value is, for "--x needs ..."; NULL: a flag */
    int id;                 /* returned by mf_opts_next; >= 0 */
} mf_opt;

enum {
    MF_OPTS_END = -1,       /* no arguments left */
    MF_OPTS_OPERAND = -2,   /* *val is the operand */
    MF_OPTS_EXTRA = -3,     /* *val is the whole argument, accepted by extra() */
    MF_OPTS_UNKNOWN = -4,   /* an unknown option (reported) */
    MF_OPTS_NO_VALUE = -5,  /* an option without its value (reported) */
};

typedef struct mf_opts {
    const char *cmd;        /* "mfsdpc explain", for messages */
    int argc;
    char **argv;
    int i;                  /* the next argument */
    const mf_opt *table;
    int nopts;
    bool (*extra)(const char *arg); /* NULL: none */
} mf_opts;

/* Starts after argv[0] (the subcommand's name). */
void mf_opts_init(mf_opts *p, const char *cmd, int argc, char **argv, const mf_opt *table, int nopts,
                  bool (*extra)(const char *arg));

/* The next option's id (with *val its value, or NULL for a flag), or one of
 * the MF_OPTS_ codes above. */
int mf_opts_next(mf_opts *p, const char **val);

#endif

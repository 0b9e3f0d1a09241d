/*
 * mf_opts: the option parser of the command lines (see mf_opts.h). Each
 * argument is first matched whole against the table, so that getopt_long's
 * leniencies (abbreviated names, "-oV", grouped aliases, "--" ending the
 * options, permuted operands) never apply; getopt_long, in order
 * ("-" first in its option string) and silent (":"), then takes the option
 * and its value, or the operand.
 */
#include "mf_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

enum { MF_OPTS_LONG = 256 }; /* getopt_long's code of table entry k: MF_OPTS_LONG + k */

void mf_opts_init(mf_opts *p, const char *cmd, int argc, char **argv, const mf_opt *table, int nopts,
                  bool (*extra)(const char *arg))
{
    *p = (mf_opts){cmd, argc, argv, 1, table, nopts < MF_OPTS_MAX ? nopts : MF_OPTS_MAX, extra, false, NULL};
}

/* The entry that argument a names whole: "--name", "--name=V" when it takes
 * a value, or its alias; -1 when none. */
static int mf_opts_find(const mf_opts *p, const char *a)
{
    for (int k = 0; k < p->nopts; k++) {
        const mf_opt *o = &p->table[k];
        size_t n = strlen(o->name);
        if (strcmp(a, o->name) == 0 || (o->alias && strcmp(a, o->alias) == 0))
            return k;
        if (o->value && strncmp(a, o->name, n) == 0 && a[n] == '=')
            return k;
    }
    return -1;
}

/* getopt_long on the next argument, which the table names (or an operand):
 * entry k's id with *val its value, MF_OPTS_OPERAND or MF_OPTS_NO_VALUE. */
static int mf_opts_take(mf_opts *p, const char **val)
{
    struct option longs[MF_OPTS_MAX + 1];
    char shorts[2 + 2 * MF_OPTS_MAX + 1] = "-:"; /* in order; ':' for a missing value */
    size_t ns = 2, nl = 0;
    for (int k = 0; k < p->nopts; k++) {
        const mf_opt *o = &p->table[k];
        if (strcmp(o->name, "--") == 0)
            continue; /* taken by mf_opts_next, never by getopt_long */
        bool is_long = o->name[1] == '-';
        if (is_long)
            longs[nl++] = (struct option){o->name + 2, o->value ? required_argument : no_argument, NULL,
                                          MF_OPTS_LONG + k};
        const char *alias = is_long ? o->alias : o->name;
        if (alias) {
            shorts[ns++] = alias[1];
            if (o->value)
                shorts[ns++] = ':';
        }
    }
    longs[nl] = (struct option){NULL, 0, NULL, 0};
    shorts[ns] = '\0';
    /* optind 0 restarts getopt (glibc); the first call reads argv[1] */
    optind = p->i == 1 ? 0 : p->i;
    opterr = 0;
    int c = getopt_long(p->argc, p->argv, shorts, longs, NULL);
    p->i = optind;
    if (c == 1) {
        *val = optarg;
        return MF_OPTS_OPERAND;
    }
    int k = c >= MF_OPTS_LONG ? c - MF_OPTS_LONG : mf_opts_find(p, p->arg);
    if (c == ':') {
        if (!p->quiet)
            fprintf(stderr, "%s: error: %s needs %s\n", p->cmd, p->arg, p->table[k].value);
        return MF_OPTS_NO_VALUE;
    }
    *val = p->table[k].value ? optarg : NULL;
    return p->table[k].id;
}

int mf_opts_next(mf_opts *p, const char **val)
{
    *val = NULL;
    if (p->i >= p->argc)
        return MF_OPTS_END;
    const char *a = p->arg = p->argv[p->i];
    int k = mf_opts_find(p, a);
    if (k >= 0 && strcmp(a, "--") == 0) {
        p->i++; /* getopt_long would end the options here; the caller decides */
        return p->table[k].id;
    }
    if (k < 0 && p->extra && p->extra(a)) {
        p->i++;
        *val = a;
        return MF_OPTS_EXTRA;
    }
    if (k >= 0 || a[0] != '-' || a[1] == '\0')
        return mf_opts_take(p, val);
    p->i++;
    *val = a;
    if (!p->quiet)
        fprintf(stderr, "%s: error: unknown option '%s'\n", p->cmd, a);
    return MF_OPTS_UNKNOWN;
}

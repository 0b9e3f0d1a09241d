/*
 * mf_opts: the option parser of the mfsdpc subcommands (see mf_opts.h).
 */
#include "mf_opts.h"

#include <stdio.h>
#include <string.h>

void mf_opts_init(mf_opts *p, const char *cmd, int argc, char **argv, const mf_opt *table, int nopts,
                  bool (*extra)(const char *arg))
{
    *p = (mf_opts){cmd, argc, argv, 1, table, nopts, extra};
}

int mf_opts_next(mf_opts *p, const char **val)
{
    *val = NULL;
    if (p->i >= p->argc)
        return MF_OPTS_END;
    const char *a = p->argv[p->i++];
    for (int k = 0; k < p->nopts; k++) {
        const mf_opt *o = &p->table[k];
        size_t n = strlen(o->name);
        bool exact = strcmp(a, o->name) == 0 || (o->alias && strcmp(a, o->alias) == 0);
        if (o->value && !exact && strncmp(a, o->name, n) == 0 && a[n] == '=') {
            *val = a + n + 1;
            return o->id;
        }
        if (!exact)
            continue;
        if (o->value) {
            if (p->i >= p->argc) {
                fprintf(stderr, "%s: error: %s needs %s\n", p->cmd, a, o->value);
                return MF_OPTS_NO_VALUE;
            }
            *val = p->argv[p->i++];
        }
        return o->id;
    }
    *val = a;
    if (p->extra && p->extra(a))
        return MF_OPTS_EXTRA;
    if (a[0] == '-' && a[1] != '\0') {
        fprintf(stderr, "%s: error: unknown option '%s'\n", p->cmd, a);
        return MF_OPTS_UNKNOWN;
    }
    return MF_OPTS_OPERAND;
}

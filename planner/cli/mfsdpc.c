/*
 * mfsdpc: the command line. Dispatches to one file per subcommand.
 *
 * Output that cannot be written is an error: standard output is flushed and
 * checked after every command (a full disk or /dev/full gives exit status 2,
 * never a silent 0), and SIGXFSZ is ignored so that a file-size limit makes a
 * write fail (and the atomic writer remove its temporary) instead of killing
 * the process with a partial temporary file left behind.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_opts.h"
#include "mf_schedule.h"

#ifndef MFSDP_VERSION
#define MFSDP_VERSION "0.0.0"
#endif

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} mf_command;

static const mf_command commands[] = {
    {"check", mf_cmd_check, "check SPEC...                 check specs, print diagnostics"},
    {"compile", mf_cmd_compile, "compile SPEC -o OUT.yaml      write the verified schedule"},
    {"explain", mf_cmd_explain, "explain SPEC [--format text|yaml]  placements, transitions, bytes, memory"},
    {"diff", mf_cmd_diff, "diff A B                      semantic diff of two schedules or specs"},
    {"simulate", mf_cmd_simulate, "simulate SPEC|SCHEDULE        time one step on a two-stream model"},
    {"plan", mf_cmd_plan, "plan SPEC --memory SIZE       choose layouts: the front of memory vs step time"},
    {"init", mf_cmd_init, "init MODEL --mesh A=N,... --layout MODE [--unit P] [-o F]  spec from a checkpoint"},
    {"reshard-plan", mf_cmd_reshard_plan, "reshard-plan OLD.yaml NEW.yaml  checkpoint ranges each NEW rank reads"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: mfsdpc COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %s\n", commands[i].usage);
    fprintf(out, "\n  --help       this text (or: mfsdpc COMMAND --help)\n"
                 "  --version    print the version\n\n"
                 "exit status: 0 success, 1 error in the input, 2 usage error\n");
}

static int mf_main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* The first argument only: the rest belong to the command. */
    enum { O_HELP, O_VERSION };
    static const mf_opt opts[] = {{"--help", "-h", NULL, O_HELP}, {"--version", NULL, NULL, O_VERSION}};
    mf_opts p;
    mf_opts_init(&p, "mfsdpc", argc, argv, opts, 2, NULL);
    p.quiet = true; /* any other option is an unknown command */
    const char *v;
    int id = mf_opts_next(&p, &v);
    if (id == O_HELP || (id == MF_OPTS_OPERAND && strcmp(v, "help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (id == O_VERSION) {
        printf("mfsdpc %s (schedule format %s)\n", MFSDP_VERSION, MF_SCHEDULE_FORMAT);
        return 0;
    }
    for (size_t i = 0; id == MF_OPTS_OPERAND && i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "mfsdpc: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    signal(SIGXFSZ, SIG_IGN);
    /* Line-buffered diagnostics: one write per line, not per character (an
     * unbuffered stderr made the echo of a 1 MB source line take seconds). */
    setvbuf(stderr, NULL, _IOLBF, BUFSIZ);
    int rc = mf_main(argc, argv);
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) {
        /* (a command that failed has said so already) */
        fprintf(stderr, "mfsdpc: error: cannot write to standard output: %s\n",
                strerror(errno ? errno : EIO));
        rc = 2;
    }
    return rc;
}

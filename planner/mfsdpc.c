/*
 * mfsdpc: the command line. Dispatches to one file per subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "mf_cli.h"

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

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mfsdpc %s (schedule format mfsdp-schedule/1)\n", MFSDP_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "mfsdpc: error: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/*
 * mf_cmd_check: `mfsdpc check FILE...` -- parse and check specs, nothing more.
 *
 * Runs the pipeline up to the semantic pass (MF_STAGE_SEMA), so it depends on
 * no later pass. Every file is checked, even after one fails. Output: nothing
 * for a valid spec; GCC-style diagnostics on stderr otherwise, with each file
 * name printed exactly as given. Exit status: 0 all valid, 1 some spec has
 * errors, 2 usage error or a file that cannot be read.
 */
#include <stdio.h>
#include <string.h>

#include "mf_cli.h"
#include "mf_opts.h"
#include "mf_pipeline.h"

#ifndef MFSDP_VERSION
#define MFSDP_VERSION "0.0.0"
#endif

static void check_usage(FILE *out)
{
    fprintf(out,
            "usage: mfsdpc check [--] SPEC...\n"
            "\n"
            "Parses each spec and runs the semantic checks (docs/language.md §4): prints nothing\n"
            "when a spec is valid, GCC-style diagnostics on stderr otherwise.\n"
            "\n"
            "  -h, --help   this text\n"
            "  --version    print the version\n"
            "\n"
            "exit status: 0 every spec is valid, 1 a spec has errors, 2 usage error or\n"
            "an unreadable file\n");
}

int mf_cmd_check(int argc, char **argv)
{
    enum { OPT_HELP, OPT_VERSION, OPT_END };
    static const mf_opt opts[] = {{"--help", "-h", NULL, OPT_HELP},
                                  {"--version", NULL, NULL, OPT_VERSION},
                                  {"--", NULL, NULL, OPT_END}};
    mf_opts p;
    mf_opts_init(&p, "mfsdpc check", argc, argv, opts, 3, NULL);
    int first = argc, id;
    const char *v;
    while ((id = mf_opts_next(&p, &v)) != MF_OPTS_END) {
        if (id == OPT_HELP) {
            check_usage(stdout);
            return 0;
        }
        if (id == OPT_VERSION) {
            printf("mfsdpc %s (schedule format %s)\n", MFSDP_VERSION, MF_SCHEDULE_FORMAT);
            return 0;
        }
        if (id == OPT_END) {
            first = p.i;
            break;
        }
        if (id != MF_OPTS_OPERAND) {
            check_usage(stderr); /* reported */
            return 2;
        }
        first = p.i - 1;
        break;
    }
    /* Options come first; everything from the first file on is a file. */
    if (first >= argc) {
        fprintf(stderr, "mfsdpc check: error: no spec files given\n");
        check_usage(stderr);
        return 2;
    }
    mf_compile_options opt = {.stop_after = MF_STAGE_SEMA};
    int status = 0;
    for (int i = first; i < argc; i++) {
        mf_compilation c;
        int rc = mf_pipeline_compile_file(argv[i], &opt, &c);
        mf_compilation_free(&c);
        if (rc > status)
            status = rc;
    }
    return status;
}

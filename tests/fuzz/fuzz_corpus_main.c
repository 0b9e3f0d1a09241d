/*
 * fuzz_corpus_main: runs LLVMFuzzerTestOneInput over every file of the given
 * files and directories (the seed corpus and the crash regressions), so the
 * fuzz target's checks run in every build, whatever the compiler. Fails when
 * nothing was found (a wrong path must not pass silently). Linked with each
 * target (fuzz_<target>_corpus); messages carry the program's name.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf_pipeline.h"

static const char *prog = "fuzz_corpus";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    size_t len = 0;
    char *text = mf_pipeline_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "%s: cannot read %s\n", prog, path);
        return -1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)text, len);
    /* every prefix of a small seed too: truncations are where parsers break */
    if (len <= 4096)
        for (size_t n = 0; n < len; n += 1 + len / 64)
            LLVMFuzzerTestOneInput((const uint8_t *)text, n);
    free(text);
    return 1;
}

int main(int argc, char **argv)
{
    int files = 0;
    if (argc > 0 && argv[0][0]) {
        const char *slash = strrchr(argv[0], '/');
        prog = slash ? slash + 1 : argv[0];
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: no such file or directory: %s\n", prog, argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) < 0)
                return 1;
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d)
            return 1;
        struct dirent *e;
        while ((e = readdir(d))) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
                continue;
            if (run_file(path) < 0) {
                closedir(d);
                return 1;
            }
            files++;
        }
        closedir(d);
    }
    printf("%s: %d inputs ran clean\n", prog, files);
    return files > 0 ? 0 : 1;
}

/*
 * mf_init_ties: the tied tensors of a Hugging Face checkpoint (see the
 * header). Reads each file's header again for its __metadata__ (through the
 * descriptors mf_ckpt_hf_open holds) and config.json, opened without blocking and
 * read only when it is a regular file.
 */
#include "mf_init_ties.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MF_INIT_MAX_CONFIG (16u << 20) /* bytes of config.json read at most */

static int find_tensor(const mf_hf_model *m, const char *name)
{
    for (int k = 0; k < m->n; k++)
        if (strcmp(m->t[k].name, name) == 0)
            return k;
    return -1;
}

/* Whether name is an output head's weight: its unit's last part is a head. */
static int is_head(const char *name)
{
    static const char *const heads[] = {"lm_head", "head", "output", "embed_out"};
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    const char *start = dot;
    while (start > name && start[-1] != '.')
        start--;
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
        if ((size_t)(dot - start) == strlen(heads[i]) && strncmp(start, heads[i], (size_t)(dot - start)) == 0)
            return 1;
    return 0;
}

static int note(mf_init_ties *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int note(mf_init_ties *t, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char **nn = realloc(t->notes, (size_t)(t->nnotes + 1) * sizeof *nn);
    if (!nn)
        return -1;
    t->notes = nn;
    if (!(t->notes[t->nnotes] = strdup(line)))
        return -1;
    t->nnotes++;
    return 0;
}

/* Tensor k (stored under its own name) is also called alias: the tie's spec
 * name is the alias when k's own name is a head's and the alias is not. */
static int tie_alias(const mf_hf_model *m, mf_init_ties *t, int k, const char *alias)
{
    const char *stored = m->t[k].name;
    t->tied[k] = 1;
    if (!t->name[k] && is_head(stored) && !is_head(alias)) {
        if (!(t->name[k] = strdup(alias)))
            return -1;
        return note(t, "tied: \"%s\" (also \"%s\") is stored as \"%s\": import with the tie %s=%s", alias,
                    stored, stored, alias, stored);
    }
    return note(t, "tied: \"%s\" (also \"%s\")", t->name[k] ? t->name[k] : stored, alias);
}

/* save_model's metadata: "ALIAS": "STORED". */
static int ties_from_metadata(const mf_hf_model *m, mf_init_ties *t, char *err, size_t errlen)
{
    for (int f = 0; f < m->nfiles; f++) {
        struct stat st;
        mf_st_file h;
        if (fstat(m->fds[f], &st) != 0)
            return snprintf(err, errlen, "%s: cannot stat: %s", m->paths[f], strerror(errno)), -1;
        if (mf_ckpt_st_read(m->fds[f], m->paths[f], (uint64_t)st.st_size, &h, err, errlen) != 0)
            return -1;
        int rc = 0;
        for (int i = 0; i < h.nmeta && rc == 0; i++) {
            int k = find_tensor(m, h.meta_val[i]);
            if (k >= 0 && find_tensor(m, h.meta_key[i]) < 0)
                rc = tie_alias(m, t, k, h.meta_key[i]);
        }
        mf_ckpt_st_free(&h);
        if (rc != 0)
            return snprintf(err, errlen, "out of memory"), -1;
    }
    return 0;
}

/* config.json of model_path's directory, or NULL (*absent = 1) when there is
 * none. A file that is not regular, unreadable or not JSON is an error. */
static json_t *load_config(const char *model_path, int *absent, char *path, size_t pathlen, char *err,
                           size_t errlen)
{
    struct stat st;
    *absent = 0;
    if (stat(model_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, pathlen, "%s/config.json", model_path);
    } else {
        const char *slash = strrchr(model_path, '/');
        if (slash)
            snprintf(path, pathlen, "%.*s/config.json", (int)(slash - model_path), model_path);
        else
            snprintf(path, pathlen, "config.json");
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            *absent = 1;
            return NULL;
        }
        return snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno)), NULL;
    }
    json_t *root = NULL;
    json_error_t je;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        snprintf(err, errlen, "%s: not a regular file", path);
    else if ((uint64_t)st.st_size > MF_INIT_MAX_CONFIG)
        snprintf(err, errlen, "%s: %lld bytes exceeds the limit of %u bytes for a config", path,
                 (long long)st.st_size, MF_INIT_MAX_CONFIG);
    else if (!(root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je)))
        snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    else if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: not a JSON object", path);
        json_decref(root);
        root = NULL;
    }
    close(fd);
    return root;
}

/* "tie_word_embeddings": true: the input embedding with vocab_size rows. */
static int ties_from_config(const mf_hf_model *m, const char *model_path, mf_init_ties *t, char *err,
                            size_t errlen)
{
    char path[4200];
    int absent;
    json_t *cfg = load_config(model_path, &absent, path, sizeof path, err, errlen);
    if (!cfg)
        return absent ? 0 : -1;
    int rc = 0;
    json_t *tie = json_object_get(cfg, "tie_word_embeddings"), *vocab = json_object_get(cfg, "vocab_size");
    for (int k = 0; k < m->n; k++)
        if (t->tied[k])
            goto done; /* save_model's metadata named the tie already */
    if (!json_is_true(tie))
        goto done;
    if (!json_is_integer(vocab) || json_integer_value(vocab) < 1) {
        snprintf(err, errlen, "%s: \"tie_word_embeddings\" is true but \"vocab_size\" is not a positive integer",
                 path);
        rc = -1;
        goto done;
    }
    int64_t rows = (int64_t)json_integer_value(vocab);
    int embed = -1, head = -1, candidates = 0;
    for (int k = 0; k < m->n; k++) {
        const mf_hf_tensor *x = &m->t[k];
        if (x->ndims != 2 || x->dims[0] != rows)
            continue;
        if (is_head(x->name)) {
            head = head < 0 ? k : head;
        } else if (candidates++ == 0) {
            embed = k;
        }
    }
    if (candidates != 1) {
        snprintf(err, errlen,
                 "%s: \"tie_word_embeddings\" is true but %d tensors of the checkpoint have %lld (vocab_size) rows "
                 "and are not an output head; the input embedding must be exactly one",
                 path, candidates, (long long)rows);
        rc = -1;
        goto done;
    }
    t->tied[embed] = 1;
    if (head >= 0 && m->t[head].dims[1] == m->t[embed].dims[1]) {
        t->dropped[head] = 1;
        rc = note(t, "tied (config.json tie_word_embeddings): \"%s\" (also \"%s\", whose stored copy is left out)",
                  m->t[embed].name, m->t[head].name);
    } else {
        rc = note(t, "tied (config.json tie_word_embeddings): \"%s\" (also the output head)", m->t[embed].name);
    }
    if (rc != 0)
        snprintf(err, errlen, "out of memory");
done:
    json_decref(cfg);
    return rc;
}

int mf_init_ties_find(const mf_hf_model *m, const char *model_path, mf_init_ties *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    size_t n = (size_t)m->n + 1;
    t->name = calloc(n, sizeof *t->name);
    t->tied = calloc(n, 1);
    t->dropped = calloc(n, 1);
    if (!t->name || !t->tied || !t->dropped)
        return snprintf(err, errlen, "out of memory"), -1;
    if (ties_from_metadata(m, t, err, errlen) != 0 || ties_from_config(m, model_path, t, err, errlen) != 0)
        return -1;
    return 0;
}

void mf_init_ties_free(mf_init_ties *t, int n)
{
    for (int k = 0; t->name && k < n; k++)
        free(t->name[k]);
    for (int i = 0; i < t->nnotes; i++)
        free(t->notes[i]);
    free(t->name);
    free(t->tied);
    free(t->dropped);
    free(t->notes);
    memset(t, 0, sizeof *t);
}

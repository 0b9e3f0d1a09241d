/*
 * mf_init_ties: the tied tensors of a Hugging Face checkpoint, for `mfsdpc
 * init` (docs/checkpoint.md, "mfsdpc init"). A tie is one tensor of the
 * model under several names (GPT-2's lm_head.weight = transformer.wte.weight);
 * the checkpoint stores it once, and the spec lists it once, under the name
 * of its input side, with the `tied` layout (its other users read it outside
 * its unit's windows). Found from:
 *   - safetensors' save_model metadata: an entry "ALIAS": "STORED" of a
 *     file's __metadata__ where STORED is a tensor of the checkpoint and
 *     ALIAS is not (save_model drops the other names of a shared tensor and
 *     records them so);
 *   - "tie_word_embeddings": true in the config.json beside the checkpoint:
 *     the input embedding (the 2-D tensor with vocab_size rows that is not an
 *     output head) is tied to the output head; a head stored as well is a
 *     copy, left out of the spec. Not consulted when the metadata named a
 *     tie (a save_model file beside its config.json).
 * Of a tie's names the spec uses the stored one unless it is an output
 * head's (its unit's last part is lm_head, head, output or embed_out) and an
 * alias is not.
 */
#ifndef MF_INIT_TIES_H
#define MF_INIT_TIES_H

#include <stddef.h>

#include "mf_ckpt_hf.h"

typedef struct mf_init_ties {
    char **name;            /* per model tensor: its spec name when not its own (owned), else NULL */
    unsigned char *tied;    /* per model tensor: 1 when it gets the tied layout */
    unsigned char *dropped; /* per model tensor: 1 when it is a stored copy of a tie, not in the spec */
    int nnotes;
    char **notes;           /* lines for the spec's header comment (owned) */
} mf_init_ties;

/* Finds the ties of model m, opened from model_path (a file or directory;
 * config.json is looked for in the directory). Fills *t (per tensor arrays
 * of m->n entries; release with mf_init_ties_free). 0, or -1 with a located
 * message in err. */
int mf_init_ties_find(const mf_hf_model *m, const char *model_path, mf_init_ties *t, char *err, size_t errlen);
void mf_init_ties_free(mf_init_ties *t, int n);

#endif

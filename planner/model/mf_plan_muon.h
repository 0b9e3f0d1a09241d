/*
 * mf_plan_muon: which 2-D tensors of a spec Muon orthogonalises under the
 * Muon recipe that `mfsdpc plan --optimizer muon` models (docs/plan.md §2),
 * the planner's counterpart of PyTorch's mt.hidden_matrices (docs/pytorch.md,
 * "Matrix optimizers"): every 2-D tensor but the input embedding and the
 * output head, which the recipe gives to AdamW.
 *
 * A spec holds no module types, so the embedding and the head are told by
 * where they stand: the blocks are the units a `for` loop expands (units
 * sharing their declaration's span); when the first unit is not one of them,
 * the rows (dims[0]) of its first 2-D tensor are the vocabulary V, and every
 * 2-D tensor with V rows in a unit outside the loops is the embedding or the
 * head ([vocab, d] both). A spec whose first unit is a block (or with no
 * loop at all) has no such tensor: every 2-D tensor is Muon's.
 */
#ifndef MF_PLAN_MUON_H
#define MF_PLAN_MUON_H

#include <stdbool.h>

#include "mf_spec.h"

/* The full names of the spec's 2-D tensors the recipe gives to AdamW, sorted
 * (strcmp), in *out: a malloc'ed array (free it) of the spec's own strings
 * (borrowed); returns their count, or -1 on out of memory. */
int mf_plan_muon_adamw(const mf_spec *spec, const char ***out);
/* Whether `name` is among names[0..n) (sorted as mf_plan_muon_adamw gives). */
bool mf_plan_muon_is_adamw(const char *const *names, int n, const char *name);

#endif

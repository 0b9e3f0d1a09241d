/*
 * mf_test_builder: a small, test-only schedule generator, independent of the
 * planner, so the runtime is tested against schedules whose construction is
 * simple enough to trust: every transition is a chain of single-axis steps
 * (gathers outermost-first, reductions innermost-first, docs/semantics.md §2), every
 * hook starts with a compute record that every stream waits for, every chain
 * waits for its previous instance, consecutive ops on different streams are
 * joined by record/wait, and compute waits for what it reads. Deliberately
 * over-synchronized; no prefetch, no bucket merging.
 *
 * Ownership: mf_tb_build returns an owned schedule (mf_schedule_free).
 */
#ifndef MF_TEST_BUILDER_H
#define MF_TEST_BUILDER_H

#include "mf_schedule.h"

#define MF_TB_MAX_TENSORS 8
#define MF_TB_MAX_UNITS 8
#define MF_TB_MAX_LAYOUTS 4

typedef struct mf_tb_layout {
    mf_dtype dtype[MF_ROLE_COUNT];     /* weight, grad, main_weight */
    const char *place[MF_ROLE_COUNT];  /* letters per axis, e.g. "RF", "PF", "FF" */
} mf_tb_layout;

typedef struct mf_tb_tensor {
    const char *name;       /* tensor name inside its unit */
    int64_t numel;
    int layout;             /* index into layouts */
} mf_tb_tensor;

typedef struct mf_tb_unit {
    const char *name;
    bool keep_after_forward; /* reshard_after_forward false */
    int ntensors;
    mf_tb_tensor tensors[MF_TB_MAX_TENSORS];
} mf_tb_unit;

typedef struct mf_tb_spec {
    int naxes;
    int64_t sizes[MF_MAX_AXES];
    int64_t microbatches;
    mf_reduce reduce;
    int nlayouts;
    mf_tb_layout layouts[MF_TB_MAX_LAYOUTS];
    int nunits;
    mf_tb_unit units[MF_TB_MAX_UNITS];
    uint8_t salt;           /* changes the schedule hash (mismatch tests) */
} mf_tb_spec;

/* A spec of one microbatch on a 1-D mesh of `ranks` ranks, with one layout
 * and one unit for the caller to fill (spec->layouts[0], spec->units[0]). */
void mf_tb_spec_1d(mf_tb_spec *spec, int64_t ranks, mf_reduce reduce);

/* ops[at] and ops[at + 1]: step_begin's fence, a record (event 0) on the
 * inner stream that the compute stream waits for. */
void mf_tb_step_begin_fence(mf_op *ops, int at);

/* Builds the schedule; NULL with a message when the spec is illegal. */
mf_schedule *mf_tb_build(const mf_tb_spec *spec, char *err, size_t errlen);

/* Placement letters of a docs/semantics.md §4.5 mode on k axes (outer axes get the
 * mode's outer placement). Returns false for an unknown mode. */
bool mf_tb_mode(const char *mode, int naxes, mf_tb_layout *out);

/* The mode names of docs/semantics.md §4.5. */
extern const char *const mf_tb_modes[];
extern const int mf_tb_nmodes;

#endif

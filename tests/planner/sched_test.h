/*
 * Helpers shared by the schedule tests: compile spec text through the real
 * pipeline, emit to memory, build mode specs, mutate op lists.
 */
#ifndef SCHED_TEST_H
#define SCHED_TEST_H

#include <stdbool.h>
#include <stddef.h>

#include "mf_diff.h"
#include "mf_load.h"
#include "mf_pipeline.h"

/* Compiles spec text named `name` (the schedule's source). Returns an owned
 * schedule, or NULL; *diag (when non-NULL) gets the owned diagnostics text. */
mf_schedule *st_compile(const char *name, const char *text, bool verify, char **diag);

/* Canonical YAML of s; owned, NUL-terminated; *len its length. */
char *st_emit(const mf_schedule *s, size_t *len);

/* Runs the verifier; returns the error count, *diag the owned messages. */
int st_verify(const mf_schedule *s, char **diag);

/*
 * A spec of `units` units "u0".."u{n-1}" with one layout `L` and two tensors
 * each ([37, 11] and [5]: sizes that pad), on `mesh` (e.g. "dp_outer = 2,
 * dp_inner = 4"), with placements given as letters per axis ("RF", "PF",
 * "FF"). `extra` is appended to the top (options such as "prefetch 2;").
 * When keep_last is true the last unit has reshard_after_forward false.
 * Returns owned text.
 */
char *st_mode_spec(const char *mesh, const char *w, const char *g, const char *o, int units, int microbatches,
                   const char *extra, bool keep_last);

/* Removes op `id` and renumbers the ops after it. */
void st_drop_op(mf_schedule *s, int id);

/* The first op with these fields (-1 = any for unit/bucket/axis/transition),
 * or -1. */
int st_find_op(const mf_schedule *s, int phase, int unit, int kind, int stream, int transition, int bucket,
               int axis);

/* Index of the unit / bucket / buffer with this name, or -1. */
int st_unit(const mf_schedule *s, const char *name);
int st_bucket(const mf_schedule *s, const char *name);
int st_buffer(const mf_schedule *s, const char *name);

/* Reads a whole file (owned, NUL-terminated) or NULL. */
char *st_read(const char *path, size_t *len);

/* text with the first occurrence of find replaced by repl (owned); aborts
 * (fails the test) when find is not in it. */
char *st_replace(const char *text, const char *find, const char *repl);

#endif

/*
 * mf_emit_lines: the `buffers:` and `ops:` sections of the canonical schedule
 * YAML (docs/schedule.md §1) written directly, one flow mapping per line,
 * without an emitter event per scalar. planner/passes/mf_emit.c writes the rest of
 * the document with libyaml's emitter and calls these between its segments.
 *
 * The direct writer takes a section only when every string it would print is
 * plain under the project's one quoting rule (core/mf_yaml_str.h) and every
 * index is in range: then libyaml writes each string verbatim and the line is
 * a fixed layout of keys, ", " and ": ". Otherwise it writes nothing and says
 * so, and the caller writes that section with libyaml's emitter; either way
 * the bytes are the same (docs/schedule.md §1, "How the file is written").
 */
#ifndef MF_EMIT_LINES_H
#define MF_EMIT_LINES_H

#include <stdio.h>

#include "mf_schedule.h"

/* Results of the writers below. */
enum { MF_EMIT_LINES_OK = 0, MF_EMIT_LINES_NOT_PLAIN = 1, MF_EMIT_LINES_IO = -1 };

/* The names of one schedule, measured once for both sections. */
typedef struct mf_emit_lines mf_emit_lines;

/* Measures the names of s (which must outlive the result); NULL when out of
 * memory. Free with mf_emit_lines_free(). */
mf_emit_lines *mf_emit_lines_new(const mf_schedule *s);
void mf_emit_lines_free(mf_emit_lines *l);

/* Writes the `buffers:` section (key and items, ending in a newline) to out,
 * or nothing (MF_EMIT_LINES_NOT_PLAIN) when a string would need quotes or l
 * is NULL. MF_EMIT_LINES_IO: a write failed (out then holds part of it). */
int mf_emit_lines_buffers(mf_emit_lines *l, FILE *out);

/* The same for the `ops:` section. */
int mf_emit_lines_ops(mf_emit_lines *l, FILE *out);

#endif

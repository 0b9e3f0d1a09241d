/*
 * mf_load: reads a schedule file (docs/schedule.md §2) back into an mf_schedule.
 * Shared by the runtime and mfsdpc. Every malformed input is refused with a
 * located message "file:line:col: error: ..." (unknown format, missing key,
 * wrong type, dangling reference, size inconsistent with the layout); there is
 * no silent fallback. On success the schedule's hash is the SHA-256 of the
 * file's bytes and its summary is recomputed and checked against the file's.
 */
#ifndef MF_LOAD_H
#define MF_LOAD_H

#include "mf_schedule.h"

/* Returns an owned schedule, or NULL with a message (NUL-terminated, possibly
 * truncated) in err[0..errlen). `name` is used in messages only. */
mf_schedule *mf_load_schedule_buffer(const char *name, const char *text, size_t len,
                                     char *err, size_t errlen);
mf_schedule *mf_load_schedule_file(const char *path, char *err, size_t errlen);

/* SHA-256 of a byte string (lowercase hex in hex[65] when hex is non-NULL). */
void mf_sha256(const void *data, size_t len, uint8_t out[32], char hex[65]);

#endif

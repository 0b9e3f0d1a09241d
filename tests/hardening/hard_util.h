/*
 * hard_util: small helpers shared by the hardening tests: whole-file reads,
 * the seed schedules, a deterministic PRNG, and the check that a loader
 * message is located ("NAME:LINE:COL: error: ...").
 */
#ifndef HARD_UTIL_H
#define HARD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reads a whole file (NUL-terminated, owned); NULL when unreadable. */
char *hard_read(const char *path, size_t *len);

/* The paths (owned, sorted) of the files in dir ending in suffix, at most
 * max; returns how many. */
int hard_list(const char *dir, const char *suffix, char **out, int max);

/* xorshift64*: the same sequence on every machine for a seed. */
uint64_t hard_rand(uint64_t *state);

/* True when msg is "name:LINE:COL: error: ..." with LINE in [1, max_line];
 * stores LINE in *line when non-NULL. */
bool hard_located(const char *msg, const char *name, int max_line, int *line);

/* 1-based line of byte offset `at` in text. */
int hard_line_of(const char *text, size_t at);

#endif

/*
 * mf_human: byte counts as a person reads them ("1.5 MiB"), for the reports
 * of explain, plan, simulate and the memory options' messages.
 */
#ifndef MF_HUMAN_H
#define MF_HUMAN_H

#include <stddef.h>
#include <stdint.h>

/* "1.5 MiB"-style rendering of a byte count (whole bytes below 1 KiB), for
 * explain's and plan's reports. Returns buf. */
char *mf_human_bytes(int64_t bytes, char *buf, size_t size);
/* The same with `digits` decimals ("9.85 GiB" with 2; plan's table). */
char *mf_human_bytes_digits(int64_t bytes, int digits, char *buf, size_t size);

#endif

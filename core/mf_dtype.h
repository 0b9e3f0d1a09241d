/*
 * mf_dtype: conversion between the schedule's element types (fp32, bf16,
 * fp16), bit-exact and the same everywhere: the CPU backends' kernels, the
 * public mfsdp_convert helpers, checkpoint import and export (ckpt/) and the
 * offline tools.
 *
 * Rounding is to nearest, ties to even; NaN stays NaN (quiet, sign kept);
 * a value past the largest finite one becomes infinity; fp16 subnormals are
 * rounded like any other value. bf16 <-> fp16 goes through fp32 (exact on
 * the way in, so it rounds once). Nothing here allocates.
 */
#ifndef MF_DTYPE_H
#define MF_DTYPE_H

#include <stdint.h>

#include "mf_schedule.h"

uint16_t mf_dtype_f32_to_bf16(float f);
float mf_dtype_bf16_to_f32(uint16_t h);
uint16_t mf_dtype_f32_to_fp16(float f);
float mf_dtype_fp16_to_f32(uint16_t h);

/* Element i of buffer p of dtype d, as a float; and the inverse store
 * (rounded as above). */
float mf_dtype_load(const void *p, mf_dtype d, int64_t i);
void mf_dtype_store(void *p, mf_dtype d, int64_t i, float v);

/* dst[i] = (dd) src[i], i < n (n <= 0: nothing). Same dtype: memmove, so
 * dst may equal src. */
void mf_dtype_convert(void *dst, mf_dtype dd, const void *src, mf_dtype sd, int64_t n);

#endif

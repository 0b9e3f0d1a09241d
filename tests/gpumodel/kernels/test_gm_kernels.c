/*
 * The host build of the device kernels (gm_kernels.cpp) against the host
 * references, bit for bit: mf_cuda_host_to_bf16/fp16 and back (the nvcc-built
 * .cu's extern "C" part, in libmfsdp), mf_cpu_kernels_reduce (the CPU
 * backends' sums) and mf_pattern. Every combine<S, D> through the .cu's own
 * dispatch (gm_cu_combine: alignment choice, grid sizing): cast, accumulate,
 * scale, multi-source multi-destination sums with mul and div, in place,
 * aligned (vectorized) and unaligned pointers, ragged tails, guard elements
 * past the end untouched; NaN, infinities, subnormals, overflow and rounding
 * ties (NaN compared as NaN; the NaN bits that differ from the references
 * are pinned by test_nan_bits: gm_kernels.cpp, "NaN payloads"); the same launch
 * under other grids gives the same bits; fill against mf_pattern; the ranges
 * and parameter sizes the CUDA model relies on; the spin kernel's wait.
 *
 * `test_gm_kernels --list` prints the registry's keys (check_instantiations.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "gm_kernels_host.h"
#include "mf_cpu_kernels.h"
#include "mf_pattern.h"

#define GUARD 24 /* poisoned elements after every destination */
#define POISON 0xA5

static const mf_dtype dtypes[3] = {MF_FP32, MF_BF16, MF_FP16};
static const int64_t sizes[] = {1, 7, 8, 9, 31, 4099, (1 << 16) + 5};

static size_t esize(mf_dtype t) { return t == MF_FP32 ? 4 : 2; }

static float dec(mf_dtype t, const void *p, int64_t i)
{
    if (t == MF_FP32)
        return ((const float *)p)[i];
    uint16_t b = ((const uint16_t *)p)[i];
    return t == MF_BF16 ? mf_cuda_host_from_bf16(b) : mf_cuda_host_from_fp16(b);
}

static void enc(mf_dtype t, void *p, int64_t i, float v)
{
    if (t == MF_FP32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == MF_BF16 ? mf_cuda_host_to_bf16(v) : mf_cuda_host_to_fp16(v);
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Full fp32 mantissas (casts round), both signs, finite in fp16, and exact
 * bf16 and fp16 halfway cases. */
static uint32_t rng = 7;
static float draw(void)
{
    rng = rng * 1664525u + 1013904223u;
    switch (rng >> 28) {
    case 0: return f_of(0x3f808000u | ((rng & 0xff) << 16));            /* bf16 tie */
    case 1: return f_of(0x3f801000u | ((rng & 0x3ff) << 13));           /* fp16 tie */
    default: {
        float f = ldexpf((float)(rng >> 8) / 16777216.0f, (int)(rng % 24) - 12);
        return (rng & 0x100) ? -f : f;
    }
    }
}

/* The special inputs: NaN, infinities, zeros of both signs, fp32 subnormals,
 * fp16 subnormals and their rounding, fp16 overflow and its edge. */
static const uint32_t specials[] = {
    0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
    0x00000001u, 0x807fffffu, 0x00400000u, 0x33000000u, 0x33000001u, 0x337fffffu, 0x38800000u,
    0x387fc000u, 0x38000000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0xc77ff000u, 0x7f7fffffu,
    0x3f808000u, 0x3f818000u, 0x3f801000u, 0x3f803000u, 0xbf808000u, 0x3effffffu, 0x7f7f8000u,
};

typedef struct hbuf {
    unsigned char *base;
    void *p;  /* base + shift elements */
    mf_dtype t;
    int64_t n;
} hbuf;

/* n elements + GUARD, 16-byte aligned base, shifted by `shift` elements (odd
 * shifts defeat the vector path). */
static hbuf halloc(mf_dtype t, int64_t n, int shift)
{
    hbuf b = {.t = t, .n = n};
    size_t bytes = (size_t)(n + GUARD + 8) * esize(t);
    b.base = aligned_alloc(64, (bytes + 63) / 64 * 64);
    assert_non_null(b.base);
    memset(b.base, POISON, bytes);
    b.p = b.base + (size_t)shift * esize(t);
    return b;
}

static void check_guard(const hbuf *b, const char *what)
{
    const unsigned char *g = (const unsigned char *)b->p + (size_t)b->n * esize(b->t);
    for (size_t k = 0; k < (size_t)GUARD * esize(b->t); k++)
        if (g[k] != POISON)
            fail_msg("%s: byte %zu past the end written", what, k);
}

static void fill_values(hbuf *b, int with_specials)
{
    for (int64_t i = 0; i < b->n; i++) {
        int64_t s = i % 5 == 3 ? i / 5 : -1;
        float v = with_specials && s >= 0 ? f_of(specials[s % (int64_t)(sizeof specials / sizeof specials[0])])
                                          : draw();
        enc(b->t, b->p, i, v);
    }
}

static int same_bits(mf_dtype t, const void *got, const void *want, int64_t i)
{
    float g = dec(t, got, i), w = dec(t, want, i);
    if (isnan(g) || isnan(w))
        return isnan(g) && isnan(w);
    return t == MF_FP32 ? memcmp((const float *)got + i, (const float *)want + i, 4) == 0
                        : ((const uint16_t *)got)[i] == ((const uint16_t *)want)[i];
}

static void expect_equal(mf_dtype t, const void *got, const void *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (!same_bits(t, got, want, i))
            fail_msg("%s: element %lld of %lld: got %.9g want %.9g", what, (long long)i, (long long)n,
                     (double)dec(t, got, i), (double)dec(t, want, i));
}

/* ---- combine ---- */

typedef struct ccase {
    mf_dtype s, d;
    int nsrc, ndst;
    int64_t n;
    int shift;        /* elements: 0 aligned (vector path), odd unaligned */
    float scale;
    mf_cuda_scaling how;
    int add_dst;
    int in_place;     /* dst[0] is src[0] (s == d) */
    int specials;
} ccase;

/* The reference: sources summed in order in fp32, scaled (not when 1), added
 * to the old dst[0], rounded once by the host references. */
static float reference(const ccase *c, hbuf *src, float old0, int64_t i)
{
    float acc = dec(c->s, src[0].p, i);
    for (int k = 1; k < c->nsrc; k++)
        acc += dec(c->s, src[k].p, i);
    if (c->scale != 1.0f)
        acc = c->how == MF_CUDA_DIV ? acc / c->scale : acc * c->scale;
    return c->add_dst ? old0 + acc : acc;
}

static void run_case(const ccase *c, char *what)
{
    hbuf src[4], dst[3];
    void *dp[3];
    const void *sp[4];
    for (int k = 0; k < c->nsrc; k++) {
        src[k] = halloc(c->s, c->n, c->shift + k % 2 * (c->shift ? 2 : 0));
        fill_values(&src[k], c->specials);
        sp[k] = src[k].p;
    }
    for (int j = 0; j < c->ndst; j++) {
        if (j == 0 && c->in_place) {
            dst[0] = src[0];
        } else {
            dst[j] = halloc(c->d, c->n, c->shift);
            fill_values(&dst[j], 0);
        }
        dp[j] = dst[j].p;
    }
    hbuf want = halloc(c->d, c->n, 0);
    for (int64_t i = 0; i < c->n; i++)
        enc(c->d, want.p, i, reference(c, src, dec(c->d, dst[0].p, i), i));
    int before = gm_kernels_host_launches();
    assert_int_equal(gm_cu_combine(dp, c->ndst, c->d, sp, c->nsrc, c->s, c->n, c->scale, c->how,
                                   c->add_dst, 0), cudaSuccess);
    assert_int_equal(gm_kernels_host_launches(), before + 1);
    for (int j = 0; j < c->ndst; j++) {
        expect_equal(c->d, dst[j].p, want.p, c->n, what);
        check_guard(&dst[j], what);
    }
    for (int k = 0; k < c->nsrc; k++)
        check_guard(&src[k], what);
    free(want.base);
    for (int j = c->in_place ? 1 : 0; j < c->ndst; j++)
        free(dst[j].base);
    for (int k = 0; k < c->nsrc; k++)
        free(src[k].base);
}

static void describe(char *out, size_t len, const ccase *c)
{
    snprintf(out, len, "combine<%d, %d> nsrc %d ndst %d n %lld shift %d scale %g %s%s%s%s", (int)c->s,
             (int)c->d, c->nsrc, c->ndst, (long long)c->n, c->shift, (double)c->scale,
             c->how == MF_CUDA_DIV ? "div" : "mul", c->add_dst ? " add_dst" : "", c->in_place ? " in place" : "",
             c->specials ? " specials" : "");
}

/* Every (S, D) pair: cast, accumulate, sums of 3 into 2 destinations with
 * mul and div, aligned and not, every ragged size. */
static void test_combine_pairs(void **state)
{
    (void)state;
    char what[200];
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
                for (int shift = 0; shift < 2; shift++)
                    for (int form = 0; form < 4; form++) {
                        ccase c = {.s = dtypes[a], .d = dtypes[b], .n = sizes[z], .shift = shift, .nsrc = 1,
                                   .ndst = 1, .scale = 1.0f, .how = MF_CUDA_MUL, .specials = form == 3};
                        if (form == 1)
                            c.add_dst = 1;
                        if (form == 2) {
                            c.nsrc = 3, c.ndst = 2, c.scale = 3.0f, c.how = (z % 2) ? MF_CUDA_DIV : MF_CUDA_MUL;
                            c.add_dst = (int)(z % 3 == 0);
                        }
                        if (form == 3)
                            c.nsrc = 2, c.scale = 0.1f, c.how = MF_CUDA_DIV, c.add_dst = 1;
                        describe(what, sizeof what, &c);
                        run_case(&c, what);
                    }
}

/* In place: scale, accumulate and a reduce whose first destination is its
 * first source, with special values. */
static void test_combine_in_place(void **state)
{
    (void)state;
    char what[200];
    for (int a = 0; a < 3; a++)
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
            for (int shift = 0; shift < 2; shift++) {
                ccase c = {.s = dtypes[a], .d = dtypes[a], .n = sizes[z], .shift = shift, .nsrc = 1, .ndst = 1,
                           .scale = 0.375f, .how = MF_CUDA_MUL, .in_place = 1, .specials = 1};
                describe(what, sizeof what, &c);
                run_case(&c, what);
                c.nsrc = 4, c.ndst = 3, c.scale = 4.0f, c.how = MF_CUDA_DIV;
                describe(what, sizeof what, &c);
                run_case(&c, what);
            }
}

/* The CPU backends' reduce (mf_cpu_kernels_reduce) and the device's average
 * of a group agree bit for bit: sources of the same dtype divided by their
 * count. */
static void test_combine_vs_cpu_reduce(void **state)
{
    (void)state;
    static const int groups[] = {1, 2, 3, 4, 8};
    for (int a = 0; a < 3; a++)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
            for (int shift = 0; shift < 2; shift++) {
                mf_dtype t = dtypes[a];
                int64_t n = 4099;
                hbuf src[8];
                const void *sp[8];
                for (int k = 0; k < groups[g]; k++) {
                    src[k] = halloc(t, n, shift);
                    fill_values(&src[k], 1);
                    sp[k] = src[k].p;
                }
                hbuf got = halloc(t, n, shift), want = halloc(t, n, 0);
                void *dp[1] = {got.p};
                assert_int_equal(gm_cu_combine(dp, 1, t, sp, groups[g], t, n, (float)groups[g], MF_CUDA_DIV,
                                               false, 0), cudaSuccess);
                mf_cpu_kernels_reduce(want.p, sp, groups[g], 0, n, t, groups[g]);
                char what[96];
                snprintf(what, sizeof what, "dtype %d group %d shift %d vs mf_cpu_kernels_reduce", (int)t,
                         groups[g], shift);
                expect_equal(t, got.p, want.p, n, what);
                check_guard(&got, what);
                free(got.base);
                free(want.base);
                for (int k = 0; k < groups[g]; k++)
                    free(src[k].base);
            }
}

/* ---- the registry: direct launches ---- */

/* combine_kernel's first parameter, as the .cu declares it (its size is
 * checked against the registry's arg_size[0]). */
typedef struct operands {
    const void *src[MF_CUDA_MAX_OPERANDS];
    void *dst[MF_CUDA_MAX_OPERANDS];
    int nsrc, ndst;
} operands;

static const gm_kernel *find(const char *key)
{
    const gm_kernel *k = gm_kernels_find(key);
    if (!k)
        fail_msg("no host build of %s", key);
    return k;
}

/* One launch's result does not depend on the grid: 1 thread, odd blocks of
 * odd sizes and the .cu's own grid all give the bits of gm_cu_combine. */
static void test_grid_independent(void **state)
{
    (void)state;
    static const dim3 grids[][2] = {
        {{1, 1, 1}, {1, 1, 1}}, {{3, 1, 1}, {5, 1, 1}}, {{7, 1, 1}, {256, 1, 1}}, {{2048, 1, 1}, {256, 1, 1}}};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int shift = 0; shift < 2; shift++) {
                int64_t n = 1029;
                hbuf s0 = halloc(dtypes[a], n, shift), s1 = halloc(dtypes[a], n, shift);
                hbuf want = halloc(dtypes[b], n, shift), got = halloc(dtypes[b], n, shift);
                fill_values(&s0, 1);
                fill_values(&s1, 0);
                void *dp[1] = {want.p};
                const void *sp[2] = {s0.p, s1.p};
                assert_int_equal(gm_cu_combine(dp, 1, dtypes[b], sp, 2, dtypes[a], n, 0.5f, MF_CUDA_MUL, false, 0),
                                 cudaSuccess);
                char key[64];
                snprintf(key, sizeof key, "combine_kernel<%d, %d>", (int)dtypes[a], (int)dtypes[b]);
                const gm_kernel *k = find(key);
                assert_int_equal(k->arg_size[0], sizeof(operands));
                operands ops = {.src = {s0.p, s1.p}, .dst = {got.p}, .nsrc = 2, .ndst = 1};
                float scale = 0.5f;
                bool divide = false, add_dst = false, vec = shift == 0;
                void *args[] = {&ops, &n, &scale, &divide, &add_dst, &vec};
                for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
                    memset(got.p, 0, (size_t)n * esize(dtypes[b]));
                    k->run(args, grids[g][0], grids[g][1]);
                    char what[96];
                    snprintf(what, sizeof what, "%s shift %d grid %u x %u", key, shift, grids[g][0].x,
                             grids[g][1].x);
                    expect_equal(dtypes[b], got.p, want.p, n, what);
                    check_guard(&got, what);
                }
                free(s0.base), free(s1.base), free(want.base), free(got.base);
            }
}

/* fill<T>: element i is mf_pattern(seed, i) rounded to T, nothing past n. */
static void test_fill(void **state)
{
    (void)state;
    static const uint32_t seeds[] = {0, 1, 12345, 0xffffffffu};
    for (int a = 0; a < 3; a++)
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
            for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
                int64_t n = sizes[z];
                hbuf got = halloc(dtypes[a], n, (int)(z % 2)), want = halloc(dtypes[a], n, 0);
                for (int64_t i = 0; i < n; i++)
                    enc(dtypes[a], want.p, i, mf_pattern(seeds[s], i));
                assert_int_equal(gm_cu_fill_pattern(got.p, dtypes[a], n, seeds[s], 0), cudaSuccess);
                char what[80];
                snprintf(what, sizeof what, "fill<%d> n %lld seed %u", (int)dtypes[a], (long long)n, seeds[s]);
                expect_equal(dtypes[a], got.p, want.p, n, what);
                check_guard(&got, what);
                free(got.base), free(want.base);
            }
}

/* The keys, parameter lists and ranges the CUDA model relies on. */
static void test_registry(void **state)
{
    (void)state;
    assert_int_equal(gm_kernels_count(), 13);
    for (int i = 0; i < gm_kernels_count(); i++) {
        const gm_kernel *k = gm_kernels_at(i);
        assert_ptr_equal(gm_kernels_find(k->key), k);
        assert_true(k->nargs >= 1 && k->nargs <= GM_KERNEL_MAX_ARGS);
    }
    assert_null(gm_kernels_at(13));
    assert_null(gm_kernels_find("combine_kernel<0, 3>"));
    assert_null(gm_kernels_find("combine_kernel<0,1>"));
    assert_null(gm_kernels_find(NULL));
    const gm_kernel *c = find("combine_kernel<1, 2>");
    assert_int_equal(c->nargs, 6);
    static const size_t csz[] = {sizeof(operands), 8, 4, 1, 1, 1};
    for (int i = 0; i < 6; i++)
        assert_int_equal(c->arg_size[i], csz[i]);
    const gm_kernel *f = find("fill_kernel<2>");
    assert_int_equal(f->nargs, 3);
    assert_int_equal(f->arg_size[0], sizeof(void *));
    assert_int_equal(f->arg_size[1], 8);
    assert_int_equal(f->arg_size[2], 4);
    const gm_kernel *s = find("spin_kernel");
    assert_int_equal(s->nargs, 1);
    assert_int_equal(s->arg_size[0], 8);
}

static void test_ranges(void **state)
{
    (void)state;
    char a[64], b[64], d0[64], d1[64];
    operands ops = {.src = {a, b}, .dst = {d0, d1}, .nsrc = 2, .ndst = 2};
    int64_t n = 10;
    float scale = 1;
    bool f = false;
    void *args[] = {&ops, &n, &scale, &f, &f, &f};
    gm_range r[GM_KERNELS_MAX_RANGES];
    assert_int_equal(find("combine_kernel<1, 0>")->ranges(args, r, GM_KERNELS_MAX_RANGES), 4);
    const void *want_p[] = {a, b, d0, d1};
    static const size_t want_bytes[] = {20, 20, 40, 40};
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(r[i].p, want_p[i]);
        assert_int_equal(r[i].bytes, want_bytes[i]);
        assert_int_equal(r[i].writes, i >= 2);
    }
    gm_range one[1] = {{NULL, 7, 9}};
    assert_int_equal(find("combine_kernel<1, 0>")->ranges(args, one, 1), 4); /* > cap: did not fit */
    assert_ptr_equal(one[0].p, a);
    ops.nsrc = MF_CUDA_MAX_OPERANDS + 1;
    assert_int_equal(find("combine_kernel<1, 0>")->ranges(args, r, GM_KERNELS_MAX_RANGES), -1);
    ops.nsrc = 0;
    assert_int_equal(find("combine_kernel<1, 0>")->ranges(args, r, GM_KERNELS_MAX_RANGES), -1);
    n = -5; /* the kernel touches nothing */
    ops.nsrc = 1;
    assert_int_equal(find("combine_kernel<2, 2>")->ranges(args, r, GM_KERNELS_MAX_RANGES), 3);
    assert_int_equal(r[0].bytes, 0);
    void *buf = d0;
    int64_t fn = 9;
    uint32_t seed = 1;
    void *fargs[] = {&buf, &fn, &seed};
    assert_int_equal(find("fill_kernel<0>")->ranges(fargs, r, GM_KERNELS_MAX_RANGES), 1);
    assert_ptr_equal(r[0].p, d0);
    assert_int_equal(r[0].bytes, 36);
    assert_int_equal(r[0].writes, 1);
    int64_t ns = 5;
    void *sargs[] = {&ns};
    assert_int_equal(find("spin_kernel")->ranges(sargs, r, GM_KERNELS_MAX_RANGES), 0);
}

/* The spin kernel waits at least its nanoseconds of the timer. */
static void test_spin(void **state)
{
    (void)state;
    unsigned long long t0 = gm_kernels_globaltimer_ns();
    assert_int_equal(gm_cu_spin(3000000, 0), cudaSuccess);
    assert_true(gm_kernels_globaltimer_ns() - t0 >= 3000000ull);
    int64_t ns = 0;
    void *args[] = {&ns};
    find("spin_kernel")->run(args, (dim3){1, 1, 1}, (dim3){1, 1, 1});
    assert_int_equal(gm_cu_spin(-1, 0), cudaErrorInvalidValue);
}

/* NaN bits (gm_kernels.cpp, "NaN payloads"): rounded to bf16 or fp16, any
 * NaN becomes CUDA's canonical 0x7fff, sign and payload dropped, where the
 * host references keep the sign and the top payload bits. Both are NaN. */
static void test_nan_bits(void **state)
{
    (void)state;
    float src[8];
    for (int i = 0; i < 8; i++)
        src[i] = f_of(i % 2 ? 0xffc00001u : 0x7fa00000u);
    for (int b = 1; b < 3; b++) {
        uint16_t got[8] __attribute__((aligned(16)));
        assert_int_equal(gm_cu_cast(got, dtypes[b], src, MF_FP32, 8, 0), cudaSuccess);
        for (int i = 0; i < 8; i++) {
            uint16_t ref = dtypes[b] == MF_BF16 ? mf_cuda_host_to_bf16(src[i]) : mf_cuda_host_to_fp16(src[i]);
            assert_int_equal(got[i], 0x7fff);
            assert_true(isnan(dtypes[b] == MF_BF16 ? mf_cuda_host_from_bf16(ref) : mf_cuda_host_from_fp16(ref)));
            assert_int_equal(ref >> 15, i % 2); /* the reference keeps the sign */
        }
    }
}

/* The .cu's argument checks run in the host build too. */
static void test_refusals(void **state)
{
    (void)state;
    float x[4] = {0};
    void *dp[1] = {x};
    const void *sp[1] = {x};
    int before = gm_kernels_host_launches();
    assert_int_equal(gm_cu_combine(dp, 1, MF_FP32, sp, 1, MF_FP32, -1, 1, MF_CUDA_MUL, false, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(gm_cu_combine(dp, 0, MF_FP32, sp, 1, MF_FP32, 4, 1, MF_CUDA_MUL, false, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(gm_cu_combine(dp, 1, MF_FP32, sp, 1, MF_FP32, 0, 1, MF_CUDA_MUL, false, 0), cudaSuccess);
    assert_int_equal(gm_cu_fill_pattern(x, MF_FP32, -1, 0, 0), cudaErrorInvalidValue);
    assert_int_equal(gm_kernels_host_launches(), before); /* n == 0 launches nothing */
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < gm_kernels_count(); i++)
            printf("%s\n", gm_kernels_at(i)->key);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_combine_pairs),   cmocka_unit_test(test_combine_in_place),
        cmocka_unit_test(test_combine_vs_cpu_reduce), cmocka_unit_test(test_grid_independent),
        cmocka_unit_test(test_fill),            cmocka_unit_test(test_spin),            cmocka_unit_test(test_nan_bits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Host buffers of the CPU backends (mf_base_aligned_zalloc): from
 * MF_RT_HUGE_MIN bytes on they are aligned to it and advised for transparent
 * huge pages (the kernel's VmFlags of the mapping carry "hg"), below it and
 * with MFSDP_HUGE_PAGES=0 they are not; every byte is zero either way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include "mf_rt.h"

/* Whether the kernel takes MADV_HUGEPAGE at all (built without THP: EINVAL). */
static bool kernel_has_thp(void)
{
    size_t n = MF_RT_HUGE_MIN;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    bool ok = madvise(p, n, MADV_HUGEPAGE) == 0;
    munmap(p, n);
    return ok;
}

/* 1 when the mapping holding p has the huge-page advice ("hg" in VmFlags),
 * 0 when it has not, -1 when /proc/self/smaps does not say. */
static int advised_huge(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool inside = false;
    int found = -1;
    uintptr_t at = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = at >= lo && at < hi;
            continue;
        }
        if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static bool all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static void test_large_buffers_get_huge_pages(void **state)
{
    (void)state;
    if (!kernel_has_thp())
        skip();
    unsetenv("MFSDP_HUGE_PAGES");
    size_t n = 3 * MF_RT_HUGE_MIN + 4096;   /* not a multiple: the tail stays small */
    unsigned char *p = mf_base_aligned_zalloc(256, n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % MF_RT_HUGE_MIN, 0);
    assert_true(all_zero(p, n));
    int hg = advised_huge(p);
    if (hg < 0) {
        mf_base_free(p);
        skip();
    }
    assert_int_equal(hg, 1);
    mf_base_free(p);
}

static void test_small_buffers_and_opt_out(void **state)
{
    (void)state;
    if (!kernel_has_thp())
        skip();
    unsetenv("MFSDP_HUGE_PAGES");
    /* below the threshold: the alignment asked for, no advice (a mapping of
     * its own, so that the heap's other advice cannot answer for it) */
    size_t small = MF_RT_HUGE_MIN - 4096;
    unsigned char *s = mf_base_aligned_zalloc(64, small);
    assert_non_null(s);
    assert_int_equal((uintptr_t)s % 64, 0);
    assert_true(all_zero(s, small));
    int hg = advised_huge(s);
    mf_base_free(s);
    if (hg < 0)
        skip();
    assert_int_equal(hg, 0);

    setenv("MFSDP_HUGE_PAGES", "0", 1);
    size_t n = 4 * MF_RT_HUGE_MIN;
    unsigned char *p = mf_base_aligned_zalloc(256, n);
    assert_non_null(p);
    assert_true(all_zero(p, n));
    assert_int_equal(advised_huge(p), 0);
    mf_base_free(p);
    unsetenv("MFSDP_HUGE_PAGES");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_buffers_get_huge_pages),
        cmocka_unit_test(test_small_buffers_and_opt_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

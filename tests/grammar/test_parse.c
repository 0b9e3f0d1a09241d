/*
 * Parser-level tests: the AST keeps what was written with the right spans;
 * buffers need no NUL terminator; odd bytes, truncations and floods of errors
 * are reported without crashing; recovery finds independent errors; the
 * nesting and error-printing limits hold.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mf_pipeline.h"

typedef struct {
    mf_arena *arena;
    mf_source src;
    mf_diag diag;
    char *out;
    size_t out_len;
    FILE *f;
    mf_ast *ast;
} parsed;

static void parse_n(parsed *p, const char *text, size_t len)
{
    memset(p, 0, sizeof *p);
    p->arena = mf_arena_create();
    assert_non_null(p->arena);
    p->src.path = "t.mfsdp";
    p->src.text = text;
    p->src.len = len;
    p->f = open_memstream(&p->out, &p->out_len);
    assert_non_null(p->f);
    mf_diag_init(&p->diag, &p->src, p->f);
    p->ast = mf_parse(&p->src, &p->diag, p->arena);
    mf_diag_finish(&p->diag);
    fflush(p->f);
}

static void parse(parsed *p, const char *text)
{
    parse_n(p, text, strlen(text));
}

static void done(parsed *p)
{
    fclose(p->f);
    free(p->out);
    mf_arena_destroy(p->arena);
}

static void assert_span(mf_span s, int line, int col, int end_line, int end_col)
{
    assert_int_equal(s.line, line);
    assert_int_equal(s.col, col);
    assert_int_equal(s.end_line, end_line);
    assert_int_equal(s.end_col, end_col);
}

static const char spec[] =
    "mesh dp_outer = 2, dp_inner = 4;\n"                      /* 1 */
    "microbatches 8;\n"                                       /* 2 */
    "bucket_size 64MiB;\n"                                    /* 3 */
    "layout hfsdp {\n"                                        /* 4 */
    "  weight bf16 [Replicate, dp_inner: Flat];\n"            /* 5 */
    "  grad fp32 [Partial, Flat];\n"                          /* 6 */
    "  main_weight fp32 [Flat, Flat];\n"                      /* 7 */
    "}\n"                                                     /* 8 */
    "unit \"layers.{i}\" for i in 0..32 layout hfsdp {\n"     /* 9 */
    "  reshard_after_forward false;\n"                        /* 10 */
    "  tensor \"wqkv\" [6144, 4096];\n"                       /* 11 */
    "  tensor \"norm\" [4096] layout other;\n"                /* 12 */
    "  for e in 0..64 { tensor \"e{e}\" [7]; }\n"             /* 13 */
    "  tensor \"x\" [3] { weight fp32 [R, R]; }\n"            /* 14 */
    "}\n";                                                    /* 15 */

static void test_ast_shape_and_spans(void **state)
{
    (void)state;
    parsed p;
    parse(&p, spec);
    assert_int_equal(p.diag.nerrors, 0);
    assert_non_null(p.ast);
    const mf_ast *a = p.ast;

    assert_non_null(a->meshes);
    assert_null(a->meshes->next);
    assert_int_equal(a->meshes->naxes, 2);
    assert_string_equal(a->meshes->axes->name.text, "dp_outer");
    assert_span(a->meshes->axes->name.span, 1, 6, 1, 14);
    assert_int_equal(a->meshes->axes->next->size.value, 4);
    assert_span(a->meshes->axes->next->size.span, 1, 31, 1, 32);

    const mf_ast_setting *st = a->settings;
    assert_int_equal(st->kind, MF_AST_SET_MICROBATCHES);
    assert_int_equal(st->num.value, 8);
    assert_span(st->span, 2, 1, 2, 16);
    st = st->next;
    assert_int_equal(st->kind, MF_AST_SET_BUCKET_SIZE);
    assert_int_equal(st->num.value, 64);
    assert_string_equal(st->num.suffix, "MiB");
    assert_null(st->next);

    const mf_ast_layout *l = a->layouts;
    assert_string_equal(l->name.text, "hfsdp");
    assert_span(l->span, 4, 8, 4, 13);
    const mf_ast_role *r = l->roles;
    assert_int_equal(r->role, MF_ROLE_WEIGHT);
    assert_string_equal(r->dtype.text, "bf16");
    assert_int_equal(r->nplaces, 2);
    assert_null(r->places->axis.text);
    assert_string_equal(r->places->next->axis.text, "dp_inner");
    assert_string_equal(r->places->next->value.text, "Flat");
    assert_span(r->places_span, 5, 15, 5, 42);
    assert_int_equal(r->next->next->role, MF_ROLE_MAIN_WEIGHT);
    assert_null(r->next->next->next);

    const mf_ast_unit *u = a->units;
    assert_string_equal(u->name.text, "layers.{i}");
    assert_span(u->name.span, 9, 6, 9, 18);
    assert_non_null(u->loop);
    assert_string_equal(u->loop->var.text, "i");
    assert_int_equal(u->loop->lo.value, 0);
    assert_int_equal(u->loop->hi.value, 32);
    assert_string_equal(u->layout.text, "hfsdp");

    const mf_ast_item *it = u->body;
    assert_int_equal(it->kind, MF_AST_ITEM_OPTION);
    assert_string_equal(it->value.text, "false");
    it = it->next;
    assert_int_equal(it->kind, MF_AST_ITEM_TENSOR);
    assert_string_equal(it->tensor.name.text, "wqkv");
    assert_int_equal(it->tensor.ndims, 2);
    assert_int_equal(it->tensor.dims->size.value, 6144);
    assert_int_equal(it->tensor.dims->next->size.value, 4096);
    assert_span(it->tensor.dims_span, 11, 17, 11, 29);
    assert_null(it->tensor.layout.text);
    assert_null(it->tensor.inline_layout);
    it = it->next;
    assert_string_equal(it->tensor.layout.text, "other");
    it = it->next;
    assert_int_equal(it->kind, MF_AST_ITEM_FOR);
    assert_string_equal(it->loop.var.text, "e");
    assert_int_equal(it->loop.hi.value, 64);
    assert_string_equal(it->body->tensor.name.text, "e{e}");
    it = it->next;
    assert_non_null(it->tensor.inline_layout);
    assert_null(it->tensor.inline_layout->name.text);
    assert_span(it->tensor.inline_layout->span, 14, 18, 14, 19);
    assert_null(it->next);
    done(&p);
}

/* The parser reads exactly len bytes: what follows is never looked at. */
static void test_buffer_without_nul(void **state)
{
    (void)state;
    const char text[] = "mesh dp = 8;@@@ garbage";
    parsed p;
    parse_n(&p, text, strlen("mesh dp = 8;"));
    assert_int_equal(p.diag.nerrors, 0);
    assert_int_equal(p.ast->meshes->axes->size.value, 8);
    done(&p);

    char *heap = malloc(12);
    assert_non_null(heap);
    memcpy(heap, "mesh dp = 8;", 12); /* no terminator at all */
    parse_n(&p, heap, 12);
    assert_int_equal(p.diag.nerrors, 0);
    done(&p);
    free(heap);
}

static void test_nul_and_high_bytes(void **state)
{
    (void)state;
    const char text[] = "mesh dp = 8;\0\n\xff\xfe unit \"a\0b\" {}\n";
    parsed p;
    parse_n(&p, text, sizeof text - 1);
    assert_true(p.diag.nerrors >= 3);
    assert_non_null(strstr(p.out, "t.mfsdp:1:13: error: stray '\\x00' in the input"));
    assert_non_null(strstr(p.out, "t.mfsdp:2:1: error: stray bytes '\\xff\\xfe'"));
    assert_non_null(strstr(p.out, "control character \\x00 in a string"));
    done(&p);
}

/* Every prefix of a valid spec parses and checks without crashing; the
 * full text is clean. */
static void test_every_prefix(void **state)
{
    (void)state;
    size_t n = strlen(spec);
    for (size_t len = 0; len <= n; len++) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *out = open_memstream(&buf, &blen);
        mf_compile_options opt = {.stop_after = MF_STAGE_SEMA, .diag_out = out};
        mf_compilation c;
        int rc = mf_pipeline_compile_buffer("p.mfsdp", spec, len, &opt, &c);
        mf_compilation_free(&c);
        fclose(out);
        assert_in_range(rc, 0, 1);
        if (rc == 1)
            assert_non_null(strstr(buf, "error:"));
        free(buf);
    }
}

static void test_recovery_reports_each_error(void **state)
{
    (void)state;
    parsed p;
    parse(&p, "mesh dp = 8;\n"
              "unit \"a\" layout l {\n"
              "  tensor \"w\" [4 4];\n"         /* 3:17 */
              "}\n"
              "unit \"b\" layout l {\n"
              "  tensor \"w\" [4] lay;\n"       /* 6:18 */
              "}\n"
              "layout l {\n"
              "  weight fp32 [Replicate]\n"     /* 9:26 missing ; */
              "  grad fp32 [Partial];\n"
              "  main_weight fp32 [Replicate];\n"
              "}\n");
    assert_int_equal(p.diag.nerrors, 3);
    assert_non_null(strstr(p.out, "t.mfsdp:3:17: error: expected ',' or ']' before integer 4"));
    assert_non_null(strstr(p.out, "t.mfsdp:6:18: error: "));
    assert_non_null(strstr(p.out, "t.mfsdp:9:26: error: expected ';' before 'grad'"));
    /* the units around the errors survive */
    assert_non_null(p.ast);
    assert_string_equal(p.ast->units->name.text, "a");
    assert_string_equal(p.ast->units->next->name.text, "b");
    done(&p);
}

static char *nested(int depth)
{
    size_t cap = 64 + (size_t)depth * 40;
    char *b = malloc(cap);
    assert_non_null(b);
    int o = snprintf(b, cap, "mesh dp = 2;\nunit \"u\" {\n");
    for (int i = 0; i < depth; i++)
        o += snprintf(b + o, cap - (size_t)o, "for v%d in 0..1 {\n", i);
    o += snprintf(b + o, cap - (size_t)o, "tensor \"w\" [1];\n");
    for (int i = 0; i < depth; i++)
        o += snprintf(b + o, cap - (size_t)o, "}\n");
    snprintf(b + o, cap - (size_t)o, "}\n");
    return b;
}

static void test_nesting_limit(void **state)
{
    (void)state;
    /* the unit body is one block: MF_PARSE_MAX_NESTING - 1 loops fit */
    char *ok = nested(MF_PARSE_MAX_NESTING - 1);
    parsed p;
    parse(&p, ok);
    assert_int_equal(p.diag.nerrors, 0);
    done(&p);
    free(ok);

    char *deep = nested(MF_PARSE_MAX_NESTING);
    parse(&p, deep);
    assert_int_equal(p.diag.nerrors, 1);
    assert_non_null(strstr(p.out, "too many nested blocks (limit is 8)"));
    done(&p);
    free(deep);

    /* thousands of opening brackets or braces: errors, never a crash */
    size_t n = 100000;
    char *b = malloc(n + 1);
    assert_non_null(b);
    memset(b, '{', n);
    b[n] = '\0';
    parse(&p, b);
    assert_true(p.diag.nerrors >= 1);
    done(&p);
    memset(b, '[', n);
    parse(&p, b);
    assert_true(p.diag.nerrors >= 1);
    done(&p);
    free(b);
}

static void test_error_flood_is_capped(void **state)
{
    (void)state;
    size_t n = 50000;
    char *b = malloc(n + 1);
    assert_non_null(b);
    memset(b, '@', n);
    b[n] = '\0';
    parsed p;
    parse(&p, b);
    assert_int_equal(p.diag.nerrors, (int)n);
    assert_non_null(strstr(p.out, "more errors not shown (limit is 100)"));
    done(&p);
    free(b);
}

/* Long lists are left-recursive: no parser stack growth. */
static void test_long_lists(void **state)
{
    (void)state;
    size_t dims = 200000;
    size_t cap = 64 + dims * 3;
    char *b = malloc(cap);
    assert_non_null(b);
    int o = snprintf(b, cap, "mesh dp = 2;\nunit \"u\" { tensor \"w\" [");
    for (size_t i = 0; i < dims; i++)
        o += snprintf(b + o, cap - (size_t)o, i ? ",1" : "1");
    snprintf(b + o, cap - (size_t)o, "]; }\n");
    parsed p;
    parse(&p, b);
    assert_int_equal(p.diag.nerrors, 0);
    assert_int_equal(p.ast->units->body->tensor.ndims, (int)dims);
    done(&p);
    free(b);
}

static void test_integer_limits(void **state)
{
    (void)state;
    parsed p;
    parse(&p, "microbatches 9223372036854775807;\nalign -9223372036854775807;\nprefetch 9223372036854775808;\n");
    assert_int_equal(p.diag.nerrors, 1);
    assert_int_equal(p.ast->settings->num.value, INT64_MAX);
    assert_int_equal(p.ast->settings->next->num.value, -INT64_MAX);
    assert_non_null(strstr(p.out, "t.mfsdp:3:10: error: integer 9223372036854775808 does not fit in 63 bits"));
    done(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ast_shape_and_spans),
        cmocka_unit_test(test_buffer_without_nul),
        cmocka_unit_test(test_nul_and_high_bytes),
        cmocka_unit_test(test_every_prefix),
        cmocka_unit_test(test_recovery_reports_each_error),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_error_flood_is_capped),
        cmocka_unit_test(test_long_lists),
        cmocka_unit_test(test_integer_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

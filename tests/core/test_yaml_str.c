/*
 * core/mf_yaml_str: the quoting rule of the YAML writers (mf_yaml_str.h)
 * against styles written out by hand from that rule -- plain for
 * [A-Za-z_][A-Za-z0-9_./-]* that is not a YAML 1.1 reserved word (true,
 * false, null, yes, no, on, off, y, n, ~, .nan, .inf, any case), double-
 * quoted for the empty string, a reserved word and anything not starting
 * with a letter or '_', libyaml's choice for the rest -- and every string,
 * emitted by libyaml in the style chosen, parsed back by libyaml to the same
 * bytes (in the style asked for, where one was). Then the integer
 * formatter against decimal text written by hand, the int64_t extremes
 * included.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mf_yaml_str.h"

enum { PLAIN = YAML_PLAIN_SCALAR_STYLE, DQ = YAML_DOUBLE_QUOTED_SCALAR_STYLE, ANY = YAML_ANY_SCALAR_STYLE };

static const struct {
    const char *in;
    int style;
} cases[] = {
    /* plain words */
    {"weight", PLAIN},
    {"w", PLAIN},
    {"_private", PLAIN},
    {"layers.0/attn-q_proj", PLAIN},
    {"Z9", PLAIN},
    {"a-", PLAIN},
    {"truex", PLAIN}, /* reserved words only as a whole */
    {"nulls", PLAIN},
    {"yes_", PLAIN},
    {"offset", PLAIN},
    {"y2", PLAIN},
    {"no.", PLAIN},
    /* reserved words, any case */
    {"true", DQ},
    {"True", DQ},
    {"FALSE", DQ},
    {"null", DQ},
    {"Null", DQ},
    {"yes", DQ},
    {"YES", DQ},
    {"no", DQ},
    {"on", DQ},
    {"Off", DQ},
    {"y", DQ},
    {"Y", DQ},
    {"n", DQ},
    {"N", DQ},
    {"~", DQ},
    {".nan", DQ},
    {".NaN", DQ},
    {".inf", DQ},
    {".Inf", DQ},
    /* empty; not starting with a letter or '_' */
    {"", DQ},
    {" a", DQ},
    {" ", DQ},
    {":a", DQ},
    {"#a", DQ},
    {"-a", DQ},
    {"- a", DQ},
    {"'a'", DQ},
    {"\"a\"", DQ},
    {"0", DQ},
    {"123", DQ},
    {"1e3", DQ},
    {"0x1f", DQ},
    {"2026-12-03", DQ},
    {".a", DQ},
    {"/a", DQ},
    {"*a", DQ},
    {"&a", DQ},
    {"!a", DQ},
    {"@a", DQ},
    {"[a]", DQ},
    {"{a}", DQ},
    {"\ta", DQ},
    {"\x01", DQ},
    {"\xc3\xa9t\xc3\xa9", DQ}, /* "été": a non-ASCII first byte */
    /* a letter first, then something outside the plain set */
    {"a ", ANY},
    {"a b", ANY},
    {"a:b", ANY},
    {"a: b", ANY},
    {"a:", ANY},
    {"a#b", ANY},
    {"a #b", ANY},
    {"it's", ANY},
    {"say \"hi\"", ANY},
    {"a\tb", ANY},
    {"a\nb", ANY},
    {"a\x7f", ANY},
    {"a\x01", ANY},
    {"caf\xc3\xa9", ANY},
    {"a,b", ANY},
    {"a[0]", ANY},
    {"a+b", ANY},
};

/* libyaml writes v as the one scalar of a document, in style. */
static size_t emit(const char *v, yaml_scalar_style_t style, unsigned char *out, size_t cap)
{
    yaml_emitter_t em;
    yaml_event_t ev;
    size_t n = 0;
    assert_true(yaml_emitter_initialize(&em));
    yaml_emitter_set_output_string(&em, out, cap, &n);
    yaml_emitter_set_unicode(&em, 1);
    assert_true(yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&em, &ev));
    assert_true(yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(&em, &ev));
    assert_true(yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)(uintptr_t)v, (int)strlen(v), 1, 1,
                                             style));
    if (!yaml_emitter_emit(&em, &ev))
        fail_msg("libyaml cannot emit \"%s\" in style %d: %s", v, (int)style, em.problem);
    assert_true(yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev));
    assert_true(yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev));
    yaml_emitter_delete(&em);
    return n;
}

/* Parses the document's one scalar back: its bytes into val, its style. */
static yaml_scalar_style_t parse_back(const unsigned char *in, size_t n, char *val, size_t cap)
{
    yaml_parser_t pa;
    yaml_event_t ev;
    yaml_scalar_style_t style = YAML_ANY_SCALAR_STYLE;
    bool seen = false;
    assert_true(yaml_parser_initialize(&pa));
    yaml_parser_set_input_string(&pa, in, n);
    for (;;) {
        if (!yaml_parser_parse(&pa, &ev))
            fail_msg("libyaml cannot parse back <%.*s>: %s", (int)n, (const char *)in, pa.problem);
        yaml_event_type_t type = ev.type;
        if (type == YAML_SCALAR_EVENT) {
            assert_false(seen);
            seen = true;
            assert_true(ev.data.scalar.length < cap);
            memcpy(val, ev.data.scalar.value, ev.data.scalar.length);
            val[ev.data.scalar.length] = '\0';
            style = ev.data.scalar.style;
        }
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&pa);
    assert_true(seen);
    return style;
}

static void test_style_by_hand(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = (int)mf_yaml_str_style(cases[i].in);
        if (got != cases[i].style)
            fail_msg("style of \"%s\": %d, expected %d", cases[i].in, got, cases[i].style);
    }
}

static void test_round_trip_libyaml(void **state)
{
    (void)state;
    unsigned char doc[256];
    char back[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *v = cases[i].in;
        yaml_scalar_style_t style = mf_yaml_str_style(v);
        size_t n = emit(v, style, doc, sizeof doc);
        yaml_scalar_style_t read = parse_back(doc, n, back, sizeof back);
        if (strcmp(back, v) != 0)
            fail_msg("\"%s\" read back as \"%s\" from <%.*s>", v, back, (int)n, (const char *)doc);
        if (style != YAML_ANY_SCALAR_STYLE && read != style)
            fail_msg("\"%s\" written in style %d read back in style %d", v, (int)style, (int)read);
    }
}

static void test_int_by_hand(void **state)
{
    (void)state;
    static const struct {
        int64_t v;
        const char *text;
    } ints[] = {
        {0, "0"},
        {7, "7"},
        {-1, "-1"},
        {10, "10"},
        {-10, "-10"},
        {1048576, "1048576"},
        {-4096, "-4096"},
        {1000000000000, "1000000000000"},
        {INT64_MAX, "9223372036854775807"},
        {INT64_MIN, "-9223372036854775808"},
        {INT64_MIN + 1, "-9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        char buf[24];
        memset(buf, 'x', sizeof buf);
        const char *p = mf_yaml_str_int(ints[i].v, buf);
        assert_true(p >= buf && p < buf + 24);
        assert_string_equal(p, ints[i].text);
        assert_ptr_equal(p + strlen(ints[i].text), buf + 23); /* written at the end */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_style_by_hand),
        cmocka_unit_test(test_round_trip_libyaml),
        cmocka_unit_test(test_int_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

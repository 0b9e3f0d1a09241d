/*
 * `mfsdpc explain` rendering: the text listing carries every item the issue
 * asks for, and the YAML form carries the same numbers (read back with
 * libyaml's parser), canonically (byte-identical on a second run).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "mf_assign.h"
#include "mf_explain.h"
#include "mf_passes.h"
#include "plan_testlib.h"

static mf_plan *sample(mf_arena *a)
{
    const int64_t sizes[] = {2, 4};
    mf_spec *s = tl_spec_new(a, 2, sizes, 4, MF_REDUCE_AVG);
    int h = tl_layout(a, s, "hfsdp", "RF", MF_BF16, "PF", MF_FP32, "FF", MF_FP32);
    int n = tl_layout(a, s, "replicated_norms", "RR", MF_FP32, "PP", MF_FP32, "RR", MF_FP32);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "layers.%d", i);
        int u = tl_unit(a, s, name, h, i == 0);
        tl_tensor2(a, s, u, "wqkv", 192, 64, -1);
        tl_tensor(a, s, u, "norm", 64, n);
    }
    mf_plan *p = tl_plan(s, NULL, NULL);
    assert_non_null(p);
    return p;
}

static char *render(const mf_plan *p, bool yaml)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(yaml ? mf_explain_yaml(p, f) : mf_explain_text(p, f), 0);
    fclose(f);
    return text;
}

static void test_text_listing(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_plan *p = sample(a);
    char *t = render(p, false);
    const char *needles[] = {
        "; mfsdpc explain test.mfsdp",
        "mesh        a0=2 x a1=4  (world 8, outermost first)",
        "unit 0 layers.0  (reshard_after_forward true, 2 buckets)",
        "unit 1 layers.1  (reshard_after_forward false, 2 buckets)",
        "  bucket 0 layers.0/hfsdp  layout hfsdp",
        "  bucket 1 layers.0/replicated_norms  layout replicated_norms",
        "layers.0.wqkv [192, 64]",
        "padding",
        "main_weight  fp32  [Flat, Flat]",
        "T1 first main_weight [Flat, Flat] fp32 -> weight [Replicate, Flat] bf16  at forward_pre, 1/step",
        ("T2 every weight [Replicate, Flat] bf16 -> weight_full [Replicate, Replicate] bf16  at "
         "forward_pre+backward_pre, 8/step"),
        "at forward_pre, 4/step", /* layers.1 keeps its weights: T2 only at forward_pre */
        "T4 last  grad [Partial, Flat] fp32 -> grad_final [Flat, Flat] fp32  at backward_post, 1/step",
        "why: all_reduce(a1) + all_reduce(a0): ",
        "memory/rank weight       persistent",
        "totals per step",
        "all_gather      a0",
        "reduce_scatter  a1",
        "memory/rank  peak ",
        "model/rank   by role, not the peak",
    };
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++)
        if (!strstr(t, needles[i]))
            fail_msg("missing '%s' in:\n%s", needles[i], t);
    /* one step per line with its stream and bytes: the outer gather of T1 */
    char want[256];
    int64_t L = p->sched->buckets[0].length;
    snprintf(want, sizeof want, "1   all_gather      a0           outer  bf16  FF    RF    first  %14lld %14lld",
             (long long)(L / 8), (long long)(L / 8 * 2));
    if (!strstr(t, want))
        fail_msg("missing '%s' in:\n%s", want, t);
    free(t);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

static yaml_node_t *get(yaml_document_t *doc, yaml_node_t *map, const char *key)
{
    assert_non_null(map);
    assert_int_equal(map->type, YAML_MAPPING_NODE);
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(doc, pr->key);
        if (k->type == YAML_SCALAR_NODE && strcmp((char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(doc, pr->value);
    }
    fail_msg("no key '%s'", key);
    return NULL;
}

static yaml_node_t *item(yaml_document_t *doc, yaml_node_t *seq, int i)
{
    assert_non_null(seq);
    assert_int_equal(seq->type, YAML_SEQUENCE_NODE);
    assert_true(seq->data.sequence.items.start + i < seq->data.sequence.items.top);
    return yaml_document_get_node(doc, seq->data.sequence.items.start[i]);
}

static int64_t num(yaml_node_t *n)
{
    assert_int_equal(n->type, YAML_SCALAR_NODE);
    return strtoll((char *)n->data.scalar.value, NULL, 10);
}

static const char *str(yaml_node_t *n)
{
    assert_int_equal(n->type, YAML_SCALAR_NODE);
    return (char *)n->data.scalar.value;
}

static void test_yaml_same_data(void **state)
{
    (void)state;
    mf_arena *a = mf_arena_create();
    mf_plan *p = sample(a);
    /* lowered and assigned, as `mfsdpc explain` does: the peak is the arena's */
    mf_source src = {"test.mfsdp", "", 0};
    mf_diag d;
    mf_diag_init(&d, &src, stderr);
    assert_true(mf_lower_run(p, &d));
    mf_diag_finish(&d);
    assert_true(mf_assign_run(p->sched, NULL));
    assert_true(p->sched->summary.allocated_bytes > 0);
    char *y1 = render(p, true), *y2 = render(p, true);
    assert_string_equal(y1, y2);
    yaml_parser_t parser;
    yaml_document_t doc;
    assert_true(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (unsigned char *)y1, strlen(y1));
    assert_true(yaml_parser_load(&parser, &doc));
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    assert_string_equal(str(get(&doc, root, "format")), "mfsdp-explain/1");
    assert_string_equal(str(get(&doc, root, "source")), "test.mfsdp");
    assert_int_equal(num(get(&doc, root, "microbatches")), 4);
    yaml_node_t *b0 = item(&doc, get(&doc, item(&doc, get(&doc, root, "units"), 0), "buckets"), 0);
    assert_string_equal(str(get(&doc, b0, "name")), "layers.0/hfsdp");
    assert_int_equal(num(get(&doc, b0, "length")), p->sched->buckets[0].length);
    assert_int_equal(num(get(&doc, b0, "used")), p->sched->buckets[0].used);
    yaml_node_t *t1 = item(&doc, get(&doc, b0, "transitions"), 0);
    yaml_node_t *ag = item(&doc, get(&doc, t1, "steps"), 1);
    assert_string_equal(str(get(&doc, ag, "op")), "all_gather");
    assert_string_equal(str(get(&doc, ag, "axis")), "a0");
    assert_string_equal(str(get(&doc, ag, "stream")), "outer");
    assert_int_equal(num(get(&doc, ag, "count")), p->trans[0][MF_T1].steps[1].count);
    assert_int_equal(num(get(&doc, ag, "bytes")), p->trans[0][MF_T1].steps[1].bytes);
    yaml_node_t *b1 = item(&doc, get(&doc, item(&doc, get(&doc, root, "units"), 0), "buckets"), 1);
    yaml_node_t *t4 = item(&doc, get(&doc, b1, "transitions"), 3);
    assert_string_equal(str(get(&doc, t4, "why")), p->trans[1][MF_T4].why);
    /* totals: the same numbers as mf_plan_totals */
    mf_summary sum;
    assert_true(mf_plan_totals(p, &sum));
    yaml_node_t *colls = get(&doc, get(&doc, root, "totals"), "collectives_per_step");
    int64_t yaml_total = 0, want_total = 0;
    for (yaml_node_item_t *it = colls->data.sequence.items.start; it < colls->data.sequence.items.top; it++) {
        yaml_node_t *c = yaml_document_get_node(&doc, *it);
        int kind = mf_opkind_from_name(str(get(&doc, c, "op")));
        int axis = str(get(&doc, c, "axis"))[1] - '0';
        assert_true(kind >= 0);
        assert_int_equal(num(get(&doc, c, "launches")), sum.collectives[kind][axis]);
        yaml_total += num(get(&doc, c, "launches"));
    }
    for (int k = 0; k < MF_OPKIND_COUNT; k++)
        for (int j = 0; j < MF_MAX_AXES; j++)
            want_total += sum.collectives[k][j];
    assert_int_equal(yaml_total, want_total);
    yaml_node_t *bytes = get(&doc, get(&doc, root, "totals"), "bytes_per_rank_per_step");
    assert_int_equal(num(get(&doc, item(&doc, bytes, 1), "bytes")), sum.bytes[1]);
    mf_plan_memory mem;
    assert_true(mf_plan_memory_of(p, &mem));
    yaml_node_t *mpr = get(&doc, get(&doc, root, "totals"), "memory_per_rank");
    /* the one peak: what the runtime allocates, persistent region + arena */
    assert_int_equal(num(get(&doc, mpr, "peak")), p->sched->summary.allocated_bytes);
    assert_int_equal(num(get(&doc, mpr, "peak")), num(get(&doc, mpr, "persistent_region")) + num(get(&doc, mpr, "arena")));
    assert_int_equal(num(get(&doc, mpr, "live_bytes")), p->sched->summary.live_bytes);
    assert_true(num(get(&doc, mpr, "arena")) >= num(get(&doc, mpr, "live_bytes")));
    /* the interference bound: the summary's, between the live bound and the
     * arena, with its clique (tests/core/test_interfere.c checks members) */
    assert_int_equal(num(get(&doc, mpr, "interference_bytes")), p->sched->summary.interference_bytes);
    assert_true(num(get(&doc, mpr, "interference_bytes")) >= num(get(&doc, mpr, "live_bytes")));
    assert_true(num(get(&doc, mpr, "arena")) >= num(get(&doc, mpr, "interference_bytes")));
    assert_string_equal(str(get(&doc, mpr, "interference_exact")), "true");
    assert_int_equal(get(&doc, mpr, "interference_clique")->type, YAML_SEQUENCE_NODE);
    yaml_node_t *model = get(&doc, get(&doc, mpr, "model"), "total");
    assert_int_equal(num(get(&doc, model, "total")), mem.peak_total);
    assert_int_equal(num(get(&doc, model, "grad")), mem.peak[MF_ROLE_GRAD]);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(y1);
    free(y2);
    mf_plan_free(p);
    mf_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_listing),
        cmocka_unit_test(test_yaml_same_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

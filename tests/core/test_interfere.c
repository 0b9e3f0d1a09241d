/*
 * test_interfere: the interference lower bound (core/mf_interfere.c,
 * docs/semantics.md §10), checked by means that do not share its code:
 *   - the clique search on small hand-made graphs whose heaviest clique is
 *     worked out by hand below, and the budget's "at least" result;
 *   - on compiled examples, the clique `mfsdpc explain --format yaml` prints
 *     (the real binary) is a clique: for each pair of members, a layout of the
 *     compiled schedule (loaded from the file `mfsdpc compile` wrote) where
 *     only those two buffers share bytes is refused by the loader's arena
 *     check (core/mf_arena_check.c, the loader's own rule: a sweep over byte
 *     ranges, not the interference graph), naming both, while the same layout
 *     without the shared bytes passes; and its members' bytes, from each
 *     buffer's count and dtype, add up to the printed bound and to the
 *     summary's interference_bytes;
 *   - with no budget, the search keeps its start, whose bytes are the
 *     live-bytes bound of the separate sweep in core/mf_live.c; and the loader
 *     refuses a summary whose interference_bytes differs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <yaml.h>

#include "mf_arena_check.h"
#include "mf_interfere.h"
#include "sched_test.h"

#ifndef MFSDP_SOURCE_DIR
#error "MFSDP_SOURCE_DIR must be defined"
#endif
#ifndef MFSDPC
#error "MFSDPC must be defined"
#endif

/* CSR adjacency from an edge list (both directions). */
static void csr(int n, const int (*e)[2], int ne, int *as, int *adj)
{
    memset(as, 0, sizeof *as * (size_t)(n + 1));
    for (int i = 0; i < ne; i++) {
        as[e[i][0] + 1]++;
        as[e[i][1] + 1]++;
    }
    for (int v = 0; v < n; v++)
        as[v + 1] += as[v];
    int fill[16];
    memcpy(fill, as, sizeof *fill * (size_t)n);
    for (int i = 0; i < ne; i++) {
        adj[fill[e[i][0]]++] = e[i][1];
        adj[fill[e[i][1]]++] = e[i][0];
    }
}

/*
 * Seven vertices, weights w = 5 3 2 2 2 2 7:
 *   v0 - v1                     {0,1}     = 5 + 3         = 8
 *   v2 v3 v4 v5 all joined      {2,3,4,5} = 2 + 2 + 2 + 2 = 8 (the largest
 *                                                              by count)
 *   v1 - v2, v1 - v3            {1,2,3}   = 3 + 2 + 2     = 7
 *   v6 - v2, v6 - v3            {2,3,6}   = 2 + 2 + 7     = 11
 * No other triangle: v6's only neighbours are v2, v3 (and v2-v3 is an edge),
 * v1's are v0, v2, v3 (v0 meets neither v2 nor v3), and {2,3,6} cannot grow
 * (v6 meets neither v4 nor v5, v1 does not meet v6). The heaviest clique is
 * {2,3,6} = 11, neither the largest one nor the seed {0,1}.
 */
static void test_hand_graph(void **state)
{
    (void)state;
    static const int64_t w[7] = {5, 3, 2, 2, 2, 2, 7};
    static const int e[][2] = {{0, 1}, {2, 3}, {2, 4}, {2, 5}, {3, 4}, {3, 5}, {4, 5},
                               {1, 2}, {1, 3}, {6, 2}, {6, 3}};
    int as[8], adj[22];
    csr(7, e, 11, as, adj);
    const int seed[2] = {0, 1};
    mf_interfere x;
    assert_true(mf_interfere_clique(7, w, as, adj, seed, 2, MF_INTERFERE_WORK, &x));
    assert_true(x.exact);
    assert_int_equal(x.bytes, 11);
    assert_int_equal(x.nmembers, 3);
    assert_int_equal(x.members[0], 2);
    assert_int_equal(x.members[1], 3);
    assert_int_equal(x.members[2], 6);
    mf_interfere_free(&x);
    /* no seed: the same answer */
    assert_true(mf_interfere_clique(7, w, as, adj, NULL, 0, MF_INTERFERE_WORK, &x));
    assert_int_equal(x.bytes, 11);
    mf_interfere_free(&x);
    /* no budget: the seed stands, marked "at least" */
    assert_true(mf_interfere_clique(7, w, as, adj, seed, 2, 0, &x));
    assert_false(x.exact);
    assert_int_equal(x.bytes, 8);
    assert_int_equal(x.nmembers, 2);
    assert_int_equal(x.members[0], 0);
    assert_int_equal(x.members[1], 1);
    mf_interfere_free(&x);
}

/*
 * The 5-cycle v0 - v1 - v2 - v3 - v4 - v0 with w = 1 2 3 4 5: no triangle,
 * so the cliques are the edges: 3, 5, 7, 9 and (v4, v0) 6. Heaviest {3,4} = 9.
 * Also an empty graph (bound 0) and one without edges (the heaviest vertex).
 */
static void test_cycle_and_edges(void **state)
{
    (void)state;
    static const int64_t w[5] = {1, 2, 3, 4, 5};
    static const int e[][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 0}};
    int as[6], adj[10];
    csr(5, e, 5, as, adj);
    mf_interfere x;
    assert_true(mf_interfere_clique(5, w, as, adj, NULL, 0, MF_INTERFERE_WORK, &x));
    assert_true(x.exact);
    assert_int_equal(x.bytes, 9);
    assert_int_equal(x.nmembers, 2);
    assert_int_equal(x.members[0], 3);
    assert_int_equal(x.members[1], 4);
    mf_interfere_free(&x);
    csr(5, e, 0, as, adj);
    assert_true(mf_interfere_clique(5, w, as, adj, NULL, 0, MF_INTERFERE_WORK, &x));
    assert_int_equal(x.bytes, 5);
    assert_int_equal(x.nmembers, 1);
    assert_int_equal(x.members[0], 4);
    mf_interfere_free(&x);
    assert_true(mf_interfere_clique(0, w, as, adj, NULL, 0, MF_INTERFERE_WORK, &x));
    assert_int_equal(x.bytes, 0);
    assert_int_equal(x.nmembers, 0);
    mf_interfere_free(&x);
}

/* ---- the printed clique of compiled examples ---- */

static yaml_node_t *get(yaml_document_t *doc, yaml_node_t *map, const char *key)
{
    assert_non_null(map);
    assert_int_equal(map->type, YAML_MAPPING_NODE);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (k->type == YAML_SCALAR_NODE && strcmp((char *)k->data.scalar.value, key) == 0)
            return yaml_document_get_node(doc, p->value);
    }
    fail_msg("no key %s", key);
    return NULL;
}

static void run(const char *cmd)
{
    if (system(cmd) != 0)
        fail_msg("failed: %s", cmd);
}

/* Bytes of buffer b in the arena, from its count and dtype (the YAML's). */
static int64_t aligned_bytes(const mf_schedule *s, int b)
{
    mf_dtype d = s->buffers[b].dtype;
    int64_t size = d == MF_FP32 ? 4 : d == MF_BF16 || d == MF_FP16 ? 2 : 0; /* the IEEE / bfloat16 widths */
    assert_true(size > 0);
    int64_t raw = s->buffers[b].count * size;
    return (raw + s->align - 1) / s->align * s->align;
}

/* Every transient buffer at its own bytes, except a and b, which share the
 * bytes at the end when `share` (else each has its own there too). */
static void layout(mf_schedule *s, int a, int b, bool share)
{
    int64_t at = 0;
    for (int i = 0; i < s->nbuffers; i++)
        if (s->buffers[i].lifetime == MF_LIFETIME_MICROBATCH && i != a && i != b) {
            s->buffers[i].offset = at;
            at += aligned_bytes(s, i);
        }
    int64_t ba = aligned_bytes(s, a), bb = aligned_bytes(s, b);
    s->buffers[a].offset = at;
    s->buffers[b].offset = share ? at : at + ba;
    s->mem_transient = share ? at + (ba > bb ? ba : bb) : at + ba + bb;
}

static void check_example(const char *name)
{
    char dir[] = "/tmp/mf_interfere_XXXXXX", cmd[4096], path[1200];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "'%s' compile '%s/schedules/%s.mfsdp' -o '%s/s.yaml' && "
             "'%s' explain '%s/schedules/%s.mfsdp' --format yaml > '%s/e.yaml'",
             MFSDPC, MFSDP_SOURCE_DIR, name, dir, MFSDPC, MFSDP_SOURCE_DIR, name, dir);
    run(cmd);
    size_t len;
    snprintf(path, sizeof path, "%s/s.yaml", dir);
    char *text = st_read(path, &len), err[1024];
    assert_non_null(text);
    mf_schedule *s = mf_load_schedule_buffer(path, text, len, err, sizeof err);
    if (!s)
        fail_msg("%s: %s", name, err);
    snprintf(path, sizeof path, "%s/e.yaml", dir);
    char *ex = st_read(path, &len);
    assert_non_null(ex);
    yaml_parser_t parser;
    yaml_document_t doc;
    assert_true(yaml_parser_initialize(&parser));
    yaml_parser_set_input_string(&parser, (unsigned char *)ex, len);
    assert_true(yaml_parser_load(&parser, &doc));
    yaml_node_t *mem = get(&doc, get(&doc, yaml_document_get_root_node(&doc), "totals"), "memory_per_rank");
    yaml_node_t *bound = get(&doc, mem, "interference_bytes"), *clique = get(&doc, mem, "interference_clique");
    assert_int_equal(bound->type, YAML_SCALAR_NODE);
    int64_t printed = strtoll((char *)bound->data.scalar.value, NULL, 10);
    assert_string_equal((char *)get(&doc, mem, "interference_exact")->data.scalar.value, "true");
    assert_int_equal(clique->type, YAML_SEQUENCE_NODE);
    int n = (int)(clique->data.sequence.items.top - clique->data.sequence.items.start);
    assert_true(n >= 2);
    int *member = malloc(sizeof *member * (size_t)n);
    int64_t sum = 0;
    for (int k = 0; k < n; k++) {
        yaml_node_t *it = yaml_document_get_node(&doc, clique->data.sequence.items.start[k]);
        member[k] = st_buffer(s, (char *)it->data.scalar.value);
        if (member[k] < 0 || s->buffers[member[k]].lifetime != MF_LIFETIME_MICROBATCH)
            fail_msg("%s: clique member '%s' is not a transient buffer", name, it->data.scalar.value);
        for (int j = 0; j < k; j++)
            assert_int_not_equal(member[j], member[k]);
        sum += aligned_bytes(s, member[k]);
    }
    /* the bound is the members' bytes, the same in the summary, between the
     * live-bytes bound and the arena */
    assert_int_equal(sum, printed);
    assert_int_equal(s->summary.interference_bytes, printed);
    assert_true(s->summary.live_bytes <= printed);
    assert_true(printed <= s->mem_transient);
    /* each pair interferes: sharing bytes is refused, naming both */
    char msg[1024];
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            int x = member[a], y = member[b];
            layout(s, x, y, false);
            if (mf_arena_check(s, msg, sizeof msg) != -1)
                fail_msg("%s: the disjoint layout is refused: %s", name, msg);
            layout(s, x, y, true);
            if (mf_arena_check(s, msg, sizeof msg) == -1)
                fail_msg("%s: '%s' and '%s' share bytes and the arena check accepts it", name,
                         s->buffers[x].name, s->buffers[y].name);
            char qx[300], qy[300];
            snprintf(qx, sizeof qx, "'%s'", s->buffers[x].name);
            snprintf(qy, sizeof qy, "'%s'", s->buffers[y].name);
            if (!strstr(msg, qx) || !strstr(msg, qy) || !strstr(msg, "while both are live"))
                fail_msg("%s: refused for another reason: %s", name, msg);
        }
    free(member);
    /* with no budget the search keeps its start, the peak instant's buffers:
     * exactly the live-bytes bound (a separate sweep, mf_live_lower_bound) */
    mf_live lv;
    assert_true(mf_live_build(s, &lv));
    mf_interfere z;
    assert_true(mf_interfere_bound(s, &lv, 0, &z));
    assert_false(z.exact);
    assert_int_equal(z.bytes, s->summary.live_bytes);
    mf_interfere_free(&z);
    mf_live_free(&lv);
    /* the loader recomputes the summary's bound and refuses another */
    char find[96], *at;
    snprintf(find, sizeof find, "\n  interference_bytes: %lld\n", (long long)printed);
    assert_non_null(at = strstr(text, find));
    char *edited = malloc(strlen(text) + 2);
    memcpy(edited, text, (size_t)(at - text));
    snprintf(edited + (at - text), strlen(text) + 2 - (size_t)(at - text), "\n  interference_bytes: %lld\n%s",
             (long long)printed - 256, at + strlen(find));
    mf_schedule *bad = mf_load_schedule_buffer("t.yaml", edited, strlen(edited), err, sizeof err);
    assert_null(bad);
    if (!strstr(err, "summary interference_bytes is"))
        fail_msg("%s: unexpected: %s", name, err);
    free(edited);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(ex);
    free(text);
    mf_schedule_free(s);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run(cmd);
}

static void test_printed_cliques(void **state)
{
    (void)state;
    /* the three whose arena the live-bytes bound cannot explain
     * (docs/performance.md), and one where the two bounds agree */
    check_example("fsdp2d");
    check_example("hsdp_nosync");
    check_example("llama3_8b_hfsdp");
    check_example("zero3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_graph),
        cmocka_unit_test(test_cycle_and_edges),
        cmocka_unit_test(test_printed_cliques),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

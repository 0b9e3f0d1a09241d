/*
 * The schema table (core/mf_schema.h) drives the loader: every key of every
 * section, given a value of the wrong kind in a real schedule, is refused at
 * that value with the message of its type; every required key, removed, is
 * refused as missing; one key of each type with its exact message. And the
 * table's own facts: which keys each format version has, the format names,
 * the roles' keys in mf_role order.
 *
 * The test finds each section's mappings in the parsed file by its own
 * paths (root, mesh, mesh.axes[i], units[i], ...), not by the table's.
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

#include "mf_schema.h"
#include "sched_test.h"

static char *base; /* the canonical YAML of a 2x2 hfsdp schedule of three units */
static size_t base_len;
static yaml_document_t doc; /* base, parsed */

static bool parse_base(void)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return false;
    yaml_parser_set_input_string(&p, (const unsigned char *)base, base_len);
    bool ok = yaml_parser_load(&p, &doc);
    yaml_parser_delete(&p);
    return ok;
}

static int setup(void **state)
{
    (void)state;
    char *spec = st_mode_spec("dp_outer = 2, dp_inner = 2", "RF", "PF", "FF", 3, 2, "", false), *diag = NULL;
    mf_schedule *s = spec ? st_compile("schema.mfsdp", spec, true, &diag) : NULL;
    fprintf(stderr, "%s", s || !diag ? "" : diag);
    free(diag);
    free(spec);
    base = s ? st_emit(s, &base_len) : NULL;
    mf_schedule_free(s);
    return base && parse_base() ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    yaml_document_delete(&doc);
    free(base);
    return 0;
}

static yaml_node_t *node(int id) { return yaml_document_get_node(&doc, id); }

/* The pair of map whose key is `key`, or NULL. */
static yaml_node_pair_t *pair_of(yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
        if (strcmp((const char *)node(p->key)->data.scalar.value, key) == 0)
            return p;
    return NULL;
}

static yaml_node_t *value_of(yaml_node_t *map, const char *key)
{
    yaml_node_pair_t *p = pair_of(map, key);
    return p ? node(p->value) : NULL;
}

/* Appends the items of sequence seq (a mapping each) to out. */
static int items(yaml_node_t *seq, yaml_node_t **out, int n, int max)
{
    assert_non_null(seq);
    for (yaml_node_item_t *i = seq->data.sequence.items.start; i < seq->data.sequence.items.top && n < max; i++)
        out[n++] = node(*i);
    return n;
}

/* The mappings of section sec in the base, in file order. */
static int section_maps(mf_section sec, yaml_node_t **out, int max)
{
    yaml_node_t *root = yaml_document_get_root_node(&doc), *buckets[64];
    int nb = items(value_of(root, "buckets"), buckets, 0, 64), n = 0;
    switch (sec) {
    case MF_SECTION_ROOT: out[0] = root; return 1;
    case MF_SECTION_MESH: out[0] = value_of(root, "mesh"); return 1;
    case MF_SECTION_AXIS: return items(value_of(value_of(root, "mesh"), "axes"), out, 0, max);
    case MF_SECTION_UNIT: return items(value_of(root, "units"), out, 0, max);
    case MF_SECTION_BUCKET: return items(value_of(root, "buckets"), out, 0, max);
    case MF_SECTION_ROLE:
        for (int b = 0; b < nb && n + 3 <= max; b++) {
            out[n++] = value_of(buckets[b], "weight");
            out[n++] = value_of(buckets[b], "grad");
            out[n++] = value_of(buckets[b], "main_weight");
        }
        return n;
    case MF_SECTION_TENSOR:
        for (int b = 0; b < nb; b++)
            n = items(value_of(buckets[b], "tensors"), out, n, max);
        return n;
    case MF_SECTION_BUFFER: return items(value_of(root, "buffers"), out, 0, max);
    case MF_SECTION_ARENA: out[0] = value_of(root, "arena"); return 1;
    case MF_SECTION_OP: return items(value_of(root, "ops"), out, 0, max);
    case MF_SECTION_SUMMARY: out[0] = value_of(root, "summary"); return 1;
    default: fail_msg("section %d has no path in this test", (int)sec);
    }
    return 0;
}

/* The first mapping of section sec that has key `key`; *parent that mapping. */
static yaml_node_pair_t *find_key(mf_section sec, const char *key, yaml_node_t **parent)
{
    static yaml_node_t *maps[4096];
    int n = section_maps(sec, maps, 4096);
    for (int i = 0; i < n; i++) {
        yaml_node_pair_t *p = pair_of(maps[i], key);
        if (p) {
            *parent = maps[i];
            return p;
        }
    }
    fail_msg("no mapping of section %d has key '%s'", (int)sec, key);
    return NULL;
}

/* ---- mutations ---- */

/* Where the text of a block value ends: after the last line break between
 * `from` and the value's end mark, which is where the next key's line (and
 * its indentation) starts; the end mark for a value on the key's line. */
static size_t value_end(size_t from, const yaml_node_t *v)
{
    size_t end = v->end_mark.index;
    for (size_t i = end; i > from; i--)
        if (base[i - 1] == '\n')
            return i;
    return end;
}

/* base with bytes [from, to) replaced by repl; owned. */
static char *splice(size_t from, size_t to, const char *repl)
{
    size_t rl = strlen(repl);
    char *out = malloc(base_len - (to - from) + rl + 1);
    assert_non_null(out);
    memcpy(out, base, from);
    memcpy(out + from, repl, rl);
    memcpy(out + from + rl, base + to, base_len - to + 1);
    return out;
}

/* Loads text, which must be refused; returns the message (static). */
static const char *refusal(const char *text)
{
    static char err[1024];
    mf_schedule *s = mf_load_schedule_buffer("t.yaml", text, strlen(text), err, sizeof err);
    if (s) {
        mf_schedule_free(s);
        fail_msg("the mutated schedule loaded");
    }
    return err;
}

/* Gives key `key` of section sec the value `value` instead of its own (in the
 * first mapping of the section that has the key); expects the message `msg`
 * at the new value, or when msg is NULL, any message starting with `prefix`
 * there. */
static void mistype(mf_section sec, const char *key, const char *value, const char *prefix, const char *msg)
{
    yaml_node_t *parent;
    yaml_node_pair_t *p = find_key(sec, key, &parent);
    yaml_node_t *k = node(p->key), *v = node(p->value);
    char repl[64], want[512];
    /* ": value" from the end of the key; a block value's lines go, their
     * last break stays */
    size_t to = value_end(k->end_mark.index, v);
    snprintf(repl, sizeof repl, ": %s%s", value, to != v->end_mark.index || base[to - 1] == '\n' ? "\n" : "");
    char *text = splice(k->end_mark.index, to, repl);
    const char *err = refusal(text);
    snprintf(want, sizeof want, "t.yaml:%zu:%zu: error: %s", k->start_mark.line + 1, k->end_mark.column + 3,
             msg ? msg : prefix);
    if (msg)
        assert_string_equal(err, want);
    else if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("section %d key '%s' = %s: got '%s', expected it to start with '%s'", (int)sec, key, value, err,
                 want);
    free(text);
}

/* ---- tests ---- */

/* One key of each type, with its exact message. */
static void test_each_type(void **state)
{
    (void)state;
    mistype(MF_SECTION_ROOT, "source", "[1]", NULL, "expected a string for source, got a sequence");
    mistype(MF_SECTION_TENSOR, "name", "[1]", NULL, "expected a string for the tensor name, got a sequence");
    mistype(MF_SECTION_AXIS, "size", "[1]", NULL, "expected an integer for the axis size, got a sequence");
    mistype(MF_SECTION_UNIT, "reshard_after_forward", "[1]", NULL, "expected true or false for reshard_after_forward");
    mistype(MF_SECTION_BUFFER, "kind", "[1]", NULL, "expected a string for buffer kind, got a sequence");
    mistype(MF_SECTION_OP, "src", "[1]", NULL, "expected a string for buffer, got a sequence");
    mistype(MF_SECTION_UNIT, "buckets", "7", NULL, "expected a sequence for the unit's buckets, got a scalar");
    mistype(MF_SECTION_BUFFER, "placement", "7", NULL, "expected a sequence for the buffer placement, got a scalar");
    mistype(MF_SECTION_ARENA, "persistent", "{a: 1}", NULL, "expected an integer for arena persistent, got a mapping");
    mistype(MF_SECTION_ROOT, "arena", "[1]", NULL, "expected a mapping for arena, got a sequence");
    mistype(MF_SECTION_SUMMARY, "bytes_per_rank", "[1]", NULL, "expected a mapping for bytes_per_rank, got a sequence");
    mistype(MF_SECTION_SUMMARY, "model_bytes", "7", NULL, "expected a mapping for model_bytes, got a scalar");
    mistype(MF_SECTION_SUMMARY, "collectives", "[1]", NULL,
            "expected a mapping for summary collectives, got a sequence");
}

/* The start of the message for a value of the wrong kind, by type. */
static const char *type_error(mf_schema_type type)
{
    switch (type) {
    case MF_SCHEMA_INT: return "expected an integer for ";
    case MF_SCHEMA_BOOL: return "expected true or false for ";
    case MF_SCHEMA_LIST:
    case MF_SCHEMA_PLACEMENT: return "expected a sequence for ";
    case MF_SCHEMA_MAP:
    case MF_SCHEMA_PER_AXIS:
    case MF_SCHEMA_PER_ROLE:
    case MF_SCHEMA_PER_COLLECTIVE: return "expected a mapping for ";
    default: return "expected a string for "; /* string, name, enum, ref */
    }
}

/* Calls fn on every key of the table; returns the count. */
static int each_key(void (*fn)(mf_section, const mf_schema_key *))
{
    int n = 0;
    for (int s = 0; s < MF_SECTION_COUNT; s++)
        for (int k = 0; k < mf_schema_sections[s].nkeys; k++, n++)
            fn((mf_section)s, &mf_schema_sections[s].keys[k]);
    return n;
}

/* A value of the wrong kind for the key's type: a scalar for a list, a
 * sequence for the others. */
static void mistype_key(mf_section sec, const mf_schema_key *key)
{
    if (key->presence == MF_SCHEMA_WHOLE_BUCKET)
        return; /* the base has no whole bucket: tests/planner/test_whole_layout.c mistypes `bounds` */
    bool list = key->type == MF_SCHEMA_LIST || key->type == MF_SCHEMA_PLACEMENT;
    mistype(sec, key->name, list ? "7" : "[1]", type_error(key->type), NULL);
}

static void test_every_key_mistyped(void **state)
{
    (void)state;
    assert_int_equal(each_key(mistype_key), 69); /* the keys of docs/schedule.md §2.5 */
}

static int removed; /* required keys removed so far */

/* A required key, removed from the first mapping of its section. */
static void remove_key(mf_section sec, const mf_schema_key *key)
{
    if (key->presence != MF_SCHEMA_REQUIRED)
        return;
    yaml_node_t *parent;
    yaml_node_pair_t *p = find_key(sec, key->name, &parent);
    bool first = p == parent->data.mapping.pairs.start, last = p + 1 == parent->data.mapping.pairs.top;
    size_t from, to;
    if (parent->data.mapping.style == YAML_FLOW_MAPPING_STYLE) {
        /* "{k: v, ...": up to the next key; "..., k: v": from the previous value */
        from = first ? node(p->key)->start_mark.index : node((p - 1)->value)->end_mark.index;
        to = first && !last ? node((p + 1)->key)->start_mark.index : node(p->value)->end_mark.index;
    } else {
        /* whole lines, from the key's to the value's last; the first key of
         * a list item, up to the next key (the "- " stays) */
        from = node(p->key)->start_mark.index - (first ? 0 : node(p->key)->start_mark.column);
        to = value_end(from, node(p->value));
        if (to == node(p->value)->end_mark.index && base[to - 1] != '\n')
            while (base[to] && base[to++] != '\n')
                ;
        if (first && !last)
            to = node((p + 1)->key)->start_mark.index;
    }
    char *text = splice(from, to, "");
    char want[128];
    snprintf(want, sizeof want, "error: missing key '%s'", key->name);
    const char *err = refusal(text);
    if (!strstr(err, want))
        fail_msg("without '%s' (section %d): got '%s'", key->name, (int)sec, err);
    free(text);
    removed++;
}

static void test_every_required_key_missing(void **state)
{
    (void)state;
    removed = 0;
    each_key(remove_key);
    assert_int_equal(removed, 59); /* 69 keys, 9 of them the op's by phase or kind, 1 a whole bucket's */
}

/* Format 4 added no key: /3 and /4 files have the same keys (format 7's
 * `bounds` aside). */
static void in_format_3_and_4(mf_section sec, const mf_schema_key *key)
{
    const mf_schema_section *s = &mf_schema_sections[sec];
    if (key->since > 4)
        return;
    assert_int_equal(mf_schema_find(s, key->name, 3), key - s->keys);
    assert_int_equal(mf_schema_find(s, key->name, 4), key - s->keys);
    assert_int_equal(key->len, strlen(key->name));
}

/* Which keys each format version has (docs/schedule.md §2). */
static void test_versions(void **state)
{
    (void)state;
    const mf_schema_section *root = &mf_schema_sections[MF_SECTION_ROOT];
    const mf_schema_section *buffer = &mf_schema_sections[MF_SECTION_BUFFER];
    const mf_schema_section *summary = &mf_schema_sections[MF_SECTION_SUMMARY];
    const mf_schema_section *arena = &mf_schema_sections[MF_SECTION_ARENA];
    assert_int_equal(mf_schema_find(root, "arena", 1), -1);
    assert_int_equal(mf_schema_find(root, "arena", 2), MF_K_ROOT_ARENA);
    assert_int_equal(mf_schema_find(arena, "transient", 1), -1);
    assert_int_equal(mf_schema_find(arena, "transient", 3), MF_K_ARENA_TRANSIENT);
    assert_int_equal(mf_schema_find(buffer, "offset", 1), -1);
    assert_int_equal(mf_schema_find(buffer, "offset", 2), MF_K_BUFFER_OFFSET);
    assert_int_equal(mf_schema_find(summary, "live_bytes", 1), -1);
    assert_int_equal(mf_schema_find(summary, "live_bytes", 2), MF_K_SUMMARY_LIVE);
    assert_int_equal(mf_schema_find(summary, "interference_bytes", 2), -1);
    assert_int_equal(mf_schema_find(summary, "interference_bytes", 3), MF_K_SUMMARY_INTERFERENCE);
    assert_int_equal(mf_schema_find(summary, "model_bytes", 2), -1);
    assert_int_equal(mf_schema_find(summary, "model_bytes", 4), MF_K_SUMMARY_MODEL);
    assert_int_equal(mf_schema_find(summary, "peak_bytes", 2), -1); /* the /2 name is not in the table */
    assert_int_equal(mf_schema_find(root, "format", 1), MF_K_ROOT_FORMAT);
    assert_int_equal(mf_schema_find(root, "summary", 4), MF_K_ROOT_SUMMARY);
    assert_int_equal(mf_schema_find(root, "nope", 4), -1);
    assert_int_equal(mf_schema_find(root, "Format", 4), -1);
    const mf_schema_section *bucket = &mf_schema_sections[MF_SECTION_BUCKET];
    assert_int_equal(mf_schema_find(bucket, "bounds", 6), -1);
    assert_int_equal(mf_schema_find(bucket, "bounds", 7), MF_K_BUCKET_BOUNDS);
    each_key(in_format_3_and_4);

    assert_int_equal(mf_schema_format_version("mfsdp-schedule/4"), 4);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/3"), 3);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/12"), 12);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/"), -1);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/04"), -1);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/4x"), -1);
    assert_int_equal(mf_schema_format_version("mfsdp-schedule/99999999999"), -1);
    assert_int_equal(mf_schema_format_version("mfsdp-plan/4"), -1);
    assert_int_equal(mf_schema_format_version(NULL), -1);
}

/* The loader and both writers take a bucket's role keys as weight + r. */
static void test_role_keys(void **state)
{
    (void)state;
    static const char *const roles[] = {"weight", "grad", "main_weight"};
    assert_int_equal(MF_ROLE_COUNT, 3);
    for (int r = 0; r < MF_ROLE_COUNT; r++) {
        assert_string_equal(MF_KEY(BUCKET, WEIGHT)[r].name, roles[r]);
        assert_string_equal(mf_role_name((mf_role)r), roles[r]);
    }
    assert_string_equal(mf_schema_type_name(MF_SCHEMA_PER_AXIS), "per axis");
    assert_null(mf_schema_type_name(MF_SCHEMA_TYPE_COUNT));
    assert_string_equal(mf_schema_presence_name(MF_SCHEMA_EVENT_OP), "event ops");
    assert_null(mf_schema_presence_name(MF_SCHEMA_PRESENCE_COUNT));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_type),
        cmocka_unit_test(test_every_key_mistyped),
        cmocka_unit_test(test_every_required_key_missing),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_role_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

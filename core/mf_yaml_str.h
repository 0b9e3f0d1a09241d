/*
 * mf_yaml_str: the one quoting rule for strings the project writes as YAML
 * (schedules by planner/passes/mf_emit.c, `mfsdpc explain --format yaml` by
 * planner/reports/mf_explain.c). A string must read back as that same string in every
 * YAML reader (libyaml, PyYAML's YAML 1.1 resolver included):
 *
 *   plain          identifier-like, [A-Za-z_][A-Za-z0-9_./-]*, and not a
 *                  reserved word (true, false, null, yes, no, on, off, y, n,
 *                  ~, .nan, .inf, in any case);
 *   double-quoted  the empty string, a reserved word, and anything that does
 *                  not start with a letter or '_' (it could read as a number,
 *                  a date or an indicator);
 *   any            the rest: text that starts with a letter; libyaml writes it
 *                  plain when YAML allows, else single-quoted.
 */
#ifndef MF_YAML_STR_H
#define MF_YAML_STR_H

#include <stdint.h>
#include <yaml.h>

/* The scalar style for string v (NUL-terminated). */
yaml_scalar_style_t mf_yaml_str_style(const char *v);

/* The decimal text of v, NUL-terminated, written at the end of buf (24
 * bytes hold any int64_t); returns where it starts. Hand-rolled: snprintf
 * was a tenth of the time of writing a 400k-op schedule. */
const char *mf_yaml_str_int(int64_t v, char buf[24]);

#endif

/*
 * mf_schema: the table of mf_schema.h, and its look-ups.
 */
#include "mf_schema.h"

#include <string.h>

#define MF_SCHEMA_ROW(SECTION, KEY, name, TYPE, PRESENCE, since, what) \
    {name, sizeof name - 1, MF_SCHEMA_##TYPE, MF_SCHEMA_##PRESENCE, since, what},
#define MF_SCHEMA_KEYS(SECTION, path, what, KEYS) \
    static const mf_schema_key mf_schema_##SECTION[] = {KEYS(MF_SCHEMA_ROW)};
MF_SCHEMA_SECTION_LIST(MF_SCHEMA_KEYS)
#undef MF_SCHEMA_KEYS
#undef MF_SCHEMA_ROW

#define MF_SCHEMA_SECTION(SECTION, path, what, KEYS) {path, what, mf_schema_##SECTION, MF_K_##SECTION##_NKEYS},
const mf_schema_section mf_schema_sections[MF_SECTION_COUNT] = {MF_SCHEMA_SECTION_LIST(MF_SCHEMA_SECTION)};
#undef MF_SCHEMA_SECTION

int mf_schema_find(const mf_schema_section *s, const char *name, int version)
{
    for (int i = 0; i < s->nkeys; i++)
        if (strcmp(s->keys[i].name, name) == 0)
            return s->keys[i].since <= version ? i : -1;
    return -1;
}

int mf_schema_format_version(const char *format)
{
    static const char prefix[] = "mfsdp-schedule/";
    if (!format || strncmp(format, prefix, sizeof prefix - 1) != 0)
        return -1;
    const char *p = format + sizeof prefix - 1;
    int v = 0;
    if (*p < '1' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > 99999)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return *p ? -1 : v;
}

const char *mf_schema_type_name(mf_schema_type t)
{
#define MF_SCHEMA_NAME(E, name) name,
    static const char *const names[] = {MF_SCHEMA_TYPE_LIST(MF_SCHEMA_NAME)};
#undef MF_SCHEMA_NAME
    return (int)t >= 0 && t < MF_SCHEMA_TYPE_COUNT ? names[t] : NULL;
}

const char *mf_schema_presence_name(mf_schema_presence p)
{
#define MF_SCHEMA_NAME(E, name) name,
    static const char *const names[] = {MF_SCHEMA_PRESENCE_LIST(MF_SCHEMA_NAME)};
#undef MF_SCHEMA_NAME
    return (int)p >= 0 && p < MF_SCHEMA_PRESENCE_COUNT ? names[p] : NULL;
}

/*
 * mf_yaml_str: the quoting rule of mf_yaml_str.h.
 */
#include "mf_yaml_str.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

static bool mf_yaml_reserved(const char *v)
{
    static const char *const words[] = {"true", "false", "null", "yes", "no", "on",
                                        "off", "y", "n", "~", ".nan", ".inf"};
    if (strlen(v) > 5)
        return false;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcasecmp(v, words[i]) == 0)
            return true;
    return false;
}

yaml_scalar_style_t mf_yaml_str_style(const char *v)
{
    if (!v[0] || mf_yaml_reserved(v) || !(isalpha((unsigned char)v[0]) || v[0] == '_'))
        return YAML_DOUBLE_QUOTED_SCALAR_STYLE;
    for (const char *p = v; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '.' || *p == '-' || *p == '/'))
            return YAML_ANY_SCALAR_STYLE;
    return YAML_PLAIN_SCALAR_STYLE;
}

const char *mf_yaml_str_int(int64_t v, char buf[24])
{
    char *p = buf + 24;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    *--p = '\0';
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return p;
}

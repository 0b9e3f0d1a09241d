/*
 * gm_demangle: a kernel's device name (as __cudaRegisterFunction gives it,
 * Itanium-mangled) to the key of gm_kernels_find -- demangled with the C++
 * runtime's __cxa_demangle (libstdc++), the return type, namespaces and
 * parameter list dropped, template arguments kept:
 * "_ZN2ns14combine_kernelILi0ELi1EEEvPfid" -> "combine_kernel<0, 1>".
 */
#include <stdlib.h>
#include <string.h>

#include "gm_internal.h"

/* libstdc++'s abi::__cxa_demangle, C linkage. */
char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

int gm_demangle_key(const char *mangled, char *out, size_t cap)
{
    int status = 0;
    char *d = __cxa_demangle(mangled, NULL, NULL, &status);
    const char *s = (status == 0 && d) ? d : mangled; /* extern "C" kernels are not mangled */
    if (strncmp(s, "void ", 5) == 0)
        s += 5;
    /* The parameter list: the last '(' outside <> and (). The namespaces:
     * everything up to the last "::" outside them before that. */
    size_t n = strlen(s), cut = n, name = 0;
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '(' && depth == 0)
            cut = i;
        if (c == '<' || c == '(')
            depth++;
        else if ((c == '>' || c == ')') && depth > 0)
            depth--;
    }
    if (cut == 0)
        cut = n;
    depth = 0;
    for (size_t i = 0; i + 1 < cut; i++) {
        char c = s[i];
        if (c == '<' || c == '(')
            depth++;
        else if ((c == '>' || c == ')') && depth > 0)
            depth--;
        else if (c == ':' && s[i + 1] == ':' && depth == 0)
            name = i + 2;
    }
    int rc = -1;
    if (cut > name && cut - name + 1 <= cap) {
        memcpy(out, s + name, cut - name);
        out[cut - name] = '\0';
        rc = 0;
    }
    free(d);
    return rc;
}

/*
 * gm_demangle: a kernel's device name (as __cudaRegisterFunction gives it,
 * Itanium-mangled) to the key of gm_kernels_find -- demangled, the return
 * type, namespaces and parameter list dropped, template arguments kept:
 * "_ZN2ns14combine_kernelILi0ELi1EEEvPfid" -> "combine_kernel<0, 1>".
 */
#include <cxxabi.h>
#include <stdlib.h>
#include <string.h>

#include <string>

extern "C" int gm_demangle_key(const char *mangled, char *out, size_t cap);

extern "C" int gm_demangle_key(const char *mangled, char *out, size_t cap)
{
    int status = 0;
    char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = (status == 0 && d) ? d : mangled; /* extern "C" kernels are not mangled */
    free(d);
    if (s.compare(0, 5, "void ") == 0)
        s.erase(0, 5);
    /* The parameter list: the last '(' outside <> and (). */
    int depth = 0;
    size_t cut = std::string::npos;
    for (size_t i = 0; i < s.size(); i++) {
        char c = s[i];
        if (c == '(' && depth == 0)
            cut = i;
        if (c == '<' || c == '(')
            depth++;
        else if ((c == '>' || c == ')') && depth > 0)
            depth--;
    }
    if (cut != std::string::npos && cut > 0)
        s.erase(cut);
    /* The namespaces: everything up to the last "::" outside <> and (). */
    depth = 0;
    size_t name = 0;
    for (size_t i = 0; i + 1 < s.size(); i++) {
        char c = s[i];
        if (c == '<' || c == '(')
            depth++;
        else if ((c == '>' || c == ')') && depth > 0)
            depth--;
        else if (c == ':' && s[i + 1] == ':' && depth == 0)
            name = i + 2;
    }
    s.erase(0, name);
    if (s.empty() || s.size() + 1 > cap)
        return -1;
    memcpy(out, s.c_str(), s.size() + 1);
    return 0;
}

/* Temporary until the flex/bison front end lands (front-end work deletes this file). */
#include "mf_ast.h"
mf_ast *mf_parse(const mf_source *src, mf_diag *d, mf_arena *a)
{
    (void)a;
    mf_span none = {0, 0, 0, 0};
    mf_diag_error(d, none, "the parser is not built yet (%s)", src->path);
    return NULL;
}

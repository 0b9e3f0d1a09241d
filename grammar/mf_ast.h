/*
 * mf_ast: the syntax tree of a .mfsdp file, exactly as written (loops not
 * expanded, names not resolved). Every node carries its source span.
 * OWNED BY THE FRONT-END WORK: the shape below is a starting point; the parser
 * and the semantic pass may extend it.
 */
#ifndef MF_AST_H
#define MF_AST_H

#include "mf_arena.h"
#include "mf_diag.h"

typedef struct mf_ast mf_ast;

/* Parses src into an AST allocated in `a`. Syntax errors go to d; returns the
 * (possibly partial) AST, or NULL when nothing usable was parsed. Reentrant. */
mf_ast *mf_parse(const mf_source *src, mf_diag *d, mf_arena *a);

#endif

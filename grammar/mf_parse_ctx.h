/*
 * mf_parse_ctx: the state shared by the scanner (mf_lexer.l) and the parser
 * (mf_parser.y) for one call of mf_parse(). Private to grammar/.
 *
 * Everything a parse needs lives here, reached through the scanner's extra
 * pointer and the parser's parse-param: there is no global state, so parses
 * may run concurrently and in a fuzzer.
 */
#ifndef MF_PARSE_CTX_H
#define MF_PARSE_CTX_H

#include <setjmp.h>
#include <stdbool.h>

#include "mf_ast.h"

/* What a `{` opened; decides which keywords a statement may start with. */
typedef enum {
    MF_BLOCK_TOP,           /* the file itself */
    MF_BLOCK_BODY,          /* unit or for body: tensor, for, options */
    MF_BLOCK_ROLES,         /* layout or inline tensor layout: roles */
} mf_block_kind;

enum { MF_LEX_TEXT_MAX = 48 };  /* bytes of a token kept for messages */

typedef struct mf_parse_ctx {
    mf_arena *arena;        /* borrowed: the AST's arena */
    mf_diag *diag;          /* borrowed */
    const mf_source *src;   /* borrowed */
    mf_ast *ast;            /* built here; lists are prepended, then reversed */

    /* scanner position: where the next token starts (1-based) */
    int line, col;

    /* the last token handed to the parser (the lookahead when an error is
     * detected) and the one before it, for messages */
    int last_tok;           /* token kind, 0 at end of file */
    char last_text[MF_LEX_TEXT_MAX + 8]; /* printable, truncated */
    mf_span last_span;
    mf_span prev_span;
    bool last_at_stmt_start;  /* the last token began a statement */
    mf_block_kind last_block; /* the block it was in */

    /* statement and block tracking */
    bool at_stmt_start;     /* the next token begins a statement */
    int stmt_kw;            /* first token of the current statement */
    int depth;              /* open { } blocks */
    mf_block_kind blocks[MF_PARSE_MAX_NESTING + 1];
    mf_span brace_at[MF_PARSE_MAX_NESTING + 1]; /* where each open block began */
    bool lex_error_in_stmt; /* a lexical error since the last ';', '{' or '}':
                               the syntax error that follows is its echo */

    bool fatal;             /* a limit was hit: the scanner returns end of
                               file and the parser stays silent */
    bool oom;               /* out of memory somewhere: give up */
    jmp_buf oom_jump;       /* the scanner's allocator failed (flex cannot
                               return an error): back to mf_parse() */
} mf_parse_ctx;

/* Reports an out-of-memory error once and marks the parse as failed. */
void mf_parse_oom(mf_parse_ctx *ctx);

#endif

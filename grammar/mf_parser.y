/*
 * mf_parser: the grammar of the .mfsdp language (docs/language.md §7) and mf_parse().
 *
 *   file      := { statement }
 *   statement := "mesh" IDENT "=" INT { "," IDENT "=" INT } ";"
 *              | "microbatches" INT ";" | "reduce" IDENT ";" | "align" SIZE ";"
 *              | "prefetch" INT ";" | "bucket_size" SIZE ";" | "balance" IDENT ";"
 *              | "layout" IDENT "{" { role } "}"
 *              | "unit" STRING [ loop ] [ "layout" IDENT ] "{" { item } "}"
 *   role      := ("weight" | "grad" | "main_weight") IDENT "[" [ place { "," place } ] "]" ";"
 *   place     := IDENT | IDENT ":" IDENT
 *   loop      := "for" IDENT "in" INT ".." INT
 *   item      := "tensor" STRING "[" [ INT { "," INT } ] "]"
 *                ( [ global ] ";" | "layout" IDENT [ global ] ";" | "{" { role } "}" [ global ";" ] )
 *              | loop "{" { item } "}"
 *              | "reshard_after_forward" IDENT ";"
 *              | ";"
 *   global    := "global" STRING [ "split" INT ]
 *
 * Invariants: a pure parser (no globals; state in mf_parse_ctx); `%expect 0`;
 * every AST node gets the span of its tokens. Error recovery resynchronizes at
 * ';' and at '}' (in every block and at the top level), so independent
 * mistakes are each reported at their own line and column. Messages are
 * bison's detailed ones, rewritten in yyerror() to name the offending token's
 * text, to point a missing ';' at the end of the statement that lacks it, and
 * to suggest the keyword a misspelt one was meant to be.
 */
%define api.pure full
%define api.prefix {mf_yy}
%define api.location.type {mf_span}
%define parse.error detailed
%define parse.lac full
%locations
%expect 0

%code requires {
#include "mf_ast.h"
typedef void *yyscan_t;
struct mf_parse_ctx;
}

%code provides {
int mf_yylex(MF_YYSTYPE *lval, MF_YYLTYPE *lloc, yyscan_t scanner);
}

%code {
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_parse_ctx.h"

#define YYLLOC_DEFAULT(Cur, Rhs, N)                                 \
    do {                                                            \
        if (N) {                                                    \
            (Cur).line = YYRHSLOC(Rhs, 1).line;                     \
            (Cur).col = YYRHSLOC(Rhs, 1).col;                       \
            (Cur).end_line = YYRHSLOC(Rhs, N).end_line;             \
            (Cur).end_col = YYRHSLOC(Rhs, N).end_col;               \
        } else {                                                    \
            (Cur).line = (Cur).end_line = YYRHSLOC(Rhs, 0).end_line; \
            (Cur).col = (Cur).end_col = YYRHSLOC(Rhs, 0).end_col;   \
        }                                                           \
    } while (0)

static void mf_yyerror(const mf_span *loc, yyscan_t scanner, struct mf_parse_ctx *ctx, const char *msg);

/* Arena allocation of one zeroed node; out of memory leaves the parse. */
static void *mf_parse_new(struct mf_parse_ctx *ctx, size_t size)
{
    void *p = mf_arena_alloc(ctx->arena, size);
    if (!p)
        mf_parse_oom(ctx);
    return p;
}
#define NEW(T) ((T *)mf_parse_new(ctx, sizeof(T)))

/* Lists are built by prepending (O(1)) and reversed once complete. */
#define REVERSE(T, head)                        \
    do {                                        \
        T *prev_ = NULL, *cur_ = (head);        \
        while (cur_) {                          \
            T *next_ = cur_->next;              \
            cur_->next = prev_;                 \
            prev_ = cur_;                       \
            cur_ = next_;                       \
        }                                       \
        (head) = prev_;                         \
    } while (0)

static mf_ast_setting *mf_parse_setting(struct mf_parse_ctx *ctx, mf_ast_setting_kind kind,
                                        const char *key, mf_span key_span, mf_span span)
{
    mf_ast_setting *s = NEW(mf_ast_setting);
    s->kind = kind;
    s->key.text = key;
    s->key.span = key_span;
    s->span = span;
    s->next = ctx->ast->settings;
    ctx->ast->settings = s;
    return s;
}

static mf_ast_layout *mf_parse_layout(struct mf_parse_ctx *ctx, mf_ast_role *roles, mf_span brace)
{
    mf_ast_layout *l = NEW(mf_ast_layout);
    REVERSE(mf_ast_role, roles);
    l->roles = roles;
    l->span = brace;
    l->span.end_line = brace.line;
    l->span.end_col = brace.col + 1;
    return l;
}
}

%param {yyscan_t scanner}
%parse-param {struct mf_parse_ctx *ctx}

%union {
    mf_ast_name name;
    mf_ast_int num;
    mf_ast_loop loop;
    mf_ast_loop *loop_ptr;
    mf_ast_axis *axis;
    mf_ast_place *place;
    mf_ast_role *role;
    mf_ast_layout *layout;
    mf_ast_dim *dim;
    mf_ast_item *item;
    int role_kind;
}

%token <name> IDENT "identifier"
%token <name> STRING "string"
%token <num> INT "integer"
%token <num> SIZE "size"
%token KW_MESH "'mesh'"
%token KW_MICROBATCHES "'microbatches'"
%token KW_REDUCE "'reduce'"
%token KW_ALIGN "'align'"
%token KW_PREFETCH "'prefetch'"
%token KW_BUCKET_SIZE "'bucket_size'"
%token KW_BALANCE "'balance'"
%token KW_LAYOUT "'layout'"
%token KW_UNIT "'unit'"
%token KW_TENSOR "'tensor'"
%token KW_FOR "'for'"
%token KW_IN "'in'"
%token KW_RESHARD_AFTER_FORWARD "'reshard_after_forward'"
%token KW_WEIGHT "'weight'"
%token KW_GRAD "'grad'"
%token KW_MAIN_WEIGHT "'main_weight'"
%token KW_GLOBAL "'global'"
%token KW_SPLIT "'split'"
%token DOTDOT "'..'"

%type <num> size
%type <axis> axes axis
%type <place> places place
%type <role> roles role
%type <role_kind> role_kw
%type <layout> role_block
%type <loop> loop
%type <loop_ptr> opt_loop
%type <name> opt_layout
%type <dim> dims dim_list
%type <item> body_block body_items body_item tensor_tail opt_global global_clause

%%

file:
    %empty
  | file top_item
  ;

top_item:
    KW_MESH axes ';' {
        mf_ast_mesh *m = NEW(mf_ast_mesh);
        REVERSE(mf_ast_axis, $2);
        m->axes = $2;
        for (mf_ast_axis *x = $2; x; x = x->next)
            m->naxes++;
        m->span = @1;
        m->next = ctx->ast->meshes;
        ctx->ast->meshes = m;
    }
  | KW_MICROBATCHES INT ';' {
        mf_parse_setting(ctx, MF_AST_SET_MICROBATCHES, "microbatches", @1, @$)->num = $2;
    }
  | KW_REDUCE IDENT ';' {
        mf_parse_setting(ctx, MF_AST_SET_REDUCE, "reduce", @1, @$)->word = $2;
    }
  | KW_ALIGN size ';' {
        mf_parse_setting(ctx, MF_AST_SET_ALIGN, "align", @1, @$)->num = $2;
    }
  | KW_PREFETCH INT ';' {
        mf_parse_setting(ctx, MF_AST_SET_PREFETCH, "prefetch", @1, @$)->num = $2;
    }
  | KW_BUCKET_SIZE size ';' {
        mf_parse_setting(ctx, MF_AST_SET_BUCKET_SIZE, "bucket_size", @1, @$)->num = $2;
    }
  | KW_BALANCE IDENT ';' {
        mf_parse_setting(ctx, MF_AST_SET_BALANCE, "balance", @1, @$)->word = $2;
    }
  | KW_LAYOUT IDENT role_block {
        mf_ast_layout *l = $3;
        l->name = $2;
        l->span = @2;
        l->next = ctx->ast->layouts;
        ctx->ast->layouts = l;
    }
  | KW_UNIT STRING opt_loop opt_layout body_block {
        mf_ast_unit *u = NEW(mf_ast_unit);
        u->name = $2;
        u->layout = $4;
        u->body = $5;
        u->span = mf_span_join(@1, @2);
        u->loop = $3;
        u->next = ctx->ast->units;
        ctx->ast->units = u;
    }
  | ';'
  | error ';'
  | error '}'
  ;

size:
    INT
  | SIZE
  ;

axes:
    axis { $$ = $1; }
  | axes ',' axis { $3->next = $1; $$ = $3; }
  ;

axis:
    IDENT '=' INT {
        $$ = NEW(mf_ast_axis);
        $$->name = $1;
        $$->size = $3;
        $$->span = @$;
    }
  ;

role_block:
    '{' roles '}' { $$ = mf_parse_layout(ctx, $2, @1); }
  | '{' roles error '}' { $$ = mf_parse_layout(ctx, $2, @1); }
  ;

roles:
    %empty { $$ = NULL; }
  | roles role {
        $$ = $1;
        if ($2) {
            $2->next = $1;
            $$ = $2;
        }
    }
  ;

role:
    role_kw IDENT '[' places ']' ';' {
        $$ = NEW(mf_ast_role);
        $$->role = (mf_role)$1;
        $$->role_span = @1;
        $$->dtype = $2;
        REVERSE(mf_ast_place, $4);
        $$->places = $4;
        for (mf_ast_place *p = $4; p; p = p->next)
            $$->nplaces++;
        $$->places_span = mf_span_join(@3, @5);
        $$->span = @$;
    }
  | role_kw IDENT '[' ']' ';' {
        $$ = NEW(mf_ast_role);
        $$->role = (mf_role)$1;
        $$->role_span = @1;
        $$->dtype = $2;
        $$->places_span = mf_span_join(@3, @4);
        $$->span = @$;
    }
  | error ';' { $$ = NULL; }
  ;

role_kw:
    KW_WEIGHT { $$ = MF_ROLE_WEIGHT; }
  | KW_GRAD { $$ = MF_ROLE_GRAD; }
  | KW_MAIN_WEIGHT { $$ = MF_ROLE_MAIN_WEIGHT; }
  ;

places:
    place { $$ = $1; }
  | places ',' place { $3->next = $1; $$ = $3; }
  ;

place:
    IDENT {
        $$ = NEW(mf_ast_place);
        $$->value = $1;
        $$->span = @$;
    }
  | IDENT ':' IDENT {
        $$ = NEW(mf_ast_place);
        $$->axis = $1;
        $$->value = $3;
        $$->span = @$;
    }
  ;

loop:
    KW_FOR IDENT KW_IN INT DOTDOT INT {
        $$.var = $2;
        $$.lo = $4;
        $$.hi = $6;
        $$.span = @$;
    }
  ;

opt_loop:
    %empty { $$ = NULL; }
  | loop {
        $$ = NEW(mf_ast_loop);
        *$$ = $1;
    }
  ;

opt_layout:
    %empty { $$.text = NULL; $$.span = @$; }
  | KW_LAYOUT IDENT { $$ = $2; }
  ;

body_block:
    '{' body_items '}' { $$ = $2; REVERSE(mf_ast_item, $$); }
  | '{' body_items error '}' { $$ = $2; REVERSE(mf_ast_item, $$); }
  ;

body_items:
    %empty { $$ = NULL; }
  | body_items body_item {
        $$ = $1;
        if ($2) {
            $2->next = $1;
            $$ = $2;
        }
    }
  ;

body_item:
    KW_TENSOR STRING '[' dims ']' tensor_tail {
        $$ = $6;
        $$->kind = MF_AST_ITEM_TENSOR;
        $$->span = mf_span_join(@1, @2);
        $$->tensor.name = $2;
        REVERSE(mf_ast_dim, $4);
        $$->tensor.dims = $4;
        for (mf_ast_dim *d = $4; d; d = d->next)
            $$->tensor.ndims++;
        $$->tensor.dims_span = mf_span_join(@3, @5);
    }
  | loop body_block {
        $$ = NEW(mf_ast_item);
        $$->kind = MF_AST_ITEM_FOR;
        $$->span = $1.span;
        $$->loop = $1;
        $$->body = $2;
    }
  | KW_RESHARD_AFTER_FORWARD IDENT ';' {
        $$ = NEW(mf_ast_item);
        $$->kind = MF_AST_ITEM_OPTION;
        $$->span = @$;
        $$->key.text = "reshard_after_forward";
        $$->key.span = @1;
        $$->value = $2;
    }
  | ';' { $$ = NULL; }
  | error ';' { $$ = NULL; }
  ;

tensor_tail:
    opt_global ';' { $$ = $1; }
  | KW_LAYOUT IDENT opt_global ';' {
        $$ = $3;
        $$->tensor.layout = $2;
    }
  | role_block {
        $$ = NEW(mf_ast_item);
        $$->tensor.inline_layout = $1;
    }
  | role_block global_clause ';' {
        $$ = $2;
        $$->tensor.inline_layout = $1;
    }
  ;

opt_global:
    %empty { $$ = NEW(mf_ast_item); }
  | global_clause { $$ = $1; }
  ;

global_clause:
    KW_GLOBAL STRING {
        $$ = NEW(mf_ast_item);
        $$->tensor.global = $2;
        $$->tensor.global_span = mf_span_join(@1, @2);
    }
  | KW_GLOBAL STRING KW_SPLIT INT {
        $$ = NEW(mf_ast_item);
        $$->tensor.global = $2;
        $$->tensor.has_split = true;
        $$->tensor.split = $4;
        $$->tensor.global_span = mf_span_join(@1, @4);
    }
  ;

dims:
    %empty { $$ = NULL; }
  | dim_list { $$ = $1; }
  ;

dim_list:
    INT {
        $$ = NEW(mf_ast_dim);
        $$->size = $1;
    }
  | dim_list ',' INT {
        $$ = NEW(mf_ast_dim);
        $$->size = $3;
        $$->next = $1;
    }
  ;

%%

/* ---- error messages ---- */

static const char *const mf_top_keywords[] = {"mesh", "microbatches", "reduce", "align", "prefetch",
                                              "bucket_size", "balance", "layout", "unit"};
static const char *const mf_body_keywords[] = {"tensor", "for", "reshard_after_forward"};
static const char *const mf_role_keywords[] = {"weight", "grad", "main_weight"};

/* "a, b or c" into buf. */
static void mf_parse_list(char *buf, size_t size, const char *const *words, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < size; i++) {
        const char *sep = i == 0 ? "" : (i + 1 == n ? " or " : ", ");
        int w = snprintf(buf + o, size - o, "%s%s", sep, words[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* How the lookahead token reads in a message: its kind and text. */
static void mf_parse_describe(const struct mf_parse_ctx *ctx, const char *kind, char *buf, size_t size)
{
    switch (ctx->last_tok) {
    case IDENT:
        snprintf(buf, size, "identifier '%s'", ctx->last_text);
        break;
    case STRING:
        snprintf(buf, size, "string %s", ctx->last_text);
        break;
    case INT:
        snprintf(buf, size, "integer %s", ctx->last_text);
        break;
    case SIZE:
        snprintf(buf, size, "size %s", ctx->last_text);
        break;
    default:
        snprintf(buf, size, "%s", kind);
        break;
    }
}

/*
 * Bison's detailed message is "syntax error, unexpected X[, expecting A or
 * B]". Rewritten as:
 *   - an identifier where a statement must start: "unknown keyword 'mseh';
 *     did you mean 'mesh'?" (or the list of keywords legal there);
 *   - a missing token before a token on a later line (typically a missing
 *     ';'): "expected ';' before 'tensor'", at the end of the previous token;
 *   - otherwise "expected A or B before X", or "unexpected X" when bison had
 *     too many alternatives to list.
 */
static void mf_yyerror(const mf_span *loc, yyscan_t scanner, struct mf_parse_ctx *ctx, const char *msg)
{
    (void)scanner;
    /* After a limit, and right after a lexical error in the same statement
     * (an unterminated string swallows what follows), stay silent: the error
     * that matters is already reported and counted. */
    if (ctx->fatal || ctx->lex_error_in_stmt)
        return;
    mf_diag *d = ctx->diag;
    static const char prefix[] = "syntax error, unexpected ";
    if (strncmp(msg, prefix, sizeof prefix - 1) != 0) {
        /* "memory exhausted" and anything else bison may say */
        mf_diag_error(d, *loc, "%s", msg);
        return;
    }
    const char *rest = msg + sizeof prefix - 1;
    const char *exp = strstr(rest, ", expecting ");
    char kind[64];
    size_t klen = exp ? (size_t)(exp - rest) : strlen(rest);
    snprintf(kind, sizeof kind, "%.*s", (int)(klen < 63 ? klen : 63), rest);
    char what[MF_LEX_TEXT_MAX + 80];
    mf_parse_describe(ctx, kind, what, sizeof what);

    if (ctx->last_tok == IDENT && ctx->last_at_stmt_start) {
        const char *const *words = mf_top_keywords;
        size_t n = sizeof mf_top_keywords / sizeof mf_top_keywords[0];
        const char *noun = "keyword";
        if (ctx->last_block == MF_BLOCK_BODY) {
            words = mf_body_keywords;
            n = sizeof mf_body_keywords / sizeof mf_body_keywords[0];
        } else if (ctx->last_block == MF_BLOCK_ROLES) {
            words = mf_role_keywords;
            n = sizeof mf_role_keywords / sizeof mf_role_keywords[0];
            noun = "role";
        }
        const char *hint = mf_diag_suggest(ctx->last_text, words, n);
        if (hint) {
            mf_diag_error(d, *loc, "unknown %s '%s'; did you mean '%s'?", noun, ctx->last_text, hint);
        } else {
            char list[256];
            mf_parse_list(list, sizeof list, words, n);
            mf_diag_error(d, *loc, "unknown %s '%s'; expected %s", noun, ctx->last_text, list);
        }
        return;
    }
    /* A token missing at the end of a line is reported where it is missing,
     * right after the previous token. */
    mf_span at = *loc;
    if (ctx->prev_span.line > 0 && loc->line > ctx->prev_span.end_line) {
        at.line = at.end_line = ctx->prev_span.end_line;
        at.col = ctx->prev_span.end_col;
        at.end_col = at.col + 1;
    }
    const char *expected = exp ? exp + strlen(", expecting ") : NULL;
    if (ctx->last_tok == 0 && ctx->depth > 0 && (!expected || strstr(expected, "'}'"))) {
        mf_diag_error(d, at, "expected %s before end of file", expected ? expected : "'}'");
        mf_diag_note(d, ctx->brace_at[ctx->depth], "this '{' is never closed");
        return;
    }
    if (ctx->last_tok == '}' && ctx->depth == 0 && !expected) {
        mf_diag_error(d, *loc, "unmatched '}'; no block is open here");
        return;
    }
    if (!expected) {
        mf_diag_error(d, ctx->last_tok == 0 ? at : *loc, "unexpected %s", what);
        return;
    }
    mf_diag_error(d, at, "expected %s before %s", expected, what);
}

/* ---- entry point ---- */

typedef struct yy_buffer_state *YY_BUFFER_STATE;
int mf_yylex_init_extra(struct mf_parse_ctx *extra, yyscan_t *scanner);
int mf_yylex_destroy(yyscan_t scanner);
YY_BUFFER_STATE mf_yy_scan_bytes(const char *bytes, int len, yyscan_t scanner);

void mf_parse_oom(struct mf_parse_ctx *ctx)
{
    longjmp(ctx->oom_jump, 1);
}

enum { MF_PARSE_MAX_BYTES = 1 << 30 };

mf_ast *mf_parse(const mf_source *src, mf_diag *d, mf_arena *a)
{
    mf_span none = {0, 0, 0, 0};
    if (src->len > (size_t)MF_PARSE_MAX_BYTES) {
        mf_diag_error(d, none, "the file is too large (%zu bytes; limit is %d)", src->len, MF_PARSE_MAX_BYTES);
        return NULL;
    }
    struct mf_parse_ctx *ctx = calloc(1, sizeof *ctx);
    mf_ast *ast = mf_arena_alloc(a, sizeof *ast);
    if (!ctx || !ast) {
        free(ctx);
        mf_diag_error(d, none, "out of memory while parsing");
        return NULL;
    }
    ast->src = src;
    ctx->arena = a;
    ctx->diag = d;
    ctx->src = src;
    ctx->ast = ast;
    ctx->line = 1;
    ctx->col = 1;
    ctx->at_stmt_start = true;
    ctx->blocks[0] = MF_BLOCK_TOP;

    /* Volatile: read after a longjmp back here. */
    yyscan_t volatile scanner = NULL;
    mf_ast *volatile result = NULL;
    if (setjmp(ctx->oom_jump) == 0) {
        yyscan_t s = NULL;
        if (mf_yylex_init_extra(ctx, &s) != 0) {
            mf_diag_error(d, none, "out of memory while parsing");
            free(ctx);
            return NULL;
        }
        scanner = s;
        /* An empty buffer still needs a valid pointer. */
        mf_yy_scan_bytes(src->text ? src->text : "", (int)src->len, s);
        mf_yyparse(s, ctx);
        result = ast;
    } else {
        mf_diag_error(d, none, "out of memory while parsing");
        result = NULL;
    }
    if (scanner)
        mf_yylex_destroy(scanner);
    if (ctx->fatal)
        result = ast; /* the partial tree is consistent; errors stop the pipeline */
    free(ctx);
    if (result) {
        REVERSE(mf_ast_mesh, ast->meshes);
        REVERSE(mf_ast_setting, ast->settings);
        REVERSE(mf_ast_layout, ast->layouts);
        REVERSE(mf_ast_unit, ast->units);
    }
    return result;
}

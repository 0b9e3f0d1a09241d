/* Temporary until lowering/verifier/emitter/compile/diff land (schedule work deletes this file). */
#include "mf_cli.h"
#include "mf_passes.h"
bool mf_lower_run(mf_plan *p, mf_diag *d) { (void)p; (void)d; return false; }
int mf_verify_run(const mf_schedule *s, mf_diag *d) { (void)s; (void)d; return 1; }
int mf_emit_yaml(const mf_schedule *s, FILE *out) { (void)s; (void)out; return -1; }
int mf_cmd_compile(int argc, char **argv) { (void)argc; (void)argv; return 2; }
int mf_cmd_diff(int argc, char **argv) { (void)argc; (void)argv; return 2; }

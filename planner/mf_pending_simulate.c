/* Temporary until `mfsdpc simulate` lands (simulation work deletes this file). */
#include "mf_cli.h"
int mf_cmd_simulate(int argc, char **argv) { (void)argc; (void)argv; return 2; }

/*
 * mf_cli: the subcommands of mfsdpc, one file each (mf_cmd_<name>.c).
 * Each takes argv starting at the subcommand name and returns the exit
 * status: 0 success, 1 diagnosed error in the input (or "different" for
 * diff), 2 usage or I/O error.
 */
#ifndef MF_CLI_H
#define MF_CLI_H

int mf_cmd_check(int argc, char **argv);
int mf_cmd_compile(int argc, char **argv);
int mf_cmd_explain(int argc, char **argv);
int mf_cmd_diff(int argc, char **argv);
int mf_cmd_simulate(int argc, char **argv);
int mf_cmd_plan(int argc, char **argv);
int mf_cmd_reshard_plan(int argc, char **argv);
int mf_cmd_init(int argc, char **argv);

#endif

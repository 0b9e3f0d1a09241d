/*
 * mfsdp_ckpt_tool: the subcommands of mfsdp-ckpt that live in their own file
 * (mfsdp_ckpt_hf.c). argv starts at the subcommand; returns the exit status.
 */
#ifndef MFSDP_CKPT_TOOL_H
#define MFSDP_CKPT_TOOL_H

int ck_import(int argc, char **argv);
int ck_export(int argc, char **argv);

#endif

/*
 * mf_ckpt_crc: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78, initial
 * and final XOR 0xffffffff: the iSCSI/ext4 checksum) of byte strings, and
 * the combination of two CRCs so that a file's checksum can be formed from
 * the checksums of its parts without reading them again (docs/checkpoint.md).
 * Uses the SSE4.2 crc32 instruction when the CPU has it, a table otherwise;
 * both give the same value.
 */
#ifndef MF_CKPT_CRC_H
#define MF_CKPT_CRC_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data[0..len) continuing from crc (0 for a fresh start):
 * mf_ckpt_crc_update(mf_ckpt_crc_update(0, a, n), b, m) == CRC of a followed by b. */
uint32_t mf_ckpt_crc_update(uint32_t crc, const void *data, size_t len);
/* The CRC-32C of A followed by B, from crc_a = CRC(A), crc_b = CRC(B) and
 * len_b = |B| bytes. */
uint32_t mf_ckpt_crc_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif

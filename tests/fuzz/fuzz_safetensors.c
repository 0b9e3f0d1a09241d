/*
 * fuzz_safetensors: libFuzzer target for the safetensors header parser of
 * checkpoints (ckpt/mf_ckpt_st.c), which reads files a checkpoint or a
 * Hugging Face model brings.
 *
 * Each input is a whole file (8-byte length, JSON header, data), read through
 * mf_ckpt_st_read() from a memory file. Beyond "no crash, no leak, no UB" it
 * checks the parser's contract and traps when it is broken:
 *   - failure <=> a message naming the file ("fuz.safetensors: ...");
 *   - on success the entries are sorted, tile the data section exactly, and
 *     each one's size is its element count times its dtype's size.
 * fuzz_safetensors_corpus feeds every seed through it in every build.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "mf_ckpt_st.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuz", 0);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(size == 0 || write(fd, data, size) == (ssize_t)size);
    char err[512];
    memset(err, 'x', sizeof err);
    mf_st_file f;
    int rc = mf_ckpt_st_read(fd, "fuz.safetensors", size, &f, err, sizeof err);
    close(fd);
    if (rc != 0) {
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
        if (strncmp(err, "fuz.safetensors: ", 17) != 0)
            FUZZ_FAIL("message does not name the file: %.300s", err);
        return 0;
    }
    FUZZ_CHECK(f.data_start + f.data_len == size);
    uint64_t at = 0;
    for (int i = 0; i < f.n; i++) {
        const mf_st_entry *e = &f.e[i];
        FUZZ_CHECK(e->name != NULL && e->begin == at && e->end >= e->begin);
        FUZZ_CHECK((uint64_t)e->numel * mf_st_dtype_size(e->dtype) == e->end - e->begin);
        FUZZ_CHECK(mf_ckpt_st_find(&f, e->name) != NULL);
        at = e->end;
    }
    FUZZ_CHECK(at == f.data_len);
    mf_ckpt_st_free(&f);
    return 0;
}

/*
 * mf_ckpt_stage: checkpoint access to buffer memory through be->stage (see
 * the header).
 */
#include "mf_ckpt_stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t mf_ckpt_host_staged_bytes;

uint64_t mf_ckpt_stage_host_bytes(void)
{
    return mf_ckpt_host_staged_bytes;
}

mfsdp_result mf_ckpt_stage_host(mf_rt *rt, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    (void)rt;
    (void)err;
    (void)errlen;
    memcpy(dst, src, bytes);
    mf_ckpt_host_staged_bytes += bytes;
    return MFSDP_OK;
}

int mf_ckpt_stage_active(const mf_rt *rt)
{
    const char *env = getenv("MFSDP_CKPT_STAGE");
    return rt->native || (env && strcmp(env, "1") == 0);
}

mfsdp_result mf_ckpt_stage_begin(mf_rt *rt, char *err, size_t errlen)
{
    if (!rt->be->stage) {
        snprintf(err, errlen, "the %s backend cannot copy its buffers to host memory (no stage hook)",
                 rt->be->name);
        return MFSDP_ERR_UNSUPPORTED;
    }
    if (rt->native && rt->be->synchronize)
        return rt->be->synchronize(rt, err, errlen);
    return MFSDP_OK;
}

int mf_ckpt_stage_fill(void *ctx, int entry, uint64_t off, void *buf, size_t n, char *err, size_t errlen)
{
    const mf_ckpt_stage_src *s = ctx;
    char msg[256] = "";
    if (s->rt->be->stage(s->rt, buf, s->src[entry] + off, n, msg, sizeof msg) != MFSDP_OK)
        return snprintf(err, errlen, "copying buffer memory to host memory failed: %s", msg), -1;
    return 0;
}

void mf_ckpt_stage_chunk(void *ctx, size_t off, const void *data, size_t n)
{
    mf_ckpt_stage_dst *s = ctx;
    if (s->res == MFSDP_OK)
        s->res = s->rt->be->stage(s->rt, s->dst + off, data, n, s->err, sizeof s->err);
}

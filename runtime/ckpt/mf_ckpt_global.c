/*
 * mf_ckpt_global: the checkpoint names of a schedule's tensors and the
 * refusals of what checkpoints cannot name (see the header).
 */
#include "mf_ckpt_global.h"

#include <string.h>

#include "mf_ckpt_plan.h"
#include "mf_rt.h"

mfsdp_result mf_ckpt_global_check(mf_rt *rt, const char *fn)
{
    char err[1024];
    if (mf_ckpt_plan_check_global(rt->s, err, sizeof err) != 0)
        return mf_base_set_error(rt, MFSDP_ERR_UNSUPPORTED, "%s: %s", fn, err);
    return MFSDP_OK;
}

const char *mf_ckpt_global_name(mf_rt *rt, int view)
{
    const mf_rt_tensor *rt_t = &rt->sh->tensors[view];
    const mf_tensor *t = &rt->s->buckets[rt_t->bucket].tensors[rt_t->index];
    if (!t->nglobal)
        return t->name;
    return t->global[t->global_split ? 0 : mf_ckpt_plan_coord(rt->s, rt_t->bucket, rt->rank)];
}

int mf_ckpt_global_map(mf_rt *rt, int view, int64_t *run, int64_t *grow, int64_t *gbase, int64_t *gdims)
{
    const mf_rt_tensor *rt_t = &rt->sh->tensors[view];
    int64_t c = mf_ckpt_plan_coord(rt->s, rt_t->bucket, rt->rank);
    return mf_ckpt_plan_gmap(rt->s, rt_t->bucket, rt_t->index, c, run, grow, gbase, gdims);
}

bool mf_ckpt_global_known(mf_rt *rt, const char *name)
{
    const mf_schedule *s = rt->s;
    bool distinct = false;
    for (int b = 0; b < s->nbuckets && !distinct; b++)
        distinct = mf_placement_has_distinct(&s->buckets[b].place[MF_ROLE_WEIGHT], s->mesh.naxes);
    if (!distinct)
        return mfsdp_tensor_find(rt, name) >= 0;
    for (int b = 0; b < s->nbuckets; b++)
        for (int i = 0; i < s->buckets[b].ntensors; i++) {
            const mf_tensor *t = &s->buckets[b].tensors[i];
            if (!t->nglobal && strcmp(t->name, name) == 0)
                return true;
            for (int g = 0; g < t->nglobal; g++)
                if (strcmp(t->global[g], name) == 0)
                    return true;
        }
    return false;
}

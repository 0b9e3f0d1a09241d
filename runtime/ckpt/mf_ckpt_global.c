/*
 * mf_ckpt_global: the refusal of checkpoints of a schedule with a Distinct
 * axis (see the header).
 */
#include "mf_ckpt_global.h"

#include "mf_rt.h"

mfsdp_result mf_ckpt_global_check(mf_rt *rt, const char *fn)
{
    const mf_schedule *s = rt->s;
    for (int b = 0; b < s->nbuckets; b++)
        for (int j = 0; j < s->mesh.naxes; j++)
            if (s->buckets[b].place[MF_ROLE_WEIGHT].p[j] == MF_PLACE_DISTINCT)
                return mf_base_set_error(
                    rt, MFSDP_ERR_UNSUPPORTED,
                    "%s: the schedule's axis '%s' is Distinct in bucket '%s' (each coordinate holds a different "
                    "tensor under the same name); checkpoints and the Hugging Face export/import need the global "
                    "names of distinct tensors (issue #42, item 2), which do not exist yet",
                    fn, s->mesh.axes[j].name, s->buckets[b].name);
    return MFSDP_OK;
}

/*
 * consumer: uses nothing but the installed public header. Loads a one-rank
 * schedule, runs two steps through the hooks, and checks through the views
 * that the unsharded weights equal main_weight and that the delivered
 * gradient equals what backward wrote (one rank, one microbatch).
 */
#include <stdio.h>
#include <string.h>

#include <mfsdp.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        mfsdp_result r_ = (call);                                                    \
        if (r_ != MFSDP_OK) {                                                        \
            fprintf(stderr, "consumer: %s: %s: %s\n", #call, mfsdp_result_string(r_), \
                    mfsdp_last_error(rt));                                           \
            return 1;                                                                \
        }                                                                            \
    } while (0)

int main(int argc, char **argv)
{
    mfsdp_runtime *rt = NULL;
    if (argc != 2) {
        fprintf(stderr, "usage: consumer SCHEDULE.yaml\n");
        return 2;
    }
    if (mfsdp_version_code() != MFSDP_VERSION_CODE) {
        fprintf(stderr, "consumer: header %d, library %d\n", MFSDP_VERSION_CODE, mfsdp_version_code());
        return 1;
    }
    mfsdp_schedule *sh = NULL;
    CHECK(mfsdp_schedule_load(argv[1], &sh));
    mfsdp_local_group *g = NULL;
    CHECK(mfsdp_local_group_create(1, &g));
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = g;
    cfg.rank = 0;
    cfg.timeout_ms = 10000;
    CHECK(mfsdp_create(sh, &cfg, &rt));
    int nt = mfsdp_num_tensors(rt), units = mfsdp_schedule_num_units(sh);
    for (int k = 0; k < nt; k++) {
        mfsdp_tensor_view v;
        CHECK(mfsdp_tensor_view_get(rt, k, &v));
        if (v.main_weight_dtype != MFSDP_FP32 || v.shard_count != v.numel)
            return 1;
        for (int64_t i = 0; i < v.shard_count; i++)
            ((float *)v.main_weight)[i] = (float)(k * 100 + i);
    }
    for (int step = 0; step < 2; step++) {
        CHECK(mfsdp_step_begin(rt));
        for (int u = 0; u < units; u++) {
            CHECK(mfsdp_forward_pre(rt, u, 0));
            for (int k = 0; k < nt; k++) {
                mfsdp_tensor_view v;
                CHECK(mfsdp_tensor_view_get(rt, k, &v));
                if (v.unit == u && memcmp(v.weight, v.main_weight, (size_t)v.numel * 4) != 0) {
                    fprintf(stderr, "consumer: %s: weight differs from main_weight\n", v.name);
                    return 1;
                }
            }
            CHECK(mfsdp_forward_post(rt, u, 0));
        }
        for (int u = units - 1; u >= 0; u--) {
            CHECK(mfsdp_backward_pre(rt, u, 0));
            for (int k = 0; k < nt; k++) {
                mfsdp_tensor_view v;
                CHECK(mfsdp_tensor_view_get(rt, k, &v));
                for (int64_t i = 0; v.unit == u && i < v.numel; i++)
                    ((float *)v.grad_local)[i] = (float)(step + k + i);
            }
            CHECK(mfsdp_backward_post(rt, u, 0));
        }
        CHECK(mfsdp_step_end(rt));
        for (int k = 0; k < nt; k++) {
            mfsdp_tensor_view v;
            CHECK(mfsdp_tensor_view_get(rt, k, &v));
            for (int64_t i = 0; i < v.shard_count; i++) {
                float gr = ((float *)v.grad)[i];
                if (gr != (float)(step + k + i)) {
                    fprintf(stderr, "consumer: %s[%lld]: gradient %g\n", v.name, (long long)i, gr);
                    return 1;
                }
                ((float *)v.main_weight)[i] -= 0.5f * gr;
            }
        }
    }
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
    printf("consumer: ok (libmfsdp %s, %d tensors)\n", mfsdp_version(), nt);
    return 0;
}

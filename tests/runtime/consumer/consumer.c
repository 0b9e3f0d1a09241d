/*
 * consumer: uses nothing but the installed public headers. Loads a one-rank
 * schedule, runs two steps through the hooks, and checks through the views
 * that the unsharded weights equal main_weight and that the delivered
 * gradient equals what backward wrote (one rank, one microbatch).
 *
 * Built three ways by install_consumer.sh: plain (a CPU trainer: local
 * backend), with CONSUMER_MPI (includes mfsdp_mpi.h, calls MPI itself and
 * runs on the mpi backend) and with CONSUMER_NCCL (includes mfsdp_nccl.h and
 * checks the GPU backends are built in; it still runs on the local backend,
 * so no GPU is needed).
 */
#include <stdio.h>
#include <string.h>

#include <mfsdp.h>
#ifdef CONSUMER_MPI
#include <mfsdp_mpi.h>
#endif
#ifdef CONSUMER_NCCL
#include <mfsdp_nccl.h>
#endif

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
#ifdef CONSUMER_NCCL
    if (!mfsdp_backend_available(MFSDP_BACKEND_NCCL) || mfsdp_nccl_device(NULL) != -1) {
        fprintf(stderr, "consumer: libmfsdp_nccl lacks the NCCL backend\n");
        return 1;
    }
#else
    if (mfsdp_backend_available(MFSDP_BACKEND_NCCL)) {
        fprintf(stderr, "consumer: the CPU library has the NCCL backend built in\n");
        return 1;
    }
#endif
    mfsdp_schedule *sh = NULL;
    CHECK(mfsdp_schedule_load(argv[1], &sh));
    mfsdp_local_group *g = NULL;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = 10000;
#ifdef CONSUMER_MPI
    int provided = 0, steps = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm comm = MPI_COMM_WORLD;
    mfsdp_config_set_mpi(&cfg, &comm);
    int me = -1;
    MPI_Comm_rank(comm, &me);
    if (me == 0)
        steps = 2;
    MPI_Bcast(&steps, 1, MPI_INT, 0, comm);   /* the trainer's own MPI traffic */
    if (steps != 2)
        return 1;
#else
    CHECK(mfsdp_local_group_create(1, &g));
    cfg.local_group = g;
    cfg.rank = 0;
#endif
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
        /* The helpers from the installed library: one rank, one microbatch,
         * so the global norm is that of what backward wrote. */
        double norm = 0, want = 0;
        CHECK(mfsdp_grad_norm(rt, &norm));
        for (int k = 0; k < nt; k++) {
            mfsdp_tensor_view v;
            CHECK(mfsdp_tensor_view_get(rt, k, &v));
            for (int64_t i = 0; i < v.numel; i++)
                want += (double)(step + k + i) * (double)(step + k + i);
        }
        if (mfsdp_unit_find(rt, mfsdp_schedule_unit_name(sh, units - 1)) != units - 1 ||
            norm * norm < want * (1 - 1e-9) || norm * norm > want * (1 + 1e-9)) {
            fprintf(stderr, "consumer: helpers: norm %.17g, want sqrt(%.17g)\n", norm, want);
            return 1;
        }
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
#ifdef CONSUMER_MPI
    MPI_Finalize();
#endif
    printf("consumer: ok (libmfsdp %s, %d tensors)\n", mfsdp_version(), nt);
    return 0;
}

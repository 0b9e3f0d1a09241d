/*
 * mfsdp-replay: replays a compiled schedule on every rank of its mesh with
 * synthetic data distinct per rank, microbatch and element, and checks the
 * oracle of docs/design.md §4.1 on every rank after every step (mf_check.h).
 *
 *   mfsdp-replay SCHEDULE.yaml [--backend local|mpi|cuda-local|nccl] [--ranks N]
 *                [--steps S] [--timeout-ms T] [--sync] [--quiet]
 *
 * local: one thread per rank in this process. mpi: run under mpirun with one
 * process per rank. cuda-local (CUDA build): one thread per rank on one GPU,
 * device buffers and kernels, collectives by device copies. nccl (CUDA build):
 * a 1-rank mesh on one GPU through NCCL. The GPU backends run in their
 * host-compute mode (managed memory), so the oracle reads buffers directly. Prints per step the collectives and bytes by axis, the
 * time per stream and `verified` or the first mismatch. Exit status: 0 when
 * every rank verified every step, 1 on a mismatch or a runtime error, 2 on a
 * usage error, an unreadable schedule or a world size that does not match the
 * mesh. Fault injection for tests: --stop-rank R --stop-step S (rank R stops
 * calling hooks after step_begin of step S), --mismatch-rank R (rank R's
 * schedule hash differs).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_check.h"
#include "mf_rt.h"

#ifdef MFSDP_HAVE_MPI
#include <mpi.h>
#endif

typedef struct args {
    const char *path;
    const char *backend;
    int64_t ranks;          /* -1: the mesh's */
    int64_t steps;
    int64_t timeout_ms;
    bool sync, quiet;
    int64_t stop_rank, stop_step, mismatch_rank;
} args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mfsdp-replay SCHEDULE.yaml [--backend local|mpi|cuda-local|nccl] [--ranks N]\n"
            "                    [--steps S] [--timeout-ms T] [--sync] [--quiet]\n"
            "Replays a compiled schedule on every mesh rank with synthetic data and checks\n"
            "that every unsharded weight equals the cast main_weight and that the delivered\n"
            "gradient equals the reduction of every rank's local gradients.\n"
            "  --backend local   one thread per rank in this process (default)\n"
            "  --backend mpi     one process per rank, under mpirun -np <world>\n"
            "  --backend cuda-local  one thread per rank on one GPU (CUDA build)\n"
            "  --backend nccl    a 1-rank mesh on one GPU through NCCL (CUDA build)\n"
            "  --ranks N         world size; must equal the mesh's (default: the mesh's)\n"
            "  --steps S         optimizer steps to replay (default 2)\n"
            "  --timeout-ms T    limit of every wait in the runtime (default 60000; 0: none)\n"
            "  --sync            run every op on the rank's own thread (debugging)\n"
            "exit status: 0 verified, 1 mismatch or runtime error, 2 usage or input error\n");
}

static bool parse_int(const char *s, int64_t min, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < min)
        return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->backend = "local";
    a->ranks = -1;
    a->steps = 2;
    a->timeout_ms = 60000;
    a->stop_rank = a->stop_step = a->mismatch_rank = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--version")) {
            printf("mfsdp-replay %s\n", mfsdp_version());
            return 0;
        } else if (!strcmp(o, "--sync")) {
            a->sync = true;
            continue;
        } else if (!strcmp(o, "--quiet")) {
            a->quiet = true;
            continue;
        } else if (o[0] == '-' && o[1] == '-') {
            if (!v) {
                fprintf(stderr, "mfsdp-replay: error: option %s needs a value\n", o);
                return 2;
            }
            i++;
            if (!strcmp(o, "--backend")) {
                a->backend = v;
                ok = !strcmp(v, "local") || !strcmp(v, "mpi") || !strcmp(v, "cuda-local") ||
                     !strcmp(v, "nccl");
            } else if (!strcmp(o, "--ranks"))
                ok = parse_int(v, 1, &a->ranks);
            else if (!strcmp(o, "--steps"))
                ok = parse_int(v, 1, &a->steps);
            else if (!strcmp(o, "--timeout-ms"))
                ok = parse_int(v, 0, &a->timeout_ms);
            else if (!strcmp(o, "--stop-rank"))
                ok = parse_int(v, 0, &a->stop_rank);
            else if (!strcmp(o, "--stop-step"))
                ok = parse_int(v, 1, &a->stop_step);
            else if (!strcmp(o, "--mismatch-rank"))
                ok = parse_int(v, 0, &a->mismatch_rank);
            else {
                fprintf(stderr, "mfsdp-replay: error: unknown option %s (see --help)\n", o);
                return 2;
            }
            if (!ok) {
                fprintf(stderr, "mfsdp-replay: error: invalid value '%s' for %s\n", v, o);
                return 2;
            }
        } else if (!a->path) {
            a->path = o;
        } else {
            fprintf(stderr, "mfsdp-replay: error: more than one schedule given ('%s')\n", o);
            return 2;
        }
    }
    if (!a->path) {
        fprintf(stderr, "mfsdp-replay: error: no schedule given\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

static void describe(const mfsdp_schedule *sh, const char *path, const char *backend, FILE *out)
{
    fprintf(out, "mfsdp-replay: %s: mesh", path);
    for (int j = 0; j < mfsdp_schedule_num_axes(sh); j++)
        fprintf(out, "%s%s=%lld", j ? " x " : " ", mfsdp_schedule_axis_name(sh, j),
                (long long)mfsdp_schedule_axis_size(sh, j));
    fprintf(out, " (%lld ranks), %d units, %lld microbatches, reduce %s, backend %s\n",
            (long long)mfsdp_schedule_world_size(sh), mfsdp_schedule_num_units(sh),
            (long long)mfsdp_schedule_microbatches(sh), mfsdp_schedule_reduce_is_avg(sh) ? "avg" : "sum",
            backend);
}

/* MemAvailable in bytes, or 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

/* Refuses a replay that cannot fit in this machine's memory (rather than
 * being killed half-way): `ranks` ranks share this machine. */
static bool fits(const mfsdp_schedule *sh, const char *path, int64_t ranks)
{
    uint64_t need = (uint64_t)mf_check_rank_bytes(sh) * (uint64_t)ranks, have = mem_available();
    if (have == 0 || need <= have / 10 * 9)
        return true;
    fprintf(stderr,
            "mfsdp-replay: error: replaying %s needs about %.1f GB on this machine (%lld ranks x "
            "%.2f GB of buffers and checks) but only %.1f GB are available; replay it with "
            "--backend mpi over more machines\n",
            path, (double)need / 1e9, (long long)ranks, (double)need / 1e9 / (double)ranks,
            (double)have / 1e9);
    return false;
}

static void perturb(mfsdp_schedule *sh)
{
    sh->s->hash[0] ^= 0xa5;
}

static int run_local(const args *a, mfsdp_schedule *sh)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (a->ranks >= 0 && a->ranks != world) {
        fprintf(stderr, "mfsdp-replay: error: --ranks %lld does not match the mesh of %s (%lld ranks)\n",
                (long long)a->ranks, a->path, (long long)world);
        return 2;
    }
    if (!fits(sh, a->path, world))
        return 2;
    mfsdp_schedule *other = NULL;
    const mfsdp_schedule **per_rank = NULL;
    if (a->mismatch_rank >= 0 && a->mismatch_rank < world) {
        if (mfsdp_schedule_load(a->path, &other) != MFSDP_OK) {
            fprintf(stderr, "mfsdp-replay: error: %s\n", mfsdp_last_error(NULL));
            return 2;
        }
        perturb(other);
        per_rank = calloc((size_t)world, sizeof *per_rank);
        if (!per_rank) {
            mfsdp_schedule_free(other);
            fprintf(stderr, "mfsdp-replay: error: out of memory\n");
            return 2;
        }
        for (int64_t r = 0; r < world; r++)
            per_rank[r] = r == a->mismatch_rank ? other : sh;
    }
    mf_check_outcome *outs = calloc((size_t)world, sizeof *outs);
    if (!outs) {
        free(per_rank);
        mfsdp_schedule_free(other);
        fprintf(stderr, "mfsdp-replay: error: out of memory\n");
        return 2;
    }
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.timeout_ms = a->timeout_ms;
    cfg.flags = a->sync ? MFSDP_FLAG_SYNCHRONOUS : 0;
    if (!strcmp(a->backend, "cuda-local"))
        cfg.backend = MFSDP_BACKEND_CUDA_LOCAL; /* mf_check_local keeps it */
    mf_check_opts o = {.steps = a->steps, .stop_rank = a->stop_rank, .stop_step = a->stop_step,
                       .out = a->quiet ? NULL : stdout};
    if (!a->quiet)
        describe(sh, a->path, a->backend, stdout);
    int rc = mf_check_local(sh, (const mfsdp_schedule *const *)per_rank, &cfg, &o, outs);
    if (rc == 0) {
        printf("verified: %lld ranks, %lld steps\n", (long long)world, (long long)a->steps);
    } else {
        printf("FAILED: %s\n", outs[0].msg);
        for (int64_t r = 0; r < world; r++)
            if (outs[r].own[0])
                fprintf(stderr, "%s\n", outs[r].own);
        rc = 1;
    }
    free(outs);
    free(per_rank);
    mfsdp_schedule_free(other);
    return rc;
}

/* The check's exchange for a world of one rank. */
typedef struct one_xchg {
    void *buf;
    size_t cap;
} one_xchg;

static const void *one_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes)
{
    one_xchg *x = ctx;
    (void)rank;
    if (bytes > x->cap)
        return NULL;
    memcpy(x->buf, mine, bytes);
    return x->buf;
}

/* --backend nccl: a 1-rank mesh on this process's GPU through NCCL. */
static int run_nccl(const args *a, mfsdp_schedule *sh)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (world != 1 || (a->ranks >= 0 && a->ranks != 1)) {
        fprintf(stderr,
                "mfsdp-replay: error: --backend nccl replays a 1-rank mesh (%s has %lld ranks); use "
                "--backend cuda-local for many ranks on one GPU\n",
                a->path, (long long)world);
        return 2;
    }
    one_xchg x = {.cap = mf_check_xchg_bytes(sh)};
    x.buf = malloc(x.cap ? x.cap : 1);
    if (!x.buf) {
        fprintf(stderr, "mfsdp-replay: error: out of memory\n");
        return 2;
    }
    mf_check_xchg xc = {one_allgather, &x};
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_NCCL; /* backend_config NULL: one GPU, host compute */
    cfg.rank = 0;
    cfg.timeout_ms = a->timeout_ms;
    mf_check_opts o = {.steps = a->steps, .stop_rank = a->stop_rank, .stop_step = a->stop_step,
                       .out = a->quiet ? NULL : stdout};
    if (!a->quiet)
        describe(sh, a->path, "nccl", stdout);
    mf_check_outcome out;
    int rc = mf_check_rank(sh, &cfg, &xc, &o, &out);
    if (rc == 0)
        printf("verified: 1 rank, %lld steps\n", (long long)a->steps);
    else
        printf("FAILED: %s\n", out.msg[0] ? out.msg : out.own);
    free(x.buf);
    return rc == 0 ? 0 : 1;
}

#ifdef MFSDP_HAVE_MPI
typedef struct mpi_xchg {
    MPI_Comm comm;
    uint8_t *buf;
    size_t cap;
    int world;
} mpi_xchg;

static const void *mpi_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes)
{
    mpi_xchg *x = ctx;
    (void)rank;
    if (bytes > x->cap || bytes > (size_t)0x7fffffff)
        return NULL;
    if (MPI_Allgather(mine, (int)bytes, MPI_BYTE, x->buf, (int)bytes, MPI_BYTE, x->comm) != MPI_SUCCESS)
        return NULL;
    return x->buf;
}

static int run_mpi(const args *a, mfsdp_schedule *sh, int rank, int size)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (size != world || (a->ranks >= 0 && a->ranks != world)) {
        if (rank == 0)
            fprintf(stderr,
                    "mfsdp-replay: error: the MPI world has %d processes but the mesh of %s needs "
                    "%lld (run mpirun -np %lld)\n",
                    size, a->path, (long long)world, (long long)world);
        return 2;
    }
    MPI_Comm node;
    int node_ranks = 1, fit, all_fit = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_ranks);
    MPI_Comm_free(&node);
    fit = rank == 0 ? fits(sh, a->path, node_ranks) : 1;
    MPI_Allreduce(&fit, &all_fit, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_fit)
        return 2;
    if (rank == a->mismatch_rank)
        perturb(sh);
    mpi_xchg x = {.cap = mf_check_xchg_bytes(sh), .world = size};
    x.buf = malloc(x.cap * (size_t)size);
    int ok = x.buf != NULL, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        free(x.buf);
        if (rank == 0)
            fprintf(stderr, "mfsdp-replay: error: out of memory\n");
        return 2;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &x.comm);
    mf_check_xchg xc = {mpi_allgather, &x};
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    MPI_Comm world_comm = MPI_COMM_WORLD;
    cfg.backend = MFSDP_BACKEND_MPI;
    cfg.mpi_comm = &world_comm;
    cfg.rank = rank;
    cfg.timeout_ms = a->timeout_ms;
    cfg.flags = a->sync ? MFSDP_FLAG_SYNCHRONOUS : 0;
    mf_check_opts o = {.steps = a->steps, .stop_rank = a->stop_rank, .stop_step = a->stop_step,
                       .out = a->quiet || rank != 0 ? NULL : stdout};
    if (!a->quiet && rank == 0)
        describe(sh, a->path, "mpi", stdout);
    mf_check_outcome out;
    int rc = mf_check_rank(sh, &cfg, &xc, &o, &out);
    if (out.own[0])
        fprintf(stderr, "%s\n", out.own);
    if (rank == 0) {
        if (rc == 0)
            printf("verified: %d ranks, %lld steps\n", size, (long long)a->steps);
        else
            printf("FAILED: %s\n", out.msg);
        fflush(stdout);
    }
    MPI_Barrier(x.comm);
    MPI_Comm_free(&x.comm);
    free(x.buf);
    return rc == 0 ? 0 : 1;
}
#endif

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    bool mpi = !strcmp(a.backend, "mpi");
#ifdef MFSDP_HAVE_MPI
    int rank = 0, size = 1;
    if (mpi) {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (provided < MPI_THREAD_MULTIPLE) {
            if (rank == 0)
                fprintf(stderr, "mfsdp-replay: error: this MPI does not provide MPI_THREAD_MULTIPLE\n");
            MPI_Finalize();
            return 2;
        }
    }
#else
    if (mpi) {
        fprintf(stderr, "mfsdp-replay: error: this build has no MPI backend (MPI was not found)\n");
        return 2;
    }
#endif
    bool gpu = !strcmp(a.backend, "cuda-local") || !strcmp(a.backend, "nccl");
    if (gpu && !mfsdp_backend_available(MFSDP_BACKEND_CUDA_LOCAL)) {
        fprintf(stderr, "mfsdp-replay: error: this build has no CUDA backend (CUDA or NCCL was not found)\n");
        return 2;
    }
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(a.path, &sh) != MFSDP_OK) {
#ifdef MFSDP_HAVE_MPI
        if (!mpi || rank == 0)
#endif
            fprintf(stderr, "mfsdp-replay: error: %s\n", mfsdp_last_error(NULL));
        rc = 2;
    } else {
#ifdef MFSDP_HAVE_MPI
        rc = mpi ? run_mpi(&a, sh, rank, size) : !strcmp(a.backend, "nccl") ? run_nccl(&a, sh) : run_local(&a, sh);
#else
        rc = !strcmp(a.backend, "nccl") ? run_nccl(&a, sh) : run_local(&a, sh);
#endif
    }
    mfsdp_schedule_free(sh);
#ifdef MFSDP_HAVE_MPI
    if (mpi)
        MPI_Finalize();
#endif
    fflush(stdout);
    return rc;
}

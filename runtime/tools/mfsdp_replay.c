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
 * one process per rank and one GPU each through NCCL, under mpirun -np <world>
 * (rank 0's ncclGetUniqueId broadcast with MPI_Bcast; device = the local rank
 * mod the devices the process sees); a 1-rank mesh also runs without mpirun.
 * The GPU backends run in their host-compute mode (managed memory), so the
 * oracle reads buffers directly. Prints per step the collectives and bytes by
 * axis, the time per stream and `verified` or the first mismatch. Exit status:
 * 0 when every rank verified every step (`verified` is printed only then), 1 on
 * a mismatch, a runtime error (under mpirun: on any rank, a failed start-up
 * included) or a peer that died or stopped (under mpirun every surviving rank
 * exits 1 within the timeout and about a second, naming it), 2 on a usage
 * error, an unreadable schedule or a world size that does not match the mesh. Fault injection for tests: --stop-rank R --stop-step S (rank R stops
 * calling hooks after step_begin of step S), --mismatch-rank R (rank R's
 * schedule hash differs).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mf_check.h"
#include "mf_opts.h"
#include "mf_rt.h"

#ifdef MFSDP_HAVE_MPI
#include <mpi.h>
#endif
#ifdef MFSDP_HAVE_CUDA
#include "mfsdp_nccl.h"
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
            "  --backend nccl    one process per rank, one GPU each, through NCCL, under\n"
            "                    mpirun -np <world> (CUDA and MPI build; a 1-rank mesh also alone)\n"
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

/* The options, in the order of their table in parse_args. */
enum { O_HELP, O_VERSION, O_SYNC, O_QUIET, O_BACKEND, O_RANKS, O_STEPS, O_TIMEOUT, O_STOP_RANK, O_STOP_STEP,
       O_MISMATCH_RANK };

/* Where the value of an option with an integer value goes, and its least value. */
static int64_t *int_option(args *a, int id, int64_t *min)
{
    static const int64_t least[] = {[O_RANKS] = 1, [O_STEPS] = 1, [O_TIMEOUT] = 0, [O_STOP_RANK] = 0,
                                    [O_STOP_STEP] = 1, [O_MISMATCH_RANK] = 0};
    int64_t *field[] = {[O_RANKS] = &a->ranks, [O_STEPS] = &a->steps, [O_TIMEOUT] = &a->timeout_ms,
                        [O_STOP_RANK] = &a->stop_rank, [O_STOP_STEP] = &a->stop_step,
                        [O_MISMATCH_RANK] = &a->mismatch_rank};
    *min = least[id];
    return field[id];
}

/* Takes one option or operand (opts[id] is option id). -1 to go on, else
 * the exit status (0 after --help or --version, 2 after an error). */
static int take_arg(args *a, const mf_opts *p, const mf_opt *opts, int id, const char *v)
{
    bool ok = true;
    switch (id) {
    case O_HELP: usage(stdout); return 0;
    case O_VERSION: printf("mfsdp-replay %s\n", mfsdp_version()); return 0;
    case O_SYNC: a->sync = true; return -1;
    case O_QUIET: a->quiet = true; return -1;
    case O_BACKEND:
        a->backend = v;
        ok = !strcmp(v, "local") || !strcmp(v, "mpi") || !strcmp(v, "cuda-local") || !strcmp(v, "nccl");
        break;
    case MF_OPTS_NO_VALUE:
        fprintf(stderr, "mfsdp-replay: error: option %s needs a value\n", p->arg);
        return 2;
    case MF_OPTS_UNKNOWN:
        fprintf(stderr, "mfsdp-replay: error: unknown option %s (see --help)\n", p->arg);
        return 2;
    case MF_OPTS_OPERAND:
        if (a->path) {
            fprintf(stderr, "mfsdp-replay: error: more than one schedule given ('%s')\n", v);
            return 2;
        }
        a->path = v;
        return -1;
    default: {
        int64_t min, *field = int_option(a, id, &min);
        ok = parse_int(v, min, field);
    }
    }
    if (!ok) {
        fprintf(stderr, "mfsdp-replay: error: invalid value '%s' for %s\n", v, opts[id].name);
        return 2;
    }
    return -1;
}

static int parse_args(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    a->backend = "local";
    a->ranks = -1;
    a->steps = 2;
    a->timeout_ms = 60000;
    a->stop_rank = a->stop_step = a->mismatch_rank = -1;
    static const mf_opt opts[] = {
        {"--help", "-h", NULL, O_HELP},          {"--version", NULL, NULL, O_VERSION},
        {"--sync", NULL, NULL, O_SYNC},          {"--quiet", NULL, NULL, O_QUIET},
        {"--backend", NULL, "a value", O_BACKEND}, {"--ranks", NULL, "a value", O_RANKS},
        {"--steps", NULL, "a value", O_STEPS},   {"--timeout-ms", NULL, "a value", O_TIMEOUT},
        {"--stop-rank", NULL, "a value", O_STOP_RANK}, {"--stop-step", NULL, "a value", O_STOP_STEP},
        {"--mismatch-rank", NULL, "a value", O_MISMATCH_RANK}};
    mf_opts p;
    mf_opts_init(&p, "mfsdp-replay", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), NULL);
    p.quiet = true; /* worded by take_arg */
    int id, rc = -1;
    const char *v;
    while (rc < 0 && (id = mf_opts_next(&p, &v)) != MF_OPTS_END)
        rc = take_arg(a, &p, opts, id, v);
    if (rc >= 0)
        return rc;
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

/* --ranks, where given, must be the mesh's rank count. */
static bool ranks_match(const args *a, int64_t world)
{
    if (a->ranks >= 0 && a->ranks != world) {
        fprintf(stderr, "mfsdp-replay: error: --ranks %lld does not match the mesh of %s (%lld ranks)\n",
                (long long)a->ranks, a->path, (long long)world);
        return false;
    }
    return true;
}

static int run_local(const args *a, mfsdp_schedule *sh)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (!ranks_match(a, world))
        return 2;
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
        /* the most over the ranks: a ragged whole bucket's ranks allocate
           their own persistent ranges (core/mf_persist.h), the peak rank
           exactly the schedule's peak */
        int64_t most = 0;
        for (int64_t r = 0; r < world; r++)
            most = outs[r].allocated_bytes > most ? outs[r].allocated_bytes : most;
        printf("memory: allocated %lld bytes per rank (one arena), the schedule's peak %lld bytes\n",
               (long long)most, (long long)mfsdp_schedule_peak_bytes(sh));
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

static const void *one_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes, bool failing)
{
    one_xchg *x = ctx;
    (void)rank;
    (void)failing;
    if (bytes > x->cap)
        return NULL;
    memcpy(x->buf, mine, bytes);
    return x->buf;
}

/* --backend nccl without mpirun: a 1-rank mesh on this process's GPU. */
static int run_nccl(const args *a, mfsdp_schedule *sh)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (!ranks_match(a, world))
        return 2;
    if (world != 1) {
#ifdef MFSDP_HAVE_MPI
        fprintf(stderr,
                "mfsdp-replay: error: the mesh of %s has %lld ranks: --backend nccl runs one process per "
                "rank, under mpirun -np %lld (or replay it on one GPU with --backend cuda-local)\n",
                a->path, (long long)world, (long long)world);
#else
        fprintf(stderr,
                "mfsdp-replay: error: the mesh of %s has %lld ranks but this build has no MPI (MPI was not "
                "found): --backend nccl runs a mesh of several ranks as one process per rank under "
                "mpirun; replay it on one GPU with --backend cuda-local\n",
                a->path, (long long)world);
#endif
        return 2;
    }
    one_xchg x = {.cap = mf_check_xchg_bytes(sh)};
    x.buf = malloc(x.cap ? x.cap : 1);
    if (!x.buf) {
        fprintf(stderr, "mfsdp-replay: error: out of memory\n");
        return 2;
    }
    mf_check_xchg xc = {one_allgather, NULL, &x};
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
/*
 * The tool's own exchanges over MPI (the oracle's, and the start-up and
 * final agreements): point to point on MPI_COMM_WORLD with tags of the
 * tool's own (the runtime works on duplicates), polled under the runtime's
 * timeout like its collectives, so a dead or stopped peer ends the wait
 * instead of hanging it: a live peer arrives within the timeout (a runtime
 * wait of its own ends by then) and FAILING_GRACE_MS. A rank that gives up
 * names the peers that never arrived and tells every peer (XCHG_QUIT), so
 * they give up at once with the same names instead of waiting out their own
 * deadline. When this rank's runtime already failed in the step, every live
 * peer's is failing too (the runtime's error channel): it waits only
 * FAILING_GRACE_MS for them. Either way a survivor exits within the timeout
 * and about a second of the fault.
 */
enum { XCHG_DATA = 7301, XCHG_QUIT = 7302, FAILING_GRACE_MS = 1000, QUIT_SEND_MS = 200,
       FINALIZE_SLACK_S = 5 };

typedef struct mpi_xchg {
    int rank, world;
    int64_t timeout_ms;     /* 0: wait for ever (like the runtime) */
    uint8_t *buf;           /* world * cap bytes: the oracle's exchanges */
    size_t cap;
    MPI_Request *reqs;      /* per exchange: world receives, then world sends */
    int *done;              /* MPI_Testsome's indices (2 * world) */
    MPI_Request quit_req;   /* a peer's XCHG_QUIT, posted once */
    int quit_msg;           /* ... the first rank it found missing */
    int quit_out;           /* the XCHG_QUIT this rank sends (MPI reads it later) */
    bool broken;            /* an exchange failed: the tool's ranks are apart for good */
    char why[256];
} mpi_xchg;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool xchg_open(mpi_xchg *x, int rank, int world, int64_t timeout_ms)
{
    memset(x, 0, sizeof *x);
    x->rank = rank;
    x->world = world;
    x->timeout_ms = timeout_ms;
    x->reqs = malloc(2 * (size_t)world * sizeof *x->reqs);
    x->done = malloc(2 * (size_t)world * sizeof *x->done);
    if (!x->reqs || !x->done)
        return false;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return MPI_Irecv(&x->quit_msg, 1, MPI_INT, MPI_ANY_SOURCE, XCHG_QUIT, MPI_COMM_WORLD,
                     &x->quit_req) == MPI_SUCCESS;
}

/* Names the peers this exchange still waits for: those whose part never
 * came, or when every part came, those that never took this rank's (they
 * died or stopped inside the exchange). Returns the first; writes the list. */
static int xchg_missing(const mpi_xchg *x, char *names, size_t cap, int *count)
{
    int first = -1, n = 0, len = 0;
    names[0] = '\0';
    for (int pass = 0; pass < 2 && n == 0; pass++)
        for (int q = 0; q < x->world; q++) {
            if (q == x->rank || x->reqs[pass * x->world + q] == MPI_REQUEST_NULL)
                continue;
            if (first < 0)
                first = q;
            if (len < (int)cap - 16)
                len += snprintf(names + len, cap - (size_t)len, "%s%d", n ? ", " : "", q);
            n++;
        }
    *count = n;
    return first;
}

/* Gives up this exchange: names the peers it waits for and tells every peer
 * (fire and forget: small messages go eagerly; a stopped one reads it when
 * it goes on). */
static void xchg_give_up(mpi_xchg *x, int64_t waited_ms)
{
    char names[128];
    int n, first = xchg_missing(x, names, sizeof names, &n);
    snprintf(x->why, sizeof x->why,
             "rank %d: %s %s did not reach the check's exchange within %lld ms (dead or stopped)",
             x->rank, n == 1 ? "rank" : "ranks", names, (long long)waited_ms);
    /* The exchange's requests stay pending (MPI cannot cancel a send); the
     * process ends soon. The notes to the peers are progressed for
     * QUIT_SEND_MS before it does (a dead peer's never completes). */
    x->quit_out = first;
    MPI_Request *quits = x->reqs + x->world;   /* reused: the pending sends are not polled again */
    for (int q = 0; q < x->world; q++)
        if (q == x->rank || MPI_Isend(&x->quit_out, 1, MPI_INT, q, XCHG_QUIT, MPI_COMM_WORLD,
                                      &quits[q]) != MPI_SUCCESS)
            quits[q] = MPI_REQUEST_NULL;
    int64_t until = now_ms() + QUIT_SEND_MS;
    int done = 0;
    while (!done && now_ms() < until) {
        if (MPI_Testall(x->world, quits, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    x->broken = true;
}

/* All-gather of `bytes` from every rank into all (world * bytes), bounded by
 * the timeout (FAILING_GRACE_MS when failing). False once any exchange
 * failed; then x->why says why. */
static bool xchg_allgather(mpi_xchg *x, const void *mine, size_t bytes, void *all, bool failing)
{
    if (x->broken)
        return false;
    if (bytes > (size_t)0x7fffffff) {
        snprintf(x->why, sizeof x->why, "rank %d: an exchange of %zu bytes is too large", x->rank, bytes);
        x->broken = true;
        return false;
    }
    int n = x->world;
    MPI_Request *recvs = x->reqs, *sends = x->reqs + n;
    memcpy((uint8_t *)all + (size_t)x->rank * bytes, mine, bytes);
    for (int q = 0; q < n; q++) {
        recvs[q] = sends[q] = MPI_REQUEST_NULL;
        if (q == x->rank)
            continue;
        if (MPI_Irecv((uint8_t *)all + (size_t)q * bytes, (int)bytes, MPI_BYTE, q, XCHG_DATA,
                      MPI_COMM_WORLD, &recvs[q]) != MPI_SUCCESS ||
            MPI_Isend(mine, (int)bytes, MPI_BYTE, q, XCHG_DATA, MPI_COMM_WORLD, &sends[q]) != MPI_SUCCESS) {
            snprintf(x->why, sizeof x->why, "rank %d: MPI refused the check's exchange with rank %d",
                     x->rank, q);
            x->broken = true;
            return false;
        }
    }
    /* A live peer may be in a runtime wait that ends only at the timeout:
     * it arrives within the timeout and the grace. */
    int64_t start = now_ms(), limit = x->timeout_ms ? x->timeout_ms + FAILING_GRACE_MS : 0;
    if (failing && limit > FAILING_GRACE_MS)
        limit = FAILING_GRACE_MS;
    long nap_us = 10;
    for (;;) {
        int done = 0, quit = 0;
        MPI_Status st;
        /* Testsome, not Testall: it frees what completed (MPI_REQUEST_NULL
         * then marks an arrived peer). */
        if (MPI_Testsome(2 * n, x->reqs, &done, x->done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
            snprintf(x->why, sizeof x->why, "rank %d: the check's exchange failed in MPI", x->rank);
            x->broken = true;
            return false;
        }
        if (done == MPI_UNDEFINED)
            return true;   /* no active request left: every part came and went */
        if (MPI_Test(&x->quit_req, &quit, &st) == MPI_SUCCESS && quit) {
            /* This rank's own view names the missing (a quitter's first may
             * be a live peer it could not tell from a dead one). */
            char names[128];
            int count;
            xchg_missing(x, names, sizeof names, &count);
            snprintf(x->why, sizeof x->why,
                     "rank %d: %s %s did not reach the check's exchange (rank %d gave up waiting, "
                     "for rank %d first)",
                     x->rank, count == 1 ? "rank" : "ranks", names, st.MPI_SOURCE, x->quit_msg);
            x->broken = true;
            return false;
        }
        int64_t waited = now_ms() - start;
        if (limit > 0 && waited > limit) {
            xchg_give_up(x, waited);
            return false;
        }
        struct timespec ts = {0, nap_us * 1000};
        nanosleep(&ts, NULL);
        if (nap_us < 1000)
            nap_us *= 2;
    }
}

static const void *mpi_allgather(void *ctx, int64_t rank, const void *mine, size_t bytes, bool failing)
{
    mpi_xchg *x = ctx;
    (void)rank;
    if (bytes > x->cap)
        return NULL;
    return xchg_allgather(x, mine, bytes, x->buf, failing) ? x->buf : NULL;
}

static const char *mpi_why(void *ctx)
{
    mpi_xchg *x = ctx;
    return x->why[0] ? x->why : NULL;
}

/* Every rank's flag, minimum over ranks (a bounded MPI_Allreduce(MIN)). */
static bool xchg_all(mpi_xchg *x, int flag, int *all_flag)
{
    int *flags = malloc((size_t)x->world * sizeof *flags);
    bool ok = flags && xchg_allgather(x, &flag, sizeof flag, flags, false);
    *all_flag = ok;
    for (int q = 0; ok && q < x->world; q++)
        if (flags[q] < *all_flag)
            *all_flag = flags[q];
    free(flags);
    return ok;
}

/* How many ranks share this rank's machine (by processor name), and this
 * rank's index among them. */
static bool xchg_node_ranks(mpi_xchg *x, int *node_ranks, int *local_rank)
{
    char mine[MPI_MAX_PROCESSOR_NAME + 1] = "";
    int len = 0;
    MPI_Get_processor_name(mine, &len);
    char *names = malloc((size_t)x->world * sizeof mine);
    bool ok = names && xchg_allgather(x, mine, sizeof mine, names, false);
    *node_ranks = *local_rank = 0;
    for (int q = 0; ok && q < x->world; q++)
        if (strcmp(names + (size_t)q * sizeof mine, mine) == 0) {
            *local_rank += q < x->rank;
            (*node_ranks)++;
        }
    free(names);
    return ok;
}

/* A rank the tool cannot reach any more ends here: its peers cannot meet in
 * MPI_Finalize (it would wait for the dead one), so no finalize. */
static void mpi_apart(const mpi_xchg *x)
{
    if (x->rank == 0)
        printf("FAILED: %s\n", x->why);
    fprintf(stderr, "mfsdp-replay: error: %s\n", x->why);
    fflush(stdout);
    fflush(stderr);
    _exit(1);
}

static void xchg_close(mpi_xchg *x)
{
    free(x->buf);
    free(x->reqs);
    free(x->done);
    x->buf = NULL;
    x->reqs = NULL;
    x->done = NULL;
}

/* What --backend mpi and nccl (under mpirun) do first on every rank: the
 * world must be the mesh's, then the check's exchange opens, the replay must
 * fit on this machine and the exchange's buffer is allocated, agreed by every
 * rank. -1 to go on (x open, *local_rank: this rank's index among the ranks
 * of its machine), else the exit status (the same on every rank). */
static int mpi_start(const args *a, mfsdp_schedule *sh, int rank, int size, mpi_xchg *x, int *local_rank)
{
    int64_t world = mfsdp_schedule_world_size(sh);
    if (a->ranks >= 0 && a->ranks != world) {
        if (rank == 0)
            fprintf(stderr, "mfsdp-replay: error: --ranks %lld does not match the mesh of %s (%lld ranks)\n",
                    (long long)a->ranks, a->path, (long long)world);
        return 2;
    }
    if (size != world) {
        if (rank == 0)
            fprintf(stderr,
                    "mfsdp-replay: error: the MPI world has %d processes but the mesh of %s needs "
                    "%lld (run mpirun -np %lld)\n",
                    size, a->path, (long long)world, (long long)world);
        return 2;
    }
    int node_ranks = 1, all_fit = 0, all_ok = 0;
    if (!xchg_open(x, rank, size, a->timeout_ms)) {
        fprintf(stderr, "mfsdp-replay: error: rank %d: cannot start the check's exchange\n", rank);
        _exit(2);
    }
    if (!xchg_node_ranks(x, &node_ranks, local_rank) ||
        !xchg_all(x, rank == 0 ? fits(sh, a->path, node_ranks) : 1, &all_fit))
        mpi_apart(x);
    if (!all_fit) {
        xchg_close(x);
        return 2;
    }
    if (rank == a->mismatch_rank)
        perturb(sh);
    x->cap = mf_check_xchg_bytes(sh);
    x->buf = malloc(x->cap * (size_t)size);
    if (!xchg_all(x, x->buf != NULL, &all_ok))
        mpi_apart(x);
    if (!all_ok) {
        xchg_close(x);
        if (rank == 0)
            fprintf(stderr, "mfsdp-replay: error: out of memory\n");
        return 2;
    }
    return -1;
}

/* Runs the oracle on this rank with cfg (rank 0 reports) and ends with the
 * final agreement, so that no rank finalizes while a peer still exchanges.
 * The exit status: 0 only when every rank verified every step. */
static int mpi_check(const args *a, const mfsdp_schedule *sh, mpi_xchg *x, const mfsdp_config *cfg,
                     const char *backend)
{
    mf_check_xchg xc = {mpi_allgather, mpi_why, x};
    mf_check_opts o = {.steps = a->steps, .stop_rank = a->stop_rank, .stop_step = a->stop_step,
                       .out = a->quiet || x->rank != 0 ? NULL : stdout};
    if (!a->quiet && x->rank == 0)
        describe(sh, a->path, backend, stdout);
    mf_check_outcome out;
    int rc = mf_check_rank(sh, cfg, &xc, &o, &out);
    if (x->broken)
        mpi_apart(x);
    if (out.own[0])
        fprintf(stderr, "%s\n", out.own);
    /* rc is 0 only when every rank's report of the last step said so. */
    if (x->rank == 0) {
        if (rc == 0)
            printf("verified: %d %s, %lld steps\n", x->world, x->world == 1 ? "rank" : "ranks",
                   (long long)a->steps);
        else
            printf("FAILED: %s\n", out.msg[0] ? out.msg : out.own);
        fflush(stdout);
    }
    int all_done = 0;
    if (!xchg_all(x, 1, &all_done))
        mpi_apart(x);
    xchg_close(x);
    return rc == 0 ? 0 : 1;
}

static int run_mpi(const args *a, mfsdp_schedule *sh, int rank, int size)
{
    mpi_xchg x;
    int local_rank = 0, rc = mpi_start(a, sh, rank, size, &x, &local_rank);
    if (rc >= 0)
        return rc;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    MPI_Comm world_comm = MPI_COMM_WORLD;
    cfg.backend = MFSDP_BACKEND_MPI;
    cfg.mpi_comm = &world_comm;
    cfg.rank = rank;
    cfg.timeout_ms = a->timeout_ms;
    cfg.flags = a->sync ? MFSDP_FLAG_SYNCHRONOUS : 0;
    return mpi_check(a, sh, &x, &cfg, "mpi");
}

#ifdef MFSDP_HAVE_CUDA
enum { START_WHY = 256 };

/* Every rank's start-up problem (mine: "" when none) gathered: true when no
 * rank has one; else rank 0 prints FAILED with the first (its rank named in
 * it) and every rank returns false. */
static bool xchg_agree(mpi_xchg *x, const char *mine)
{
    char own[START_WHY];
    snprintf(own, sizeof own, "%s", mine);
    char *all = malloc((size_t)x->world * START_WHY);
    if (!all) {
        snprintf(x->why, sizeof x->why, "rank %d: out of memory", x->rank);
        mpi_apart(x);
    }
    if (!xchg_allgather(x, own, START_WHY, all, false)) {
        free(all);
        mpi_apart(x);
    }
    int first = -1, bad = 0;
    for (int q = 0; q < x->world; q++)
        if (all[(size_t)q * START_WHY]) {
            first = first < 0 ? q : first;
            bad++;
        }
    if (first >= 0 && x->rank == 0) {
        printf("FAILED: %s", all + (size_t)first * START_WHY);
        if (bad > 1)
            printf(" (and %d more %s)", bad - 1, bad == 2 ? "rank" : "ranks");
        printf("\n");
        fflush(stdout);
    }
    free(all);
    return first < 0;
}

/* Selects this rank's GPU: its local rank (OMPI_COMM_WORLD_LOCAL_RANK, else
 * its index among the ranks of its machine) modulo the devices this process
 * sees. Returns the device, or -1 with the problem in why. */
static int pick_device(int rank, int local_rank, char *why, size_t cap)
{
    int64_t env_rank;
    const char *env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (env && parse_int(env, 0, &env_rank) && env_rank <= 0x7fffffff)
        local_rank = (int)env_rank;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1) {
        snprintf(why, cap, "rank %d: no usable CUDA device (cudaGetDeviceCount: %s)", rank,
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return -1;
    }
    int dev = local_rank % ndev;
    if ((e = cudaSetDevice(dev)) != cudaSuccess) {
        snprintf(why, cap, "rank %d: cudaSetDevice(%d) failed (local rank %d of %d devices): %s", rank, dev,
                 local_rank, ndev, cudaGetErrorString(e));
        return -1;
    }
    return dev;
}

/* --backend nccl under mpirun: one process per rank and one GPU each, the
 * NCCL world made from rank 0's unique id (MPI_Bcast), as a trainer does. */
static int run_nccl_mpi(const args *a, mfsdp_schedule *sh, int rank, int size)
{
    mpi_xchg x;
    int local_rank = 0, rc = mpi_start(a, sh, rank, size, &x, &local_rank);
    if (rc >= 0)
        return rc;
    char why[START_WHY] = "";
    int dev = pick_device(rank, local_rank, why, sizeof why);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r;
    if (rank == 0 && dev >= 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess)
        snprintf(why, sizeof why, "rank 0: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    if (why[0])
        fprintf(stderr, "mfsdp-replay: error: %s\n", why);
    if (!xchg_agree(&x, why)) {
        xchg_close(&x);
        return 1;
    }
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        snprintf(x.why, sizeof x.why, "rank %d: MPI_Bcast of the NCCL unique id failed", rank);
        mpi_apart(&x);
    }
    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    nc.unique_id = id;
    nc.has_unique_id = 1;
    nc.device = dev;
    nc.flags |= MFSDP_NCCL_HOST_COMPUTE;   /* the oracle reads the buffers on the host */
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    mfsdp_config_set_nccl(&cfg, &nc);
    cfg.rank = rank;
    cfg.timeout_ms = a->timeout_ms;
    return mpi_check(a, sh, &x, &cfg, "nccl");
}
#endif

/* MPI_Finalize waits for every peer; one that died after the last exchange
 * would hold it for ever: bounded by the timeout and FINALIZE_SLACK_S (a
 * slow but live finalize must not turn a verified run into a failure). */
static volatile sig_atomic_t finalize_rc;

static void finalize_expired(int sig)
{
    (void)sig;
    static const char msg[] = "mfsdp-replay: error: MPI_Finalize did not return within the timeout "
                              "(a peer died after the last exchange)\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(1);
    _exit(finalize_rc ? finalize_rc : 1);
}

static void finalize_bounded(int rc, int64_t timeout_ms)
{
    finalize_rc = rc;
    if (timeout_ms > 0) {
        signal(SIGALRM, finalize_expired);
        alarm((unsigned)((timeout_ms + 999) / 1000 + FINALIZE_SLACK_S));
    }
    MPI_Finalize();
    alarm(0);
}
#endif

/* Whether an MPI launcher (mpirun, mpiexec, srun) started this process;
 * *procs: how many processes it started (0: not said). */
static bool launched_by_mpi(int64_t *procs)
{
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
    *procs = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        const char *v = getenv(sizes[k]);
        if (v && parse_int(v, 1, procs))
            return true;
    }
    return getenv("PMIX_RANK") != NULL;
}

#ifdef MFSDP_HAVE_MPI
/* MPI_Init with this rank and the world's size; -1 to go on, else the exit
 * status. The mpi backend needs MPI_THREAD_MULTIPLE (its stream threads call
 * MPI); nccl uses MPI on the main thread only. */
static int mpi_init(int *argc, char ***argv, bool need_multiple, int *rank, int *size)
{
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    if (need_multiple && provided < MPI_THREAD_MULTIPLE) {
        if (*rank == 0)
            fprintf(stderr, "mfsdp-replay: error: this MPI does not provide MPI_THREAD_MULTIPLE\n");
        MPI_Finalize();
        return 2;
    }
    return -1;
}
#endif

/* Runs the replay on the backend asked for; the exit status. */
static int run_backend(const args *a, mfsdp_schedule *sh, bool mpi, int rank, int size)
{
#ifdef MFSDP_HAVE_MPI
    if (mpi && !strcmp(a->backend, "mpi"))
        return run_mpi(a, sh, rank, size);
#ifdef MFSDP_HAVE_CUDA
    if (mpi)
        return run_nccl_mpi(a, sh, rank, size);
#endif
#endif
    (void)mpi;
    (void)rank;
    (void)size;
    return !strcmp(a->backend, "nccl") ? run_nccl(a, sh) : run_local(a, sh);
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    bool nccl = !strcmp(a.backend, "nccl"), gpu = nccl || !strcmp(a.backend, "cuda-local");
    if (gpu && !mfsdp_backend_available(MFSDP_BACKEND_CUDA_LOCAL)) {
        fprintf(stderr, "mfsdp-replay: error: this build has no CUDA backend (CUDA or NCCL was not found)\n");
        return 2;
    }
    /* nccl runs one process per rank under an MPI launcher, alone otherwise. */
    int64_t procs = 0;
    bool mpi = !strcmp(a.backend, "mpi") || (nccl && launched_by_mpi(&procs));
    int rank = 0, size = 1;
#ifdef MFSDP_HAVE_MPI
    if (mpi && (rc = mpi_init(&argc, &argv, !nccl, &rank, &size)) >= 0)
        return rc;
#else
    if (mpi && (!nccl || procs != 1)) {
        fprintf(stderr, nccl ? "mfsdp-replay: error: this build has no MPI (MPI was not found): --backend "
                               "nccl cannot run one process per rank under mpirun\n"
                             : "mfsdp-replay: error: this build has no MPI backend (MPI was not found)\n");
        return 2;
    }
    mpi = false;   /* a world of one process: the 1-rank path */
#endif
    mfsdp_schedule *sh = NULL;
    if (mfsdp_schedule_load(a.path, &sh) != MFSDP_OK) {
        if (!mpi || rank == 0)
            fprintf(stderr, "mfsdp-replay: error: %s\n", mfsdp_last_error(NULL));
        rc = 2;
    } else {
        rc = run_backend(&a, sh, mpi, rank, size);
    }
    mfsdp_schedule_free(sh);
#ifdef MFSDP_HAVE_MPI
    if (mpi)
        finalize_bounded(rc, a.timeout_ms);
#endif
    fflush(stdout);
    return rc;
}

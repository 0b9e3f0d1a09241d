/*
 * mfsdp-ckpt-bench: checkpoint save / load / reshard on the local backend
 * (bench/ckpt/run.sh prints it next to dd on the same filesystem).
 *
 *   mfsdp-ckpt-bench SCHEDULE RESHARD_SCHEDULE DIR [REPEATS [CUT_SCHEDULE]]
 *
 * Saves every rank's main_weight and two Adam states of SCHEDULE into
 * DIR/a (timed from the moment every rank is ready until the last rank's
 * call returns, after the commit), loads it back on the same schedule
 * (timed) warm (the files in the page cache, as the save left them) and cold
 * (after posix_fadvise(POSIX_FADV_DONTNEED) on every data file: read from
 * the disk), then loads it on RESHARD_SCHEDULE (warm, timed) and, when
 * given, on CUT_SCHEDULE warm and cold: a layout whose ranges cut the saved
 * pieces, so that most are read in part by several ranks and their CRCs
 * are combined across ranks (docs/checkpoint.md). Each load is
 * repeated REPEATS times (default 5) and the median printed. Then the
 * reference read, warm and cold the same way: one thread reads the data
 * files front to back (read(2), 1 MiB requests, as dd bs=1M does) into one
 * buffer as large as the files, touched beforehand as the runtimes'
 * buffers are: the same bytes, filesystem and page-cache state as the
 * load, landing in distinct memory as a load's do (dd's 1 MiB buffer is
 * reused and stays in the CPU's cache: not the same work when warm). Prints
 * bandwidths (unique bytes / time: the bytes a load reads from disk, as
 * dd's file holds), bytes written vs unique bytes, the busiest writer vs the
 * mean, bytes read (the ranks' mfsdp_ckpt_load_options.bytes_read) vs unique
 * and vs held, and how much a save or load raised the process's peak
 * resident memory above what the runtimes and states already held (the
 * checkpoint code's own footprint). bench/ckpt/run.sh measures dd the same
 * ways. Not a test: no assertion on speed.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mfsdp.h"
#include "mfsdp_ckpt.h"

static long g_hwm_before, g_hwm_growth; /* kB: peak before an op, the most any op added */

typedef struct job {
    const mfsdp_schedule *sh;
    mfsdp_local_group *g;
    int64_t rank;
    int op;                 /* 0 save, 1 load */
    const char *dir;
    pthread_barrier_t *bar;
    double *t0;
    double t1;              /* when this rank's call returned */
    int failed;
    int64_t shard_bytes;    /* main_weight + states this rank holds */
    uint64_t bytes_read;    /* mfsdp_ckpt_load_options.bytes_read */
} job;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_hwm_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static void *rank_main(void *arg)
{
    job *j = arg;
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.local_group = j->g;
    cfg.rank = j->rank;
    mfsdp_runtime *rt = NULL;
    j->failed = 1;
    if (mfsdp_create(j->sh, &cfg, &rt) != MFSDP_OK) {
        fprintf(stderr, "create: %s\n", mfsdp_last_error(NULL));
        for (int b = 0; b < 3; b++) /* the barriers the other ranks pass */
            pthread_barrier_wait(j->bar);
        return NULL;
    }
    int nt = mfsdp_num_tensors(rt);
    void **m = calloc((size_t)nt, sizeof *m), **v = calloc((size_t)nt, sizeof *v);
    for (int k = 0; k < nt; k++) {
        mfsdp_tensor_view x;
        mfsdp_tensor_view_get(rt, k, &x);
        m[k] = calloc((size_t)x.shard_count + 1, 4);
        v[k] = calloc((size_t)x.shard_count + 1, 4);
        for (int64_t i = 0; i < x.shard_count; i++)
            ((float *)x.main_weight)[i] = ((float *)m[k])[i] = ((float *)v[k])[i] = (float)(x.shard_offset + i) * 1e-3f;
        j->shard_bytes += 12 * x.shard_count;
    }
    mfsdp_ckpt_state st[2] = {{"exp_avg", MFSDP_FP32, m}, {"exp_avg_sq", MFSDP_FP32, v}};
    int64_t blob = j->rank;
    pthread_barrier_wait(j->bar);
    if (j->rank == 0) {
        *j->t0 = now();
        g_hwm_before = rss_hwm_kb(); /* every rank's buffers are allocated and touched */
    }
    pthread_barrier_wait(j->bar);
    mfsdp_result r;
    if (j->op == 0) {
        mfsdp_ckpt_save_options so = MFSDP_CKPT_SAVE_OPTIONS_INIT;
        so.step = 1, so.nstates = 2, so.states = st, so.user_blob = &blob, so.user_blob_bytes = sizeof blob;
        r = mfsdp_ckpt_save(rt, j->dir, &so);
    } else {
        mfsdp_ckpt_load_options lo = MFSDP_CKPT_LOAD_OPTIONS_INIT;
        lo.nstates = 2, lo.states = st, lo.user_blob = &blob, lo.user_blob_capacity = sizeof blob;
        r = mfsdp_ckpt_load(rt, j->dir, &lo);
        j->bytes_read = lo.bytes_read;
    }
    j->t1 = now();
    pthread_barrier_wait(j->bar);
    if (j->rank == 0 && rss_hwm_kb() - g_hwm_before > g_hwm_growth)
        g_hwm_growth = rss_hwm_kb() - g_hwm_before;
    if (r != MFSDP_OK)
        fprintf(stderr, "rank %lld: %s\n", (long long)j->rank, mfsdp_last_error(rt));
    j->failed = r != MFSDP_OK;
    mfsdp_destroy(rt);
    for (int k = 0; k < nt; k++) {
        free(m[k]);
        free(v[k]);
    }
    free(m);
    free(v);
    return NULL;
}

/* Runs op on every rank; returns seconds (or -1), the bytes the ranks hold
 * and the bytes they read. */
static double run(const char *path, int op, const char *dir, int64_t *held, uint64_t *read)
{
    mfsdp_schedule *sh;
    if (mfsdp_schedule_load(path, &sh) != MFSDP_OK) {
        fprintf(stderr, "%s\n", mfsdp_last_error(NULL));
        return -1;
    }
    int64_t w = mfsdp_schedule_world_size(sh);
    mfsdp_local_group *g;
    mfsdp_local_group_create(w, &g);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)w);
    job *jobs = calloc((size_t)w, sizeof *jobs);
    pthread_t *th = calloc((size_t)w, sizeof *th);
    double t0 = 0;
    for (int64_t r = 0; r < w; r++) {
        jobs[r] = (job){.sh = sh, .g = g, .rank = r, .op = op, .dir = dir, .bar = &bar, .t0 = &t0};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    int failed = 0;
    double t1 = 0;
    *held = 0;
    *read = 0;
    for (int64_t r = 0; r < w; r++) {
        pthread_join(th[r], NULL);
        failed |= jobs[r].failed;
        *held += jobs[r].shard_bytes;
        *read += jobs[r].bytes_read;
        t1 = jobs[r].t1 > t1 ? jobs[r].t1 : t1;
    }
    double t = t1 - t0;
    pthread_barrier_destroy(&bar);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
    free(jobs);
    free(th);
    return failed ? -1 : t;
}

/* Sizes of the data files: total, largest, count. */
static void files(const char *dir, double *total, double *largest, int *n)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[4400];
    *total = *largest = 0;
    *n = 0;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".safetensors")) {
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            stat(p, &st);
            *total += (double)st.st_size;
            *largest = (double)st.st_size > *largest ? (double)st.st_size : *largest;
            (*n)++;
        }
    if (d)
        closedir(d);
}

/* Drops the page cache of every file in dir (they were fsync'd: clean). */
static void drop_cache(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[4400];
    while (d && (de = readdir(d))) {
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        int fd = open(p, O_RDONLY);
        if (fd >= 0) {
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    if (d)
        closedir(d);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds for one reference read of dir's data files into buf (cold:
 * cache dropped first), or -1. */
static double ref_read_once(const char *dir, char *buf, size_t cap, int cold)
{
    if (cold)
        drop_cache(dir);
    double t0 = now();
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[4400];
    size_t at = 0;
    int bad = !d;
    while (!bad && (de = readdir(d)))
        if (strstr(de->d_name, ".safetensors")) {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            int fd = open(p, O_RDONLY);
            ssize_t k = fd < 0 ? -1 : 1;
            while (fd >= 0 && k > 0 && at < cap) {
                k = read(fd, buf + at, cap - at < (1u << 20) ? cap - at : (1u << 20));
                at += k > 0 ? (size_t)k : 0;
            }
            bad = fd < 0 || k < 0;
            if (fd >= 0)
                close(fd);
        }
    if (d)
        closedir(d);
    return bad ? -1 : now() - t0;
}

/* The median of `reps` reference reads (ref_read_once), or -1. */
static double ref_read(const char *dir, int reps, int cold, double bytes)
{
    double t[64];
    char *buf = malloc((size_t)bytes);
    if (!buf)
        return -1;
    memset(buf, 1, (size_t)bytes);
    for (int i = 0; i < reps; i++)
        if ((t[i] = ref_read_once(dir, buf, (size_t)bytes, cold)) < 0) {
            free(buf);
            return -1;
        }
    free(buf);
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    return t[reps / 2];
}

/* The median of `reps` loads of dir on schedule path (cold: cache dropped
 * before each); -1 when one failed. */
static double median_load(const char *path, const char *dir, int reps, int cold, int64_t *held, uint64_t *read)
{
    double t[64];
    for (int i = 0; i < reps; i++) {
        if (cold)
            drop_cache(dir);
        if ((t[i] = run(path, 1, dir, held, read)) < 0)
            return -1;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: mfsdp-ckpt-bench SCHEDULE RESHARD_SCHEDULE DIR [REPEATS [CUT_SCHEDULE]]\n");
        return 2;
    }
    int reps = argc >= 5 ? atoi(argv[4]) : 5;
    const char *cut = argc == 6 ? argv[5] : NULL;
    if (reps < 1 || reps > 64) {
        fprintf(stderr, "mfsdp-ckpt-bench: REPEATS must be 1..64\n");
        return 2;
    }
    char a[4096];
    snprintf(a, sizeof a, "%s/a", argv[3]);
    int64_t held = 0, held2 = 0;
    uint64_t rd = 0, rd2 = 0;
    double ts = run(argv[1], 0, a, &held, &rd);
    double tl = median_load(argv[1], a, reps, 0, &held, &rd);
    double tc = median_load(argv[1], a, reps, 1, &held, &rd);
    double tr = median_load(argv[2], a, reps, 0, &held2, &rd2);
    int64_t held3 = 0;
    uint64_t rd3 = 0;
    double tw3 = cut ? median_load(cut, a, reps, 0, &held3, &rd3) : 0;
    double tc3 = cut ? median_load(cut, a, reps, 1, &held3, &rd3) : 0;
    long peak = rss_hwm_kb();
    if (ts < 0 || tl < 0 || tc < 0 || tr < 0 || tw3 < 0 || tc3 < 0)
        return 1;
    /* unique bytes: every tensor element x 3 states x 4 bytes */
    mfsdp_schedule *sh;
    mfsdp_schedule_load(argv[1], &sh);
    double unique = 0;
    for (int k = 0; k < mfsdp_schedule_num_tensors(sh); k++) {
        mfsdp_tensor_info ti;
        mfsdp_schedule_tensor_info(sh, k, &ti);
        unique += 12.0 * (double)ti.numel;
    }
    int64_t world = mfsdp_schedule_world_size(sh);
    mfsdp_schedule_free(sh);
    double total, largest;
    int n;
    files(a, &total, &largest, &n);
    double mib = 1024.0 * 1024.0;
    double rw = ref_read(a, reps, 0, total), rc = ref_read(a, reps, 1, total);
    if (rw < 0 || rc < 0)
        return 1;
    printf("ckpt_unique_bytes=%.0f\nckpt_written_bytes=%.0f\nckpt_written_over_unique=%.4f\n", unique, total,
           total / unique);
    printf("ckpt_files=%d\nckpt_busiest_writer_over_mean=%.3f\n", n, largest / (total / n));
    printf("ckpt_save_s=%.4f\nckpt_save_MiBps=%.0f\n", ts, unique / ts / mib);
    printf("ckpt_repeats=%d (loads: the median)\n", reps);
    printf("ckpt_load_warm_s=%.4f\nckpt_load_warm_MiBps=%.0f\n", tl, unique / tl / mib);
    printf("ckpt_load_cold_s=%.4f\nckpt_load_cold_MiBps=%.0f\n", tc, unique / tc / mib);
    printf("ckpt_ref_read_warm_s=%.4f\nckpt_ref_read_warm_MiBps=%.0f\n", rw, unique / rw / mib);
    printf("ckpt_ref_read_cold_s=%.4f\nckpt_ref_read_cold_MiBps=%.0f\n", rc, unique / rc / mib);
    printf("ckpt_load_read_bytes=%llu (%.4f x unique; the ranks hold %lld)\n", (unsigned long long)rd,
           (double)rd / unique, (long long)held);
    printf("ckpt_reshard_load_s=%.4f\nckpt_reshard_MiBps=%.0f\nckpt_reshard_read_bytes=%llu (%.4f x unique)\n", tr,
           unique / tr / mib, (unsigned long long)rd2, (double)rd2 / unique);
    if (cut)
        printf("ckpt_cut_load_warm_s=%.4f\nckpt_cut_load_warm_MiBps=%.0f\nckpt_cut_load_cold_s=%.4f\n"
               "ckpt_cut_load_cold_MiBps=%.0f\nckpt_cut_read_bytes=%llu (%.4f x unique)\n", tw3, unique / tw3 / mib, tc3,
               unique / tc3 / mib, (unsigned long long)rd3, (double)rd3 / unique);
    printf("ckpt_world=%lld\nckpt_peak_rss_MiB=%.0f (runtimes' buffers included)\nckpt_op_rss_growth_MiB=%.1f "
           "(the most a save or load added to the peak, all 8 ranks)\n", (long long)world, peak / 1024.0,
           g_hwm_growth / 1024.0);
    (void)held2;
    (void)held3;
    return 0;
}

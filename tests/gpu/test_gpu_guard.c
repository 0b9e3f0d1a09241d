/*
 * The NCCL backend's guards, driven without a device through fakes of the
 * CUDA and NCCL entry points (mf_cuda_calls):
 *   - polling clears the not-ready state CUDA leaves as the thread's last
 *     error, so the next launch check does not fail with "device not ready";
 *     real errors still map (issue: stale cudaErrorNotReady);
 *   - the watchdog's verdicts: an asynchronous error, a collective that does
 *     not complete, a stream fault, an NCCL call that does not return; and its
 *     abort: every communicator once, with the lock, or without it when the
 *     trainer is stuck inside a blocking call;
 *   - a partial registration failure deregisters what it registered;
 *   - a group of collectives: ncclGroupEnd exactly when ncclGroupStart
 *     succeeded (also after a failed member), members in order up to the
 *     first failure, no group for one collective;
 *   - NCCL_LAUNCH_ORDER_IMPLICIT: the decision table, once per process from
 *     many threads;
 *   - a hook whose ops enqueued returns the failure a watchdog recorded
 *     meanwhile (engine, native model);
 *   - mfsdp_create refuses a collective on the compute stream, and the
 *     default communicators are blocking.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mf_cuda.h"
#include "mfsdp_nccl.h"
#include "rt_testlib.h"

/* ---- fakes ---- */

/* CUDA's per-thread last error, as the fakes model it: a query that returns
 * not-ready leaves it behind (as the real runtime does). */
static cudaError_t fake_last;
static const cudaError_t *fake_seq; /* query results, in order; the last repeats */
static int fake_nseq, fake_pos;

static cudaError_t next_query(void)
{
    cudaError_t e = fake_seq[fake_pos < fake_nseq ? fake_pos : fake_nseq - 1];
    fake_pos++;
    if (e != cudaSuccess)
        fake_last = e;
    return e;
}
static cudaError_t fake_event_query(cudaEvent_t ev)
{
    (void)ev;
    return next_query();
}
static cudaError_t fake_stream_query(cudaStream_t st)
{
    (void)st;
    return next_query();
}
static cudaError_t fake_get_last_error(void)
{
    cudaError_t e = fake_last;
    fake_last = cudaSuccess;
    return e;
}

static void use_fake_queries(const cudaError_t *seq, int n)
{
    fake_seq = seq;
    fake_nseq = n;
    fake_pos = 0;
    fake_last = cudaSuccess;
    mf_cuda_calls.event_query = fake_event_query;
    mf_cuda_calls.stream_query = fake_stream_query;
    mf_cuda_calls.get_last_error = fake_get_last_error;
}

/* ---- 1. polling ---- */

static mf_rt fake_rt; /* only rank and nothing else is read by the wait */

static void core_for_wait(mf_cuda_core *c, int64_t timeout_ms)
{
    memset(c, 0, sizeof *c);
    c->rt = &fake_rt;
    c->timeout_ms = timeout_ms;
    for (int st = 0; st < MF_STREAM_COUNT; st++)
        c->stream[st] = (cudaStream_t)(uintptr_t)(0x100 + st);
}

static void test_poll_clears_not_ready(void **state)
{
    (void)state;
    static const cudaError_t seq[] = {cudaErrorNotReady, cudaErrorNotReady, cudaErrorNotReady, cudaSuccess};
    use_fake_queries(seq, 4);
    mf_cuda_core c;
    core_for_wait(&c, 0);
    char err[256] = "";
    assert_int_equal(mf_cuda_core_wait(&c, (cudaEvent_t)(uintptr_t)0x42, "test wait", NULL, NULL, err, sizeof err),
                     MFSDP_OK);
    assert_int_equal(fake_pos, 4);
    /* what the next launch check would read: nothing */
    assert_int_equal(fake_last, cudaSuccess);

    /* every stream: one stream still busy for a while */
    static const cudaError_t seq2[] = {cudaSuccess, cudaErrorNotReady, cudaSuccess, cudaSuccess, cudaSuccess,
                                       cudaSuccess};
    use_fake_queries(seq2, 6);
    assert_int_equal(mf_cuda_core_wait(&c, NULL, "drain", NULL, NULL, err, sizeof err), MFSDP_OK);
    assert_int_equal(fake_last, cudaSuccess);
    mf_cuda_calls_reset();
}

static void test_poll_maps_errors(void **state)
{
    (void)state;
    static const cudaError_t seq[] = {cudaErrorNotReady, cudaErrorLaunchFailure};
    use_fake_queries(seq, 2);
    mf_cuda_core c;
    core_for_wait(&c, 0);
    char err[256] = "";
    assert_int_equal(mf_cuda_core_wait(&c, (cudaEvent_t)(uintptr_t)0x42, "the gather", NULL, NULL, err, sizeof err),
                     MFSDP_ERR_BACKEND);
    assert_non_null(strstr(err, "the gather: cudaErrorLaunchFailure"));
    /* a real error is the caller's to see, not cleared */
    assert_int_equal(fake_last, cudaErrorLaunchFailure);

    static const cudaError_t busy[] = {cudaErrorNotReady};
    use_fake_queries(busy, 1);
    core_for_wait(&c, 30);
    assert_int_equal(mf_cuda_core_wait(&c, (cudaEvent_t)(uintptr_t)0x42, "the gather", NULL, NULL, err, sizeof err),
                     MFSDP_ERR_TIMEOUT);
    assert_non_null(strstr(err, "the gather timed out after"));
    assert_int_equal(fake_last, cudaSuccess);
    mf_cuda_calls_reset();
}

/* ---- 2. the watchdog ---- */

static int aborts[4];
static ncclResult_t async_state[4];
static ncclResult_t fake_async(ncclComm_t comm, ncclResult_t *state)
{
    *state = async_state[(uintptr_t)comm];
    return ncclSuccess;
}
static ncclResult_t fake_abort(ncclComm_t comm)
{
    aborts[(uintptr_t)comm]++;
    return ncclSuccess;
}

typedef struct watch_fixture {
    mf_watch w;
    pthread_mutex_t mu;
    ncclComm_t comms[3];
    const char *names[3];
} watch_fixture;

static void fixture_init(watch_fixture *f, int64_t timeout_ms)
{
    memset(aborts, 0, sizeof aborts);
    memset(async_state, 0, sizeof async_state);
    mf_cuda_calls.comm_async_error = fake_async;
    mf_cuda_calls.comm_abort = fake_abort;
    pthread_mutex_init(&f->mu, NULL);
    assert_int_equal(mf_watch_init(&f->w, NULL, 3, timeout_ms, &f->mu), 0);
    f->w.world = (ncclComm_t)(uintptr_t)3;
    for (int i = 0; i < 2; i++) {
        f->comms[i] = (ncclComm_t)(uintptr_t)(i + 1);
        f->names[i] = i ? "mfsdp-dp-outer" : "mfsdp-fsdp-inner";
    }
    f->w.comms = f->comms;
    f->w.names = f->names;
    f->w.ncomms = 2;
}

static void fixture_done(watch_fixture *f)
{
    mf_watch_destroy(&f->w);
    pthread_mutex_destroy(&f->mu);
    mf_cuda_calls_reset();
}

static void test_watch_async_error(void **state)
{
    (void)state;
    watch_fixture f;
    fixture_init(&f, 1000);
    char err[512] = "";
    assert_int_equal(mf_watch_once(&f.w, mf_base_now_ns(), err, sizeof err), MFSDP_OK);
    async_state[1] = ncclInProgress; /* a nonblocking call still settling: fine */
    assert_int_equal(mf_watch_once(&f.w, mf_base_now_ns(), err, sizeof err), MFSDP_OK);
    async_state[2] = ncclRemoteError;
    assert_int_equal(mf_watch_once(&f.w, mf_base_now_ns(), err, sizeof err), MFSDP_ERR_ABORTED);
    assert_non_null(strstr(err, "rank 3: watchdog: the communicator mfsdp-dp-outer reported an error"));
    async_state[2] = ncclSystemError;
    assert_int_equal(mf_watch_once(&f.w, mf_base_now_ns(), err, sizeof err), MFSDP_ERR_BACKEND);
    /* while the trainer holds the NCCL lock, the asynchronous errors wait */
    pthread_mutex_lock(&f.mu);
    assert_int_equal(mf_watch_once(&f.w, mf_base_now_ns(), err, sizeof err), MFSDP_OK);
    pthread_mutex_unlock(&f.mu);
    fixture_done(&f);
}

static void test_watch_rings(void **state)
{
    (void)state;
    watch_fixture f;
    fixture_init(&f, 1000);
    int64_t now = mf_base_now_ns();
    mf_watch_ring *q = &f.w.ring[MF_STREAM_INNER];
    q->count = 2; /* two collectives in flight: ops 7 and 9, issued 1.5 s ago */
    q->op[0] = 7;
    q->op[1] = 9;
    q->t_ns[0] = q->t_ns[1] = now - 1500 * 1000000LL;
    static const cudaError_t done_then_busy[] = {cudaSuccess, cudaErrorNotReady};
    use_fake_queries(done_then_busy, 2);
    char err[512] = "";
    assert_int_equal(mf_watch_once(&f.w, now, err, sizeof err), MFSDP_ERR_TIMEOUT);
    assert_non_null(strstr(err, "op 9 on the inner stream has not completed after 1500 ms"));
    assert_int_equal(q->count, 1); /* op 7 completed and left the ring */
    assert_int_equal(fake_last, cudaSuccess);

    /* young enough: no verdict */
    q->t_ns[q->head] = now - 10 * 1000000LL;
    use_fake_queries(done_then_busy + 1, 1);
    assert_int_equal(mf_watch_once(&f.w, now, err, sizeof err), MFSDP_OK);
    /* a stream fault */
    static const cudaError_t fault[] = {cudaErrorIllegalAddress};
    use_fake_queries(fault, 1);
    assert_int_equal(mf_watch_once(&f.w, now, err, sizeof err), MFSDP_ERR_BACKEND);
    assert_non_null(strstr(err, "the inner stream failed after op 9: cudaErrorIllegalAddress"));
    /* while capturing, no event is queried */
    atomic_bool capturing = true;
    f.w.capturing = &capturing;
    fake_pos = 0;
    assert_int_equal(mf_watch_once(&f.w, now, err, sizeof err), MFSDP_OK);
    assert_int_equal(fake_pos, 0);
    f.w.capturing = NULL;
    fixture_done(&f);
}

static void test_watch_open_call(void **state)
{
    (void)state;
    watch_fixture f;
    fixture_init(&f, 200);
    char err[512] = "";
    mf_watch_call_begin(&f.w);
    int64_t later = mf_base_now_ns() + 250 * 1000000LL;
    pthread_mutex_lock(&f.mu); /* the trainer is inside the call, holding the lock */
    assert_int_equal(mf_watch_once(&f.w, later, err, sizeof err), MFSDP_ERR_TIMEOUT);
    assert_non_null(strstr(err, "an NCCL call has not returned after"));
    /* the abort cannot get the lock: it aborts without it, after MF-bounded wait */
    int64_t t0 = mf_base_now_ns();
    mf_watch_abort(&f.w, 50);
    int64_t waited_ms = (mf_base_now_ns() - t0) / 1000000;
    assert_true(waited_ms >= 40 && waited_ms < 5000);
    assert_int_equal(aborts[1], 1);
    assert_int_equal(aborts[2], 1);
    assert_int_equal(aborts[3], 1); /* the world */
    assert_true(mf_watch_aborted(&f.w));
    pthread_mutex_unlock(&f.mu);
    mf_watch_call_end(&f.w);
    /* once only; and nothing more is reported after an abort */
    mf_watch_abort(&f.w, 50);
    assert_int_equal(aborts[1], 1);
    assert_int_equal(mf_watch_once(&f.w, later, err, sizeof err), MFSDP_OK);
    fixture_done(&f);

    /* with the lock free, the abort takes it (and returns at once) */
    fixture_init(&f, 200);
    t0 = mf_base_now_ns();
    mf_watch_abort(&f.w, 5000);
    assert_true((mf_base_now_ns() - t0) / 1000000 < 1000);
    assert_int_equal(aborts[3], 1);
    assert_int_equal(pthread_mutex_trylock(&f.mu), 0); /* released again */
    pthread_mutex_unlock(&f.mu);
    fixture_done(&f);
}

/* ---- 6. registration ---- */

static int reg_calls, reg_fail_at, live_handles;
static ncclResult_t fake_register(ncclComm_t comm, void *buf, size_t bytes, void **handle)
{
    (void)comm, (void)buf, (void)bytes;
    if (++reg_calls == reg_fail_at)
        return ncclUnhandledCudaError;
    *handle = (void *)(uintptr_t)(0x1000 + reg_calls);
    live_handles++;
    return ncclSuccess;
}
static ncclResult_t fake_deregister(ncclComm_t comm, void *handle)
{
    (void)comm;
    assert_non_null(handle);
    live_handles--;
    return ncclSuccess;
}

static void test_register_partial_failure(void **state)
{
    (void)state;
    mf_cuda_calls.comm_register = fake_register;
    mf_cuda_calls.comm_deregister = fake_deregister;
    ncclComm_t comms[3] = {(ncclComm_t)(uintptr_t)1, (ncclComm_t)(uintptr_t)2, (ncclComm_t)(uintptr_t)3};
    char a[1], b[1];
    void *regions[2] = {a, b};
    size_t bytes[2] = {1, 1};
    void *handles[3 * 4];
    for (int fail_at = 1; fail_at <= 7; fail_at++) { /* 6 registrations; 7: none fails */
        memset(handles, 0, sizeof handles);
        reg_calls = live_handles = 0;
        reg_fail_at = fail_at;
        int bc, br;
        ncclResult_t r = mf_cuda_nccl_register_all(comms, 3, regions, bytes, 2, handles, 4, &bc, &br);
        if (fail_at <= 6) {
            assert_int_equal(r, ncclUnhandledCudaError);
            assert_int_equal(bc, (fail_at - 1) / 2); /* comm-major order */
            assert_int_equal(br, (fail_at - 1) % 2);
            assert_int_equal(live_handles, 0);
            for (int i = 0; i < 12; i++)
                assert_null(handles[i]);
        } else {
            assert_int_equal(r, ncclSuccess);
            assert_int_equal(live_handles, 6);
            mf_cuda_nccl_deregister_all(comms, 3, handles, 2, 4);
            assert_int_equal(live_handles, 0);
        }
    }
    mf_cuda_calls_reset();
}

/* ---- 4. launch order ---- */

/* ---- groups ---- */

static char group_log[64]; /* 'S' start, 'E' end, digit: member k */
static ncclResult_t group_start_result, member_result[8];

static void group_note(char c)
{
    size_t n = strlen(group_log);
    assert_true(n + 1 < sizeof group_log);
    group_log[n] = c;
}
static ncclResult_t fake_group_start(void)
{
    group_note('S');
    return group_start_result;
}
static ncclResult_t fake_group_end(void)
{
    group_note('E');
    return ncclSuccess;
}
static ncclResult_t fake_member(void *ctx, int k)
{
    assert_ptr_equal(ctx, group_log);
    group_note((char)('0' + k));
    return member_result[k];
}

/* The calls one mf_cuda_nccl_group_issue of n members makes, and its result. */
static ncclResult_t issue(int n, const char *want)
{
    memset(group_log, 0, sizeof group_log);
    ncclResult_t r = mf_cuda_nccl_group_issue(n, fake_member, group_log);
    assert_string_equal(group_log, want);
    return r;
}

static void test_group_issue(void **state)
{
    (void)state;
    mf_cuda_calls.group_start = fake_group_start;
    mf_cuda_calls.group_end = fake_group_end;
    memset(member_result, 0, sizeof member_result);
    group_start_result = ncclSuccess;
    assert_int_equal(issue(3, "S012E"), ncclSuccess);
    assert_int_equal(issue(1, "0"), ncclSuccess); /* alone: no group */
    member_result[0] = ncclInProgress;            /* nonblocking: not a failure */
    assert_int_equal(issue(2, "S01E"), ncclSuccess);
    assert_int_equal(issue(1, "0"), ncclInProgress);
    member_result[0] = ncclSuccess;
    member_result[1] = ncclInvalidUsage; /* a failed member: the rest not issued, the group closed */
    assert_int_equal(issue(3, "S01E"), ncclInvalidUsage);
    member_result[1] = ncclSuccess;
    group_start_result = ncclSystemError; /* no group opened: none closed, nothing issued */
    assert_int_equal(issue(3, "S"), ncclSystemError);
    mf_cuda_calls_reset();
}

static void test_launch_order_decide(void **state)
{
    (void)state;
    char w[512];
    assert_true(mf_cuda_nccl_launch_order_decide(NULL, false, w, sizeof w));
    assert_string_equal(w, "");
    assert_true(mf_cuda_nccl_launch_order_decide(NULL, true, w, sizeof w));
    assert_non_null(strstr(w, "set NCCL_LAUNCH_ORDER_IMPLICIT=1 in the environment before the process starts"));
    assert_false(mf_cuda_nccl_launch_order_decide("1", true, w, sizeof w));
    assert_string_equal(w, "");
    assert_false(mf_cuda_nccl_launch_order_decide("0", false, w, sizeof w));
    assert_non_null(strstr(w, "NCCL_LAUNCH_ORDER_IMPLICIT is \"0\" in the environment and was left alone"));
}

static void *launch_order_thread(void *arg)
{
    char *w = arg;
    mf_cuda_nccl_launch_order(false, w, 512);
    return NULL;
}

static void test_launch_order_once(void **state)
{
    (void)state;
    unsetenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    pthread_t t[8];
    static char warn[8][512];
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&t[i], NULL, launch_order_thread, warn[i]), 0);
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        assert_string_equal(warn[i], "");
    }
    assert_string_equal(getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), "1");
    /* decided once: a later change of the environment is not re-applied */
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "0", 1);
    char w[512];
    mf_cuda_nccl_launch_order(true, w, sizeof w);
    assert_string_equal(w, "");
    assert_string_equal(getenv("NCCL_LAUNCH_ORDER_IMPLICIT"), "0");
}

/* ---- 6. a watchdog failure during a hook of local ops ---- */

static const mf_backend_vtbl *real_be;
static int fake_submits;
static mfsdp_result fake_submit(mf_rt *rt, const mf_rt_op *rop, int64_t m, int64_t seq, char *err, size_t errlen)
{
    (void)rop, (void)m, (void)seq, (void)err, (void)errlen;
    if (fake_submits++ == 0) /* the watchdog fires while the hook enqueues */
        mf_base_fail(rt, MFSDP_ERR_TIMEOUT, "rank 0: watchdog: op 3 has not completed (fake)");
    return MFSDP_OK;
}

static void test_hook_reports_watchdog_failure(void **state)
{
    (void)state;
    static const rt_mesh m11 = {"1x1", 2, {1, 1}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "zero3", &m11, 1, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    mfsdp_local_group *g = NULL;
    assert_int_equal(mfsdp_local_group_create(1, &g), MFSDP_OK);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_LOCAL;
    cfg.local_group = g;
    cfg.rank = 0;
    cfg.flags |= MFSDP_FLAG_SYNCHRONOUS;
    mfsdp_runtime *rt = NULL;
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_OK);
    /* Drive the engine's native path with a backend whose submit succeeds. */
    static mf_backend_vtbl fake;
    real_be = rt->be;
    fake = *real_be;
    fake.submit = fake_submit;
    rt->be = &fake;
    rt->native = true;
    rt->synchronous = false;
    fake_submits = 0;
    mfsdp_result r = mfsdp_step_begin(rt);
    for (int u = 0; r == MFSDP_OK && fake_submits == 0 && u < sh->s->nunits; u++)
        r = mfsdp_forward_pre(rt, u, 0);
    assert_true(fake_submits > 0);
    assert_int_equal(r, MFSDP_ERR_TIMEOUT);
    assert_non_null(strstr(mfsdp_last_error(rt), "watchdog: op 3 has not completed"));
    rt->be = real_be;
    rt->native = false;
    rt->synchronous = true;
    mfsdp_destroy(rt);
    mfsdp_local_group_destroy(g);
    mfsdp_schedule_free(sh);
}

/* ---- 5. collectives on the compute stream; 2. blocking by default ---- */

static void test_refuse_compute_collective(void **state)
{
    (void)state;
    static const rt_mesh m11 = {"1x1", 2, {1, 1}};
    mf_tb_spec spec;
    rt_model_spec(&spec, "hfsdp", &m11, 2, MF_REDUCE_AVG);
    mfsdp_schedule *sh = rt_build(&spec);
    int moved = -1;
    for (int i = 0; i < sh->s->nops && moved < 0; i++)
        if (mf_opkind_is_collective(sh->s->ops[i].kind)) {
            sh->s->ops[i].stream = MF_STREAM_COMPUTE;
            moved = i;
        }
    assert_true(moved >= 0);
    mfsdp_config cfg;
    mfsdp_config_init(&cfg);
    cfg.backend = MFSDP_BACKEND_NCCL;
    cfg.rank = 0;
    int64_t live = mf_base_alloc_live();
    mfsdp_runtime *rt = (mfsdp_runtime *)1;
    char want[64];
    snprintf(want, sizeof want, "op %d (", moved);
    assert_int_equal(mfsdp_create(sh, &cfg, &rt), MFSDP_ERR_UNSUPPORTED);
    assert_null(rt);
    const char *msg = mfsdp_last_error(NULL);
    assert_non_null(strstr(msg, want));
    assert_non_null(strstr(msg, "is a collective on the compute stream"));
    assert_int_equal(mf_base_alloc_live(), live);
    mfsdp_schedule_free(sh);

    mfsdp_nccl_config nc;
    mfsdp_nccl_config_init(&nc);
    assert_false(nc.flags & MFSDP_NCCL_NONBLOCKING);
    assert_true(nc.watchdog_poll_ms > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_clears_not_ready),
        cmocka_unit_test(test_poll_maps_errors),
        cmocka_unit_test(test_watch_async_error),
        cmocka_unit_test(test_watch_rings),
        cmocka_unit_test(test_watch_open_call),
        cmocka_unit_test(test_register_partial_failure),
        cmocka_unit_test(test_group_issue),
        cmocka_unit_test(test_launch_order_decide),
        cmocka_unit_test(test_launch_order_once),
        cmocka_unit_test(test_hook_reports_watchdog_failure),
        cmocka_unit_test(test_refuse_compute_collective),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

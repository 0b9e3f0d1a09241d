/*
 * gm_kernels: the device kernels of runtime/backends/mf_cuda_kernels.cu,
 * built from that same source by the host compiler (gm_kernels_shim.h), and
 * the registry the CUDA model's cudaLaunchKernel finds them in by device name
 * (gm_model.h: gm_kernels_find).
 *
 * A launch runs every block and every thread of the grid on the calling host
 * thread, one thread after another (blocks in index order, threads in index
 * order inside a block). That is the device's result for the .cu's kernels
 * because they are grid-stride loops whose threads never wait on one another
 * and never touch an element another thread touches (the shim refuses
 * __syncthreads, shared memory, shuffles and atomics at compile time). The
 * arithmetic is the .cu's own code: fp32 sums, scale and rounding to
 * bf16/fp16 through the CUDA headers' host conversions.
 *
 * NaN payloads: the device returns the canonical NaN (0x7fffffff) from fp32
 * arithmetic, the host the first NaN operand, quieted; the conversions to
 * bf16/fp16 (cuda_bf16.h/cuda_fp16.h on the host, like cvt.rn on the device)
 * give 0x7fff, dropping the sign and payload, where the host references
 * (mf_cuda_host_to_bf16/fp16) keep the sign and the high payload bits. A NaN
 * stays a NaN everywhere; only its bits may differ.
 *
 * Keys: the device names nvcc registers (__cudaRegisterFunction's
 * deviceName) demangled, with the return type, namespaces and parameter
 * list dropped: "combine_kernel<0, 1>", "fill_kernel<2>", "spin_kernel".
 * check_instantiations.py holds this table to the real nvcc object.
 */
#include "gm_kernels_shim.h"

#include "mf_cuda_kernels.cu"

#include "gm_kernels_host.h"
#include "gm_model.h"

#include <stddef.h>
#include <time.h>

#include <utility>

static_assert(MF_FP32 == 0 && MF_BF16 == 1 && MF_FP16 == 2,
              "the registry's keys spell the dtypes as nvcc's template arguments 0, 1, 2");

extern "C" unsigned long long gm_kernels_globaltimer_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

namespace {

/* One kernel's parameters read from cudaLaunchKernel's args (each args[i]
 * points to parameter i), then the grid run thread by thread. Fn is a
 * template argument so the kernel inlines into the loop. */
template <typename... A, size_t... I>
inline void call_with(void (*fn)(A...), void **args, std::index_sequence<I...>)
{
    fn(*static_cast<typename std::remove_reference<A>::type *>(args[I])...);
}

template <typename F> struct params;
template <typename... A> struct params<void (*)(A...)> {
    static constexpr int n = sizeof...(A);
    static constexpr size_t size(int i)
    {
        constexpr size_t s[] = {sizeof(A)..., 0};
        return s[i];
    }
};

template <auto Fn> void run_grid(void **args, dim3 grid, dim3 block)
{
    gridDim = grid;
    blockDim = block;
    constexpr auto seq = std::make_index_sequence<params<decltype(Fn)>::n>();
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blockIdx = make_uint3(bx, by, bz);
                for (unsigned tz = 0; tz < block.z; tz++)
                    for (unsigned ty = 0; ty < block.y; ty++)
                        for (unsigned tx = 0; tx < block.x; tx++) {
                            threadIdx = make_uint3(tx, ty, tz);
                            call_with(Fn, args, seq);
                        }
            }
}

size_t dtype_size(int t)
{
    return t == MF_FP32 ? 4 : 2;
}

size_t bytes_of(int64_t n, int t)
{
    return n > 0 ? (size_t)n * dtype_size(t) : 0;
}

/* combine_kernel<S, D>(operands ops, int64_t n, ...): reads every source,
 * writes every destination (and reads dst[0] when add_dst). -1 for an
 * operand count the kernel cannot hold. */
template <int S, int D> int combine_ranges(void **args, gm_range *out, int cap)
{
    const operands *ops = static_cast<const operands *>(args[0]);
    int64_t n = *static_cast<const int64_t *>(args[1]);
    if (ops->nsrc < 1 || ops->nsrc > MF_CUDA_MAX_OPERANDS || ops->ndst < 1 || ops->ndst > MF_CUDA_MAX_OPERANDS)
        return -1;
    int count = 0;
    for (int k = 0; k < ops->nsrc; k++, count++)
        if (count < cap)
            out[count] = gm_range{ops->src[k], bytes_of(n, S), 0};
    for (int j = 0; j < ops->ndst; j++, count++)
        if (count < cap)
            out[count] = gm_range{ops->dst[j], bytes_of(n, D), 1};
    return count;
}

/* fill_kernel<T>(void *buf, int64_t n, uint32_t seed): writes buf. */
template <int T> int fill_ranges(void **args, gm_range *out, int cap)
{
    void *buf = *static_cast<void *const *>(args[0]);
    int64_t n = *static_cast<const int64_t *>(args[1]);
    if (cap >= 1)
        out[0] = gm_range{buf, bytes_of(n, T), 1};
    return 1;
}

int no_ranges(void **, gm_range *, int)
{
    return 0;
}

struct entry {
    gm_kernel k;
    const void *host_fn; /* the host build's function, for gm_cu_cudaLaunchKernel */
};

template <auto Fn> constexpr gm_kernel make(const char *key, void (*run)(void **, dim3, dim3),
                                            int (*ranges)(void **, gm_range *, int))
{
    typedef params<decltype(Fn)> P;
    static_assert(P::n <= GM_KERNEL_MAX_ARGS, "a kernel with more parameters than GM_KERNEL_MAX_ARGS");
    gm_kernel k{key, run, ranges, P::n, {}};
    for (int i = 0; i < P::n; i++)
        k.arg_size[i] = P::size(i);
    return k;
}

#define GM_COMBINE(S, D)                                                                                  \
    entry{make<&combine_kernel<S, D>>("combine_kernel<" #S ", " #D ">", run_grid<&combine_kernel<S, D>>, \
                                      combine_ranges<S, D>),                                            \
          reinterpret_cast<const void *>(&combine_kernel<S, D>)}
#define GM_FILL(T)                                                                                        \
    entry{make<&fill_kernel<T>>("fill_kernel<" #T ">", run_grid<&fill_kernel<T>>, fill_ranges<T>),       \
          reinterpret_cast<const void *>(&fill_kernel<T>)}

const entry table[] = {
    GM_COMBINE(0, 0), GM_COMBINE(0, 1), GM_COMBINE(0, 2),
    GM_COMBINE(1, 0), GM_COMBINE(1, 1), GM_COMBINE(1, 2),
    GM_COMBINE(2, 0), GM_COMBINE(2, 1), GM_COMBINE(2, 2),
    GM_FILL(0), GM_FILL(1), GM_FILL(2),
    entry{make<&spin_kernel>("spin_kernel", run_grid<&spin_kernel>, no_ranges),
          reinterpret_cast<const void *>(&spin_kernel)},
};
constexpr int table_len = (int)(sizeof table / sizeof table[0]);

const entry *by_host_fn(const void *fn)
{
    for (int i = 0; i < table_len; i++)
        if (table[i].host_fn == fn)
            return &table[i];
    return nullptr;
}

thread_local int host_launches;

} // namespace

extern "C" {

__attribute__((visibility("default"))) const gm_kernel *gm_kernels_find(const char *key)
{
    if (!key)
        return nullptr;
    for (int i = 0; i < table_len; i++)
        if (strcmp(table[i].k.key, key) == 0)
            return &table[i].k;
    return nullptr;
}

int gm_kernels_count(void)
{
    return table_len;
}

const gm_kernel *gm_kernels_at(int i)
{
    return i >= 0 && i < table_len ? &table[i].k : nullptr;
}

int gm_kernels_host_launches(void)
{
    return host_launches;
}

/* The .cu's launch() on the host build: the launch runs now, on this thread,
 * through the registry (no stream: the self-test's operands are host memory). */
cudaError_t gm_cu_cudaLaunchKernel(const void *fn, dim3 grid, dim3 block, void **args, size_t shmem,
                                   cudaStream_t stream)
{
    (void)stream;
    const entry *e = by_host_fn(fn);
    if (!e || shmem != 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
        block.z == 0)
        return cudaErrorInvalidValue;
    e->k.run(args, grid, block);
    host_launches++;
    return cudaSuccess;
}

cudaError_t gm_cu_cudaGetLastError(void)
{
    return cudaSuccess;
}

cudaError_t gm_cu_cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t stream)
{
    (void)kind;
    (void)stream;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

} // extern "C"

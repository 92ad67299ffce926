/*
 * kvl_emu.h - the host emulator behind kvl_port.h (selected by defining KVL_EMU; the includer
 * defines KVL_WARP as 32 or 64). Kernel sources written against kvl_port.h compile unchanged
 * as C++20 and run on the CPU.
 *
 * Model. kvl_emu::launch() runs a grid on the calling OS thread: the blocks one after another,
 * the threads of a block as fibers (user-space coroutines, each on its own small stack). A
 * fiber runs until it returns or reaches a rendezvous; then the scheduler resumes the next
 * ready fiber, in thread order (seed 0) or in an order drawn from the launch's seed.
 *   - kvl_sync() is a block barrier: it opens when every fiber of the block that has not
 *     returned waits at it. Fibers waiting at two different call sites is an error.
 *   - kvl_shfl_xor() and kvl_ballot() are warp rendezvous: each lane deposits its value, and
 *     when all KVL_WARP lanes of the warp wait at the same op and call site, every lane gets
 *     its result. A lane that has returned or waits elsewhere is an error.
 * An error inside a block (divergent barrier, incomplete warp op, kvl_trap(), static shared
 * memory over the limit) ends the launch: the other fibers are abandoned, never resumed, and
 * launch() returns non-zero with a message. Nothing here aborts, exits or throws.
 *
 * State lives in the launch and a thread_local pointer to the running fiber, so OS threads
 * may launch concurrently without locks. Fibers are never preempted, so the atomics are
 * plain read-modify-writes. Shared memory (KVL_SHARED, kvl_dyn_shared) is filled with 0xff
 * bytes (NaN floats) at the start of every block, so reads of unwritten shared memory stand
 * out. KVL_SHARED declares a pointer, not an array (sizeof differs from the GPU). Call sites
 * are told apart by file and line: keep two collective calls off one line.
 *
 * Linkage: two translation units with different KVL_WARP may be linked together, so the
 * implementation lives in the inline namespace kvl_emu::warp32 or kvl_emu::warp64, and the
 * kernel-facing functions are static.
 *
 * Context switch: hand-written on x86-64 (callee-saved registers, stack pointer, MXCSR and
 * the x87 control word), ucontext elsewhere or with -DKVL_EMU_UCONTEXT. AddressSanitizer is
 * told about every stack switch.
 *
 * Threads mode (-DKVL_EMU_THREADS, kvl_emu_threads.h): the threads of a block run as real OS
 * threads (a pool per launch) that meet at mutexes and condition variables, so that
 * ThreadSanitizer sees a kvl_sync as the happens-before edge a GPU barrier is, and reports
 * shared-memory accesses that no barrier separates. Same primitives and errors; slower, the
 * seed is not used (the OS orders the threads), and the atomics are real atomics.
 */
#ifndef KVL_EMU_H
#define KVL_EMU_H

#if !defined(KVL_WARP) || (KVL_WARP != 32 && KVL_WARP != 64)
#error "kvl_emu.h: define KVL_WARP as 32 or 64 before including kvl_port.h"
#endif

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <utility>
#include <vector>

#if !defined(KVL_EMU_THREADS)
#if defined(__x86_64__) && !defined(KVL_EMU_UCONTEXT)
#define KVL_EMU_X86_SWITCH 1
#else
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVL_EMU_ASAN 1
#endif
#endif
#if defined(KVL_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* Bytes of stack per fiber (ASan frames are larger). */
#ifndef KVL_EMU_STACK_BYTES
#if defined(KVL_EMU_ASAN)
#define KVL_EMU_STACK_BYTES (256u * 1024u)
#else
#define KVL_EMU_STACK_BYTES (64u * 1024u)
#endif
#endif
#endif /* !KVL_EMU_THREADS */

#if KVL_WARP == 64
typedef uint64_t kvl_lane_mask_t;
#else
typedef uint32_t kvl_lane_mask_t;
#endif

#define KVL_EMU_CAT2_(a, b) a##b
#define KVL_EMU_CAT_(a, b) KVL_EMU_CAT2_(a, b)
/* The implementation's namespace: one per warp width and mode, so that any of them link together. */
#if defined(KVL_EMU_THREADS)
#define KVL_EMU_IMPL KVL_EMU_CAT_(threads_warp, KVL_WARP)
#else
#define KVL_EMU_IMPL KVL_EMU_CAT_(warp, KVL_WARP)
#endif

namespace kvl_emu {
inline namespace KVL_EMU_IMPL {

struct Dim3 { uint32_t x = 1, y = 1, z = 1; };

struct Launch {
    Dim3 grid, block;                        // block.y == block.z == 1
    uint32_t dyn_shared_bytes = 0;           // dynamic shared memory per block
    uint32_t shared_limit_bytes = 48 * 1024; // static + dynamic per block must fit
    uint64_t seed = 0;                       // 0: thread order; else seeded pseudo-random order
    uint32_t run_grid_x = 0;                 // blocks at x >= it are skipped (0: none skipped)
};

namespace detail {

constexpr uint32_t kWarp = KVL_WARP;
static_assert(sizeof(kvl_lane_mask_t) * 8 == kWarp, "one mask bit per lane");

/* ------------------------------------------------------------------ state both modes keep */
enum class State : uint8_t { Ready, AtSync, AtWarp, Done };
enum class Op : uint8_t { Shfl, Ballot };

/* One thread of the block: what the primitives and the error messages need. */
struct GpuThread {
    uint32_t tid = 0;
    State state = State::Done;
    size_t shared_used = 0;   // bump cursor into the block's static shared arena
    const char *file = "";    // call site it waits at
    int line = 0;
    float fval = 0, fres = 0; // kvl_shfl_xor: value deposited, value received
    int xmask = 0;
    int pred = 0;             // kvl_ballot: predicate deposited, mask received
    kvl_lane_mask_t bres = 0;
    uint32_t rendezvous = 0;  // barriers and warp ops it has passed (traffic recording's epochs)
};

struct Warp {
    uint32_t arrived = 0;  // lanes waiting at a warp op
    uint32_t returned = 0; // lanes that have returned
    uint32_t first = 0;    // thread that arrived first (its site is the op's)
    Op op = Op::Shfl;
};

/* One launch: its configuration, the running block and its barrier, and the first error. */
struct LaunchState {
    Launch cfg;
    void (*body)(void *) = nullptr;
    void *body_obj = nullptr;
    Dim3 block;                      // index of the running block
    std::vector<Warp> warps;
    uint32_t live = 0;               // threads of the block that have not returned
    uint32_t at_sync = 0;            // threads waiting at kvl_sync
    uint32_t sync_first = 0;         // the first of them
    unsigned char *smem = nullptr, *dyn = nullptr; // static and dynamic shared memory
    size_t smem_cap = 0;             // bytes of static shared memory a block may use
    size_t smem_filled = 0;          // bytes of it handed out (and filled) in this block
    bool failed = false;
    char msg[512] = {};
};

/* ------------------------------------------------------------------ checks and messages */
/* Records the first error of the launch; returns false. */
__attribute__((format(printf, 2, 3))) inline bool set_error(LaunchState &e, const char *fmt, ...)
{
    if (!e.failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e.msg, sizeof e.msg, fmt, ap);
        va_end(ap);
        e.failed = true;
    }
    return false;
}

inline bool same_site(const GpuThread &a, const GpuThread &b)
{
    return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

inline const char *op_name(Op op) { return op == Op::Shfl ? "kvl_shfl_xor" : "kvl_ballot"; }

/* `f` reaches kvl_sync at its site while `first` waits at another. */
inline bool divergent_barrier_error(LaunchState &e, const GpuThread &first, const GpuThread &f)
{
    return set_error(e, "divergent barrier: thread %u at %s:%d, thread %u at %s:%d", first.tid,
                     first.file, first.line, f.tid, f.file, f.line);
}

/* `f` reaches warp op `op` at its site while `first` of its warp waits at `first_op`. */
inline bool divergent_warp_error(LaunchState &e, const GpuThread &first, Op first_op,
                                 const GpuThread &f, Op op)
{
    return set_error(e, "divergent warp op: thread %u at %s %s:%d, thread %u at %s %s:%d",
                     first.tid, op_name(first_op), first.file, first.line, f.tid, op_name(op),
                     f.file, f.line);
}

/* `waiter` waits at a warp op that lane `missing` of its warp will never reach. */
inline bool missing_lane_error(LaunchState &e, Op op, const GpuThread &waiter,
                               const GpuThread &missing)
{
    char where[300] = "has returned";
    if (missing.state != State::Done)
        snprintf(where, sizeof where, "waits at kvl_sync at %s:%d", missing.file, missing.line);
    return set_error(e, "%s at %s:%d (thread %u): lane %u (thread %u) of warp %u %s",
                     op_name(op), waiter.file, waiter.line, waiter.tid, missing.tid % kWarp,
                     missing.tid, missing.tid / kWarp, where);
}

inline bool lane_mask_error(LaunchState &e, const char *file, int line, uint32_t tid, int mask)
{
    return set_error(e, "kvl_shfl_xor at %s:%d (thread %u): lane mask %d is outside 0..%u", file,
                     line, tid, mask, kWarp - 1);
}

inline bool trap_error(LaunchState &e, const char *file, int line, uint32_t tid)
{
    return set_error(e, "kernel trapped at %s:%d (thread %u)", file, line, tid);
}

/* KVL_SHARED: every thread of a block declares the same arrays in the same order, so
 * per-thread bump cursors hand out the same addresses. The offset of the next array of
 * `f`; it fits when offset + bytes <= e.smem_cap. */
inline size_t shared_offset(const LaunchState &e, const GpuThread &f, size_t align)
{
    uintptr_t base = reinterpret_cast<uintptr_t>(e.smem);
    return ((base + f.shared_used + align - 1) & ~uintptr_t(align - 1)) - base;
}

inline bool shared_limit_error(LaunchState &e, const char *file, int line, size_t end)
{
    return set_error(e, "KVL_SHARED at %s:%d: static shared memory %zu + dynamic %u bytes exceeds "
                     "the limit of %u bytes", file, line, end, e.cfg.dyn_shared_bytes,
                     e.cfg.shared_limit_bytes);
}

/* Every lane of a complete warp op gets its result. */
template <class T> void warp_results(Op op, T *lanes)
{
    kvl_lane_mask_t bits = 0;
    for (uint32_t i = 0; i < kWarp; i++)
        if (lanes[i].pred)
            bits |= kvl_lane_mask_t(1) << i;
    for (uint32_t i = 0; i < kWarp; i++) {
        if (op == Op::Shfl)
            lanes[i].fres = lanes[i ^ uint32_t(lanes[i].xmask)].fval;
        else
            lanes[i].bres = bits;
    }
}

/* `nested`: launch() was called from a kernel. */
inline bool validate(LaunchState &e, bool nested)
{
    const Launch &l = e.cfg;
    if (nested)
        return set_error(e, "invalid launch: launch() called from inside a kernel");
    const struct {
        const char *what;
        uint32_t v, lo, hi;
    } ranges[] = {{"grid.x", l.grid.x, 1, 0x7fffffff}, {"grid.y", l.grid.y, 1, 65535},
                  {"grid.z", l.grid.z, 1, 65535},      {"block.x", l.block.x, 1, 1024},
                  {"block.y", l.block.y, 1, 1},        {"block.z", l.block.z, 1, 1}};
    for (const auto &r : ranges)
        if (r.v < r.lo || r.v > r.hi)
            return set_error(e, "invalid launch: %s = %u is outside %u..%u", r.what, r.v, r.lo,
                             r.hi);
    if (l.block.x % kWarp)
        return set_error(e, "invalid launch: block.x = %u is not a multiple of the warp width %u",
                         l.block.x, kWarp);
    if (l.dyn_shared_bytes > l.shared_limit_bytes)
        return set_error(e, "invalid launch: dyn_shared_bytes = %u exceeds shared_limit_bytes = %u",
                         l.dyn_shared_bytes, l.shared_limit_bytes);
    return true;
}

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

} // namespace detail
} // inline namespace warp32 / warp64 / threads_warp32 / threads_warp64
} // namespace kvl_emu

#if defined(KVL_EMU_THREADS)
#include "kvl_emu_threads.h"
#else
/* ================================================================== fiber mode (the default) */
namespace kvl_emu {
inline namespace KVL_EMU_IMPL {
namespace detail {

/* ------------------------------------------------------------------ context switch */
#if defined(KVL_EMU_X86_SWITCH)
struct Context { void *sp = nullptr; };

#if defined(__clang__)
#define KVL_EMU_SWITCH_ATTRS __attribute__((naked, noinline))
#else /* noipa: callers must not assume this asm leaves any caller-saved register intact */
#define KVL_EMU_SWITCH_ATTRS __attribute__((naked, noinline, noipa))
#endif

/* Pushes the callee-saved registers, MXCSR and the x87 control word, stores the stack
 * pointer in *save, switches to stack `to` and pops the same from there. */
inline KVL_EMU_SWITCH_ATTRS void switch_stack(void ** /* save: rdi */, void * /* to: rsi */)
{
    asm volatile("pushq %rbp; pushq %rbx; pushq %r12; pushq %r13; pushq %r14; pushq %r15\n\t"
                 "subq $16, %rsp; stmxcsr 8(%rsp); fnstcw (%rsp)\n\t"
                 "movq %rsp, (%rdi); movq %rsi, %rsp\n\t"
                 "fldcw (%rsp); ldmxcsr 8(%rsp); addq $16, %rsp\n\t"
                 "popq %r15; popq %r14; popq %r13; popq %r12; popq %rbx; popq %rbp; ret");
}

inline void ctx_switch(Context &from, Context &to)
{
    asm volatile("" ::: "memory");
    switch_stack(&from.sp, to.sp);
    asm volatile("" ::: "memory");
}

/* A context on [lo, lo + size) whose first switch "returns" into entry(), with the stack
 * aligned as at a function entry. `lo` and `size` are multiples of 16. */
inline void ctx_init(Context &c, unsigned char *lo, size_t size, void (*entry)())
{
    uint16_t fcw;
    uint32_t mxcsr;
    asm volatile("fnstcw %0" : "=m"(fcw));
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    void **sp = reinterpret_cast<void **>(lo + size);
    *--sp = nullptr; // entry's return address: it never returns
    *--sp = reinterpret_cast<void *>(entry);
    for (int i = 0; i < 6; i++)
        *--sp = nullptr; // rbp rbx r12 r13 r14 r15
    sp -= 2;
    memcpy(sp, &fcw, sizeof fcw);
    memcpy(sp + 1, &mxcsr, sizeof mxcsr);
    c.sp = sp;
}
#else
struct Context { ucontext_t uc; };

inline void ctx_switch(Context &from, Context &to) { swapcontext(&from.uc, &to.uc); }

inline void ctx_init(Context &c, unsigned char *lo, size_t size, void (*entry)())
{
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = lo;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

/* ASan must know which stack runs: start before a switch (fake == null: the current fiber
 * ends for good), finish after it. */
#if defined(KVL_EMU_ASAN)
inline void asan_start(void **fake, const void *lo, size_t n)
{
    __sanitizer_start_switch_fiber(fake, lo, n);
}
inline void asan_finish(void *fake, const void **lo, size_t *n)
{
    __sanitizer_finish_switch_fiber(fake, lo, n);
}
inline void asan_unpoison(void *p, size_t n) { __asan_unpoison_memory_region(p, n); }
#else
inline void asan_start(void **, const void *, size_t) {}
inline void asan_finish(void *, const void **, size_t *) {}
inline void asan_unpoison(void *, size_t) {}
#endif

/* ------------------------------------------------------------------ launch state */
struct Engine;

struct Fiber : GpuThread {
    Context ctx;
    Engine *eng = nullptr;
    unsigned char *stack = nullptr; // lowest address of its stack
    void *asan_fake = nullptr;
};

struct Engine : LaunchState {
    std::vector<Fiber> fibers;       // one per thread of a block
    std::vector<uint32_t> run, next; // fibers to resume this round, and in the next one
    unsigned char *map = nullptr;    // [static shared | dynamic shared | (guard, stack) per fiber]
    size_t map_len = 0, stack_bytes = 0;
    size_t smem_len = 0, dyn_len = 0; // page-rounded static and dynamic shared memory mapped
    uint32_t threads_mapped = 0;      // guarded stacks mapped (at least block.x)
    Context sched;
    uint64_t rng = 0;
    void *sched_fake = nullptr; // ASan: the scheduler's stack
    const void *sched_lo = nullptr;
    size_t sched_size = 0;

    Engine() = default;
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    ~Engine();
};

/* The last launch's mapping of shared memory and guarded stacks, kept per OS thread for the
 * next launch it is large enough for: tests run thousands of small launches of varied shapes,
 * and mapping, guarding and faulting in a stack per thread each time costs more than running
 * them. A new mapping is sized for the larger of the launch and the one it replaces, so the
 * cache settles on the largest shape a thread uses. */
struct MapCache {
    unsigned char *map = nullptr;
    size_t map_len = 0, smem_len = 0, dyn_len = 0;
    uint32_t threads = 0;
    MapCache() = default;
    MapCache(const MapCache &) = delete;
    MapCache &operator=(const MapCache &) = delete;
    ~MapCache()
    {
        if (map)
            munmap(map, map_len);
    }
};
inline thread_local MapCache tls_map_cache;

inline Engine::~Engine()
{
    if (!map)
        return;
    asan_unpoison(map, map_len); // abandoned fibers leave poisoned frames behind
    MapCache &c = tls_map_cache;
    if (c.map)
        munmap(c.map, c.map_len);
    c.map = map;
    c.map_len = map_len;
    c.smem_len = smem_len;
    c.dyn_len = dyn_len;
    c.threads = threads_mapped;
}

/* The fiber running on this OS thread (null outside a launch: the kvl_* primitives may only
 * be called from a body running under launch()). */
inline thread_local Fiber *tls_fiber = nullptr;
inline Fiber &self() { return *tls_fiber; }
inline bool in_kernel() { return tls_fiber != nullptr; }

/* ------------------------------------------------------------------ switching */
inline void resume(Engine &e, Fiber &f)
{
    tls_fiber = &f;
    asan_start(&e.sched_fake, f.stack, e.stack_bytes);
    ctx_switch(e.sched, f.ctx);
    asan_finish(e.sched_fake, nullptr, nullptr);
    tls_fiber = nullptr;
}

/* Back to the scheduler; returns when resumed, never when `forever`. */
inline void suspend(Fiber &f, bool forever)
{
    Engine &e = *f.eng;
    asan_start(forever ? nullptr : &f.asan_fake, e.sched_lo, e.sched_size);
    ctx_switch(f.ctx, e.sched);
    asan_finish(f.asan_fake, nullptr, nullptr);
}

/* Ends the calling fiber for good (after it returned or the launch failed). */
[[noreturn]] inline void die(Fiber &f)
{
    f.state = State::Done;
    suspend(f, true);
    __builtin_unreachable();
}

/* ------------------------------------------------------------------ barrier */
inline void release_sync(Engine &e)
{
    for (Fiber &f : e.fibers)
        if (f.state == State::AtSync) {
            f.state = State::Ready;
            e.next.push_back(f.tid);
        }
    e.at_sync = 0;
}

inline void sync_at(const char *file, int line)
{
    Fiber &f = self();
    Engine &e = *f.eng;
    f.file = file;
    f.line = line;
    f.rendezvous++;
    if (e.at_sync == 0) {
        e.sync_first = f.tid;
    } else {
        const Fiber &g = e.fibers[e.sync_first];
        if (!same_site(f, g)) {
            divergent_barrier_error(e, g, f);
            die(f);
        }
    }
    f.state = State::AtSync;
    if (++e.at_sync == e.live)
        release_sync(e);
    suspend(f, false);
}

/* ------------------------------------------------------------------ warp ops */
inline void release_warp(Engine &e, const Warp &w, Fiber *lanes)
{
    warp_results(w.op, lanes);
    for (uint32_t i = 0; i < kWarp; i++) {
        lanes[i].state = State::Ready;
        e.next.push_back(lanes[i].tid);
    }
}

/* The calling lane has deposited its value; waits for the other lanes of its warp. */
inline void warp_op(Op op, const char *file, int line)
{
    Fiber &f = self();
    Engine &e = *f.eng;
    Warp &w = e.warps[f.tid / kWarp];
    Fiber *lanes = &e.fibers[f.tid - f.tid % kWarp];
    f.file = file;
    f.line = line;
    f.rendezvous++;
    if (w.returned) {
        uint32_t i = 0;
        while (lanes[i].state != State::Done)
            i++;
        missing_lane_error(e, op, f, lanes[i]);
        die(f);
    }
    if (w.arrived == 0) {
        w.op = op;
        w.first = f.tid;
    } else {
        const Fiber &g = e.fibers[w.first];
        if (w.op != op || !same_site(f, g)) {
            divergent_warp_error(e, g, w.op, f, op);
            die(f);
        }
    }
    f.state = State::AtWarp;
    if (++w.arrived == kWarp) {
        w.arrived = 0;
        release_warp(e, w, lanes);
    }
    suspend(f, false);
}

inline float shfl_xor(float v, int lane_mask, const char *file, int line)
{
    Fiber &f = self();
    if (lane_mask < 0 || lane_mask >= int(kWarp)) {
        lane_mask_error(*f.eng, file, line, f.tid, lane_mask);
        die(f);
    }
    f.fval = v;
    f.xmask = lane_mask;
    warp_op(Op::Shfl, file, line);
    return f.fres;
}

inline kvl_lane_mask_t ballot(int pred, const char *file, int line)
{
    Fiber &f = self();
    f.pred = pred != 0;
    warp_op(Op::Ballot, file, line);
    return f.bres;
}

/* ------------------------------------------------------------------ other primitives */
[[noreturn]] inline void trap_at(const char *file, int line)
{
    Fiber &f = self();
    trap_error(*f.eng, file, line, f.tid);
    die(f);
}

inline void *shared_alloc(size_t bytes, size_t align, const char *file, int line)
{
    Fiber &f = self();
    Engine &e = *f.eng;
    size_t at = shared_offset(e, f, align);
    if (at + bytes > e.smem_cap) {
        shared_limit_error(e, file, line, at + bytes);
        die(f);
    }
    f.shared_used = at + bytes;
    if (f.shared_used > e.smem_filled) { // first use in this block: fill with 0xff
        memset(e.smem + e.smem_filled, 0xff, f.shared_used - e.smem_filled);
        e.smem_filled = f.shared_used;
    }
    return e.smem + at;
}

/* ------------------------------------------------------------------ scheduler */
/* Fiber entry: runs the body as one thread; a thread that returns leaves later barriers. */
[[noreturn]] inline void fiber_main()
{
    Fiber &f = self();
    Engine &e = *f.eng;
    asan_finish(nullptr, &e.sched_lo, &e.sched_size);
    e.body(e.body_obj);
    f.state = State::Done;
    e.live--;
    Warp &w = e.warps[f.tid / kWarp];
    w.returned++;
    if (w.arrived) // that warp op can never complete
        missing_lane_error(e, w.op, e.fibers[w.first], f);
    else if (e.at_sync && e.at_sync == e.live)
        release_sync(e);
    die(f);
}

inline uint64_t next_random(Engine &e) // splitmix64
{
    uint64_t z = (e.rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The order of the next round: thread order, or a seeded shuffle. */
inline void order(Engine &e)
{
    if (e.cfg.seed == 0) {
        std::sort(e.run.begin(), e.run.end());
        return;
    }
    for (size_t i = e.run.size(); i > 1; i--)
        std::swap(e.run[i - 1], e.run[next_random(e) % i]);
}

/* Runs one block; false on error. */
inline bool run_block(Engine &e)
{
    memset(e.dyn, 0xff, e.cfg.dyn_shared_bytes);
    e.smem_filled = 0;
    e.live = uint32_t(e.fibers.size());
    e.at_sync = 0;
    for (Warp &w : e.warps)
        w = Warp{};
    e.run.clear();
    e.next.clear();
    for (Fiber &f : e.fibers) {
        ctx_init(f.ctx, f.stack, e.stack_bytes, fiber_main);
        f.state = State::Ready;
        f.shared_used = 0;
        e.run.push_back(f.tid);
    }
    order(e);
    while (!e.run.empty()) {
        for (uint32_t t : e.run) {
            resume(e, e.fibers[t]);
            if (e.failed)
                return false;
        }
        e.run.swap(e.next);
        e.next.clear();
        order(e);
    }
    if (e.live == 0)
        return true;
    /* Nothing can run, yet some fibers wait: a warp op misses a lane that waits at kvl_sync. */
    for (const Warp &w : e.warps) {
        const uint32_t base = w.first - w.first % kWarp;
        for (uint32_t t = base; w.arrived && t < base + kWarp; t++)
            if (e.fibers[t].state != State::AtWarp)
                return missing_lane_error(e, w.op, e.fibers[w.first], e.fibers[t]);
    }
    return set_error(e, "deadlock: %u threads wait forever", e.live); // not reached
}

/* Maps shared memory and one guarded stack per thread; sets up fibers and warps. */
inline bool setup(Engine &e)
{
    const uint32_t n = e.cfg.block.x;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    e.smem_cap = e.cfg.shared_limit_bytes - e.cfg.dyn_shared_bytes;
    size_t smem_len = round_up(e.smem_cap, page);
    size_t dyn_len = round_up(e.cfg.dyn_shared_bytes, page);
    uint32_t threads = n;
    e.stack_bytes = round_up(KVL_EMU_STACK_BYTES, page);
    MapCache &cache = tls_map_cache;
    const bool reuse = cache.map && cache.smem_len >= smem_len && cache.dyn_len >= dyn_len &&
                       cache.threads >= n;
    if (cache.map) { /* reused as it is, or replaced by one that fits both */
        smem_len = std::max(smem_len, cache.smem_len);
        dyn_len = std::max(dyn_len, cache.dyn_len);
        threads = std::max(threads, cache.threads);
    }
    e.smem_len = smem_len;
    e.dyn_len = dyn_len;
    e.threads_mapped = threads;
    e.map_len = smem_len + dyn_len + threads * (page + e.stack_bytes);
    if (reuse) {
        e.map = cache.map; /* its guard pages are in place */
        cache.map = nullptr;
    } else {
        void *m = mmap(nullptr, e.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED)
            return set_error(e, "launch: cannot map %zu bytes of shared memory and stacks",
                             e.map_len);
        e.map = static_cast<unsigned char *>(m);
    }
    e.smem = e.map;
    e.dyn = e.map + smem_len;
#if defined(__cpp_exceptions)
    try {
#endif
        e.fibers.resize(n);
        e.warps.resize(n / kWarp);
        e.run.reserve(n);
        e.next.reserve(n);
#if defined(__cpp_exceptions)
    } catch (const std::bad_alloc &) {
        return set_error(e, "launch: out of memory for %u fibers", n);
    }
#endif
    for (uint32_t t = 0; t < threads; t++) {
        unsigned char *guard = e.dyn + dyn_len + t * (page + e.stack_bytes);
        if (!reuse && mprotect(guard, page, PROT_NONE) != 0)
            return set_error(e, "launch: cannot protect the guard page of a fiber stack");
        if (t < n) {
            e.fibers[t].eng = &e;
            e.fibers[t].tid = t;
            e.fibers[t].stack = guard + page;
        }
    }
    e.rng = e.cfg.seed;
    return true;
}

} // namespace detail
} // inline namespace warp32 / warp64
} // namespace kvl_emu
#endif /* fiber mode */

/* ================================================================== both modes */
namespace kvl_emu {
inline namespace KVL_EMU_IMPL {
namespace detail {

inline int run(const Launch &l, void (*body)(void *), void *obj, char *err, size_t err_len)
{
    Engine e;
    e.cfg = l;
    e.body = body;
    e.body_obj = obj;
    if (validate(e, in_kernel()) && setup(e)) {
        const uint32_t run_x =
            l.run_grid_x != 0 && l.run_grid_x < l.grid.x ? l.run_grid_x : l.grid.x;
        for (uint32_t z = 0; z < l.grid.z && !e.failed; z++)
            for (uint32_t y = 0; y < l.grid.y && !e.failed; y++)
                for (uint32_t x = 0; x < run_x && !e.failed; x++) {
                    e.block = Dim3{x, y, z};
                    if (!run_block(e)) {
                        size_t used = strlen(e.msg);
                        snprintf(e.msg + used, sizeof e.msg - used, " (block %u,%u,%u)", x, y, z);
                    }
                }
    }
    if (err && err_len)
        snprintf(err, err_len, "%s", e.failed ? e.msg : "");
    return e.failed ? 1 : 0;
}

} // namespace detail

/* Runs body() once per thread of every block: the blocks one after another, the threads of
 * a block as fibers (or OS threads). Returns 0, or non-zero with a NUL-terminated message in err. */
template <class F> int launch(const Launch &l, F &&body, char *err, size_t err_len)
{
    auto thunk = [&body] { body(); };
    using Thunk = decltype(thunk);
    return detail::run(l, [](void *p) { (*static_cast<Thunk *>(p))(); }, &thunk, err, err_len);
}

} // inline namespace
} // namespace kvl_emu

/* ------------------------------------------------------------------ kvl_port.h names */
#define KVL_KERNEL [[maybe_unused]] static void
#define KVL_DEVICE static inline

KVL_DEVICE unsigned kvl_thread(void) { return kvl_emu::detail::self().tid; }
KVL_DEVICE unsigned kvl_threads(void) { return kvl_emu::detail::self().eng->cfg.block.x; }
KVL_DEVICE unsigned kvl_block_x(void) { return kvl_emu::detail::self().eng->block.x; }
KVL_DEVICE unsigned kvl_block_y(void) { return kvl_emu::detail::self().eng->block.y; }
KVL_DEVICE unsigned kvl_block_z(void) { return kvl_emu::detail::self().eng->block.z; }
KVL_DEVICE unsigned kvl_blocks_x(void) { return kvl_emu::detail::self().eng->cfg.grid.x; }
KVL_DEVICE unsigned kvl_blocks_y(void) { return kvl_emu::detail::self().eng->cfg.grid.y; }
KVL_DEVICE unsigned kvl_blocks_z(void) { return kvl_emu::detail::self().eng->cfg.grid.z; }
KVL_DEVICE unsigned char *kvl_dyn_shared(void) { return kvl_emu::detail::self().eng->dyn; }
KVL_DEVICE float kvl_exp2(float x) { return exp2f(x); }

/* Collectives and traps record their call site. */
#define kvl_sync() ::kvl_emu::detail::sync_at(__FILE__, __LINE__)
#define kvl_shfl_xor(v, lane_mask)                                                             \
    ::kvl_emu::detail::shfl_xor((v), (lane_mask), __FILE__, __LINE__)
#define kvl_ballot(pred) ::kvl_emu::detail::ballot((pred), __FILE__, __LINE__)
#define kvl_trap() ::kvl_emu::detail::trap_at(__FILE__, __LINE__)
#define KVL_INF __builtin_inff()
#define KVL_SHARED(type, name, count)                                                          \
    type *name = static_cast<type *>(                                                          \
        ::kvl_emu::detail::shared_alloc(sizeof(type) * (count), alignof(type), __FILE__, __LINE__))

/* Emulator only (CUDA/HIP versions would be needed before kernels use them). Return the old
 * value. Fibers of a block are never preempted, so a plain read-modify-write is atomic; OS
 * threads use relaxed atomics (as GPU atomics: no ordering, so they hide no race from TSan). */
#if defined(KVL_EMU_THREADS)
KVL_DEVICE unsigned kvl_atomic_add_u32(unsigned *p, unsigned v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
KVL_DEVICE float kvl_atomic_add_f32(float *p, float v)
{
    float old, sum;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do
        sum = old + v;
    while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
#else
KVL_DEVICE unsigned kvl_atomic_add_u32(unsigned *p, unsigned v)
{
    return std::exchange(*p, *p + v);
}
KVL_DEVICE float kvl_atomic_add_f32(float *p, float v) { return std::exchange(*p, *p + v); }
#endif

#endif /* KVL_EMU_H */

/*
 * kvl_emu_threads.h - the threads mode of the host emulator: kvl_emu.h includes it (and only
 * it should) when KVL_EMU_THREADS is defined, after the parts both modes share (GpuThread,
 * Warp, LaunchState, the checks and error messages, validate); kvl_emu.h then adds run(),
 * launch() and the kvl_port.h names on top of it.
 *
 * Model. launch() starts one OS thread per thread of a block (a pool for the launch, joined
 * before it returns) and runs the blocks one after another: for each block it wakes every
 * thread of the pool, which runs the body once, and waits until all of them are done. The
 * point is ThreadSanitizer (-fsanitize=thread): the threads meet only at mutexes and
 * condition variables, which TSan understands, so a kvl_sync is the happens-before edge a
 * GPU barrier is, and shared-memory accesses that no barrier orders are reported as races.
 *
 * TSan counts every lock taken as an edge from every thread that released that lock before,
 * so the locks follow the edges a GPU has and add no others:
 *   - Engine::sync_m guards the barrier (live, at_sync, sync_first); a thread takes it only to
 *     arrive at kvl_sync or to return, after which it does not touch kernel memory before the
 *     barrier opens (or ever): the edges it brings are the barrier's own.
 *   - WarpLock::m, one per warp, guards the warp op (Warp, its lanes' values and states);
 *     only lanes of that warp take it (and whoever opens a barrier, which orders all anyway).
 *   - Worker::m and Worker::cv, one pair per thread: a waiting thread sleeps on its own pair
 *     until the thread that opens its barrier or completes its warp op sets its `go` (or the
 *     launching thread, at the start of a block, its `start`). Woken threads take no shared
 *     lock, so the order in which the OS wakes them adds no edges.
 *   - Engine::err_m guards the error record; Engine::done_m the count of finished threads.
 * Lock order: sync_m, then WarpLock::m, then err_m or a Worker::m (the last two are leaves).
 *
 * Deadlocks are errors as in fiber mode, found without a global view: a lane that waits at
 * kvl_sync while lanes of its warp wait at a warp op can never go on, and whichever of the two
 * arrives second (under the warp's lock) reports it; a returned lane, divergent barrier and
 * divergent warp op are reported on arrival. An error ends the launch: it is recorded, every
 * thread's `stop` is set and `stopping` raised, and each thread leaves the body at its next
 * primitive (or on waking) by longjmp to its run_body(), skipping the kernel's frames as fiber
 * mode abandons them; then the block ends and launch() joins the pool. The seed is not used
 * (the OS orders the threads); kvl_atomic_add_* are relaxed atomics (kvl_emu.h).
 */
#ifndef KVL_EMU_THREADS_H
#define KVL_EMU_THREADS_H

#if !defined(KVL_EMU_H) || !defined(KVL_EMU_THREADS)
#error "kvl_emu_threads.h: include kvl_emu.h with KVL_EMU_THREADS defined instead"
#endif

#include <pthread.h>
#include <setjmp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

/* Bytes of stack per OS thread. */
#ifndef KVL_EMU_THREAD_STACK_BYTES
#define KVL_EMU_THREAD_STACK_BYTES (1u << 20)
#endif

namespace kvl_emu {
inline namespace KVL_EMU_IMPL {
namespace detail {

struct Engine;

/* One thread of the block, run by one OS thread of the pool. */
struct Worker : GpuThread {
    Engine *eng = nullptr;
    pthread_t os{};
    jmp_buf exit_jump;          // die() jumps back into run_body()
    std::mutex m;               // guards start, go, stop, quit
    std::condition_variable cv;
    bool start = false;         // run the body for the next block
    bool go = false;            // pass the rendezvous it waits at
    bool stop = false;          // the launch failed: leave the body
    bool quit = false;          // the launch is over: end the OS thread
};

struct WarpLock {
    std::mutex m;         // guards the warp's Warp, at_sync, and its lanes' state, site and values
    uint32_t at_sync = 0; // lanes waiting at kvl_sync
};

struct Engine : LaunchState {
    uint32_t n = 0;                         // threads per block
    uint32_t started = 0;                   // OS threads of the pool started
    std::unique_ptr<Worker[]> workers;
    std::unique_ptr<WarpLock[]> warp_locks;
    std::mutex sync_m;                      // guards live, at_sync, sync_first, waiters
    std::vector<uint32_t> waiters[2];       // threads waiting at kvl_sync, and at the last one
    uint32_t cur = 0;                       // waiters[cur] wait now
    std::mutex err_m;                       // guards failed, msg while a block runs
    std::atomic<bool> stopping{false};      // failed, read without a lock (relaxed: no edge)
    std::mutex done_m;                      // guards finished
    std::condition_variable done_cv;
    uint32_t finished = 0;                  // threads of the block that are done
    unsigned char *map = nullptr;           // [static shared | dynamic shared]
    size_t map_len = 0;

    Engine() = default;
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    ~Engine();
};

/* The thread running on this OS thread (null outside a launch). */
inline thread_local Worker *tls_worker = nullptr;
inline Worker &self() { return *tls_worker; }
inline bool in_kernel() { return tls_worker != nullptr; }

/* ------------------------------------------------------------------ waking and leaving */
inline void wake(Worker &w, bool Worker::*flag)
{
    {
        std::lock_guard<std::mutex> g(w.m);
        w.*flag = true;
    }
    w.cv.notify_one();
}

/* Leaves the body (the calling thread is w). Holds no lock. */
[[noreturn]] inline void die(Worker &w) { longjmp(w.exit_jump, 1); }

/* Sleeps until woken; leaves the body when the launch failed meanwhile. */
inline void wait(Worker &w)
{
    bool stop;
    {
        std::unique_lock<std::mutex> lk(w.m);
        w.cv.wait(lk, [&w] { return w.go || w.stop; });
        w.go = false;
        stop = w.stop;
    }
    if (stop)
        die(w);
}

/* After an error was recorded: every thread of the block leaves at its next step. */
inline void stop_all(Engine &e)
{
    e.stopping.store(true, std::memory_order_relaxed);
    for (uint32_t t = 0; t < e.n; t++)
        wake(e.workers[t], &Worker::stop);
}

[[noreturn]] inline void fail(Worker &w)
{
    stop_all(*w.eng);
    die(w);
}

inline void check_stop(Worker &w)
{
    if (w.eng->stopping.load(std::memory_order_relaxed))
        die(w);
}

/* ------------------------------------------------------------------ barrier */
/* The threads a barrier lets pass, to wake after sync_m is released: woken threads need not
 * wait for it. No one else reads or writes the list until all of them are awake (the next
 * barrier cannot open before). */
struct Passing {
    const uint32_t *tids = nullptr;
    size_t count = 0;
};

/* Under sync_m: every thread waiting at kvl_sync passes (once woken). */
inline Passing open_barrier(Engine &e)
{
    std::vector<uint32_t> &list = e.waiters[e.cur];
    for (uint32_t t : list) {
        WarpLock &wl = e.warp_locks[t / kWarp];
        std::lock_guard<std::mutex> g(wl.m);
        e.workers[t].state = State::Ready;
        wl.at_sync--;
    }
    e.cur ^= 1;
    e.waiters[e.cur].clear();
    e.at_sync = 0;
    return Passing{list.data(), list.size()};
}

/* Without locks: the threads of an opened barrier go on. */
inline void pass(Engine &e, Passing p)
{
    for (size_t i = 0; i < p.count; i++)
        wake(e.workers[p.tids[i]], &Worker::go);
}

inline void sync_at(const char *file, int line)
{
    Worker &w = self();
    Engine &e = *w.eng;
    check_stop(w);
    const uint32_t wi = w.tid / kWarp;
    WarpLock &wl = e.warp_locks[wi];
    bool ok = true;
    Passing opened;
    {
        std::lock_guard<std::mutex> g(wl.m);
        w.file = file;
        w.line = line;
        w.rendezvous++;
        w.state = State::AtSync;
        const Warp &wp = e.warps[wi];
        if (wp.arrived) { // lanes of its warp wait at a warp op it cannot reach before they go on
            std::lock_guard<std::mutex> ge(e.err_m);
            ok = missing_lane_error(e, wp.op, e.workers[wp.first], w);
        } else {
            wl.at_sync++;
        }
    }
    if (!ok)
        fail(w);
    {
        std::lock_guard<std::mutex> g(e.sync_m);
        if (e.at_sync == 0) {
            e.sync_first = w.tid;
        } else if (!same_site(w, e.workers[e.sync_first])) {
            std::lock_guard<std::mutex> ge(e.err_m);
            ok = divergent_barrier_error(e, e.workers[e.sync_first], w);
        }
        if (ok) {
            e.waiters[e.cur].push_back(w.tid);
            if (++e.at_sync == e.live)
                opened = open_barrier(e);
        }
    }
    if (!ok)
        fail(w);
    pass(e, opened);
    wait(w);
}

/* ------------------------------------------------------------------ warp ops */
/* The calling lane has deposited its value; waits for the other lanes of its warp. */
inline void warp_op(Worker &w, Op op, const char *file, int line)
{
    Engine &e = *w.eng;
    check_stop(w);
    const uint32_t wi = w.tid / kWarp;
    WarpLock &wl = e.warp_locks[wi];
    Warp &wp = e.warps[wi];
    Worker *lanes = &e.workers[wi * kWarp];
    bool ok = true, complete = false;
    {
        std::lock_guard<std::mutex> g(wl.m);
        w.file = file;
        w.line = line;
        w.rendezvous++;
        if (wp.returned || wl.at_sync) { // a lane that will not come
            uint32_t i = 0;
            while (lanes[i].state != State::Done && lanes[i].state != State::AtSync)
                i++;
            std::lock_guard<std::mutex> ge(e.err_m);
            ok = missing_lane_error(e, op, w, lanes[i]);
        } else if (wp.arrived && (wp.op != op || !same_site(w, e.workers[wp.first]))) {
            std::lock_guard<std::mutex> ge(e.err_m);
            ok = divergent_warp_error(e, e.workers[wp.first], wp.op, w, op);
        } else {
            if (wp.arrived == 0) {
                wp.op = op;
                wp.first = w.tid;
            }
            w.state = State::AtWarp;
            if (++wp.arrived == kWarp) {
                wp.arrived = 0;
                warp_results(op, lanes);
                for (uint32_t i = 0; i < kWarp; i++)
                    lanes[i].state = State::Ready;
                complete = true;
            }
        }
    }
    if (!ok)
        fail(w);
    for (uint32_t i = 0; complete && i < kWarp; i++) // the next op of the warp needs them all
        wake(lanes[i], &Worker::go);
    wait(w);
}

inline float shfl_xor(float v, int lane_mask, const char *file, int line)
{
    Worker &w = self();
    if (lane_mask < 0 || lane_mask >= int(kWarp)) {
        {
            std::lock_guard<std::mutex> ge(w.eng->err_m);
            lane_mask_error(*w.eng, file, line, w.tid, lane_mask);
        }
        fail(w);
    }
    w.fval = v;
    w.xmask = lane_mask;
    warp_op(w, Op::Shfl, file, line);
    return w.fres;
}

inline kvl_lane_mask_t ballot(int pred, const char *file, int line)
{
    Worker &w = self();
    w.pred = pred != 0;
    warp_op(w, Op::Ballot, file, line);
    return w.bres;
}

/* ------------------------------------------------------------------ other primitives */
[[noreturn]] inline void trap_at(const char *file, int line)
{
    Worker &w = self();
    {
        std::lock_guard<std::mutex> ge(w.eng->err_m);
        trap_error(*w.eng, file, line, w.tid);
    }
    fail(w);
}

/* Static shared memory is filled with 0xff by the launching thread at the start of a block. */
inline void *shared_alloc(size_t bytes, size_t align, const char *file, int line)
{
    Worker &w = self();
    Engine &e = *w.eng;
    size_t at = shared_offset(e, w, align);
    if (at + bytes > e.smem_cap) {
        {
            std::lock_guard<std::mutex> ge(e.err_m);
            shared_limit_error(e, file, line, at + bytes);
        }
        fail(w);
    }
    w.shared_used = at + bytes;
    return e.smem + at;
}

/* ------------------------------------------------------------------ the pool */
/* The calling thread has returned from the body: it leaves later barriers. */
inline void leave(Worker &w)
{
    Engine &e = *w.eng;
    const uint32_t wi = w.tid / kWarp;
    WarpLock &wl = e.warp_locks[wi];
    bool ok = true;
    {
        std::lock_guard<std::mutex> g(wl.m);
        Warp &wp = e.warps[wi];
        w.state = State::Done;
        wp.returned++;
        if (wp.arrived) { // that warp op can never complete
            std::lock_guard<std::mutex> ge(e.err_m);
            ok = missing_lane_error(e, wp.op, e.workers[wp.first], w);
        }
    }
    if (!ok) {
        stop_all(e);
        return;
    }
    Passing opened;
    {
        std::lock_guard<std::mutex> g(e.sync_m);
        e.live--;
        if (e.at_sync && e.at_sync == e.live)
            opened = open_barrier(e);
    }
    pass(e, opened);
}

/* Runs the body once as thread w; returns when it returned or left by die(). */
inline void run_body(Worker &w)
{
    if (setjmp(w.exit_jump) == 0) {
        w.eng->body(w.eng->body_obj);
        leave(w);
    }
}

inline void *worker_main(void *arg)
{
    Worker &w = *static_cast<Worker *>(arg);
    Engine &e = *w.eng;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(w.m);
            w.cv.wait(lk, [&w] { return w.start || w.quit; });
            if (w.quit)
                return nullptr;
            w.start = false;
        }
        tls_worker = &w;
        run_body(w);
        tls_worker = nullptr;
        std::lock_guard<std::mutex> g(e.done_m);
        if (++e.finished == e.n)
            e.done_cv.notify_one();
    }
}

/* Runs one block; false on error. The pool is idle before and after. */
inline bool run_block(Engine &e)
{
    memset(e.dyn, 0xff, e.cfg.dyn_shared_bytes);
    memset(e.smem, 0xff, e.smem_cap);
    e.smem_filled = e.smem_cap;
    e.live = e.n;
    e.at_sync = 0;
    e.waiters[0].clear();
    e.waiters[1].clear();
    for (Warp &w : e.warps)
        w = Warp{};
    for (uint32_t i = 0; i < e.n / kWarp; i++)
        e.warp_locks[i].at_sync = 0;
    {
        std::lock_guard<std::mutex> g(e.done_m);
        e.finished = 0;
    }
    for (uint32_t t = 0; t < e.n; t++) { // all before any runs: lanes read each other's
        e.workers[t].state = State::Ready;
        e.workers[t].shared_used = 0;
    }
    for (uint32_t t = 0; t < e.n; t++) {
        /* A failed block may have left a `go` behind (a rendezvous completed by a lane after
         * a waiting one left): none of this block's is sent before it starts. */
        Worker &w = e.workers[t];
        {
            std::lock_guard<std::mutex> g(w.m);
            w.stop = false;
            w.go = false;
            w.start = true;
        }
        w.cv.notify_one();
    }
    std::unique_lock<std::mutex> lk(e.done_m);
    e.done_cv.wait(lk, [&e] { return e.finished == e.n; });
    return !e.failed;
}

/* Maps shared memory; starts the pool. */
inline bool setup(Engine &e)
{
    const uint32_t n = e.cfg.block.x;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    e.smem_cap = e.cfg.shared_limit_bytes - e.cfg.dyn_shared_bytes;
    const size_t smem_len = round_up(e.smem_cap, page);
    e.map_len = std::max(smem_len + round_up(e.cfg.dyn_shared_bytes, page), page);
    void *m = mmap(nullptr, e.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return set_error(e, "launch: cannot map %zu bytes of shared memory", e.map_len);
    e.map = static_cast<unsigned char *>(m);
    e.smem = e.map;
    e.dyn = e.map + smem_len;
#if defined(__cpp_exceptions)
    try {
#endif
        e.warps.resize(n / kWarp);
        e.waiters[0].reserve(n);
        e.waiters[1].reserve(n);
#if defined(__cpp_exceptions)
    } catch (const std::bad_alloc &) {
        return set_error(e, "launch: out of memory for %u threads", n);
    }
#endif
    e.workers.reset(new (std::nothrow) Worker[n]);
    e.warp_locks.reset(new (std::nothrow) WarpLock[n / kWarp]);
    if (!e.workers || !e.warp_locks)
        return set_error(e, "launch: out of memory for %u threads", n);
    e.n = n;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, KVL_EMU_THREAD_STACK_BYTES);
    int rc = 0;
    for (uint32_t t = 0; t < n && rc == 0; t++) {
        Worker &w = e.workers[t];
        w.eng = &e;
        w.tid = t;
        rc = pthread_create(&w.os, &attr, worker_main, &w);
        if (rc == 0)
            e.started++;
    }
    pthread_attr_destroy(&attr);
    if (rc != 0)
        return set_error(e, "launch: cannot start OS thread %u of %u: %s", e.started, n,
                         strerror(rc));
    return true;
}

/* Ends and joins the pool (idle: between blocks), unmaps shared memory. */
inline Engine::~Engine()
{
    for (uint32_t t = 0; t < started; t++)
        wake(workers[t], &Worker::quit);
    for (uint32_t t = 0; t < started; t++)
        pthread_join(workers[t].os, nullptr);
    if (map)
        munmap(map, map_len);
}

} // namespace detail
} // inline namespace threads_warp32 / threads_warp64
} // namespace kvl_emu

#endif /* KVL_EMU_THREADS_H */

/*
 * selftest.cpp - checks of the host emulator (kvl_emu.h) through kvl_port.h only.
 * Build with -DKVL_WARP=32 or 64 (see selftest.sh). Prints PASS/FAIL per check; exits
 * non-zero on any failure.
 *   -DKVL_SELFTEST_NO_MAIN      only defines selftest_w<KVL_WARP>() (to link the two widths)
 *   -DKVL_SELFTEST_WITH_OTHER   main() also runs the other width's selftest_w<..>()
 *   -DKVL_SELFTEST_PLANT_OOB    main() runs a kernel writing one float past a heap buffer
 *   -DKVL_SELFTEST_PLANT_RACE   main() runs kern::neighbour without its barrier (a data race)
 *   -DKVL_SELFTEST_SPEED_LIMIT_MS=n  the speed check's limit (default 1000; 10000 with threads)
 * With -DKVL_EMU_THREADS (the emulator's threads mode, for ThreadSanitizer) the launches are
 * fewer and smaller (OS threads are slow to start and wake), and the order checks only ask for
 * a permutation (the OS orders the threads). Every kernel but the planted ones is race-free.
 */
#define KVL_EMU 1
#ifndef KVL_WARP
#define KVL_WARP 32
#endif
#include "kvl_port.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(KVL_EMU_THREADS)
#define ST_THREADS_MODE 1
#else
#define ST_THREADS_MODE 0
#endif

#ifndef KVL_SELFTEST_SPEED_LIMIT_MS
#define KVL_SELFTEST_SPEED_LIMIT_MS (ST_THREADS_MODE ? 10000 : 1000)
#endif

/* ------------------------------------------------------------------ kernels (port API only) */
namespace kern {

KVL_DEVICE float warp_sum(float x)
{
    for (int m = KVL_WARP / 2; m > 0; m /= 2)
        x += kvl_shfl_xor(x, m);
    return x;
}

KVL_DEVICE unsigned flat_block(void)
{
    return (kvl_block_z() * kvl_blocks_y() + kvl_block_y()) * kvl_blocks_x() + kvl_block_x();
}

/* out[b] = sum of the block's inputs; dims[b] = its indices and the grid; tids = kvl_thread(). */
KVL_KERNEL reduce(const float *in, float *out, unsigned *dims, unsigned *tids)
{
    KVL_SHARED(float, part, 1024 / KVL_WARP);
    unsigned b = flat_block(), t = kvl_thread();
    tids[b * kvl_threads() + t] = t;
    float x = warp_sum(in[b * kvl_threads() + t]);
    if (kvl_lane() == 0)
        part[kvl_warp()] = x;
    kvl_sync();
    if (kvl_warp() == 0) {
        float y = warp_sum(kvl_lane() < kvl_warps() ? part[kvl_lane()] : 0.0f);
        if (kvl_lane() == 0) {
            out[b] = y;
            unsigned d[6] = {kvl_block_x(), kvl_block_y(), kvl_block_z(),
                             kvl_blocks_x(), kvl_blocks_y(), kvl_blocks_z()};
            for (int i = 0; i < 6; i++)
                dims[b * 6 + i] = d[i];
        }
    }
}

KVL_KERNEL ballot(const int *pred, unsigned long long *out)
{
    unsigned t = kvl_thread();
    out[t] = kvl_ballot(pred[t]);
}

/* Ping-pong through shared memory while threads leave: t % 3 == 1 before the loop,
 * t % 4 == 0 in round 2. */
KVL_KERNEL early_exit(float *out)
{
    KVL_SHARED(float, buf, 2 * 1024);
    unsigned t = kvl_thread(), n = kvl_threads();
    buf[t] = float(t);
    buf[1024 + t] = -1.0f;
    kvl_sync();
    if (t % 3 == 1)
        return;
    float *src = buf, *dst = buf + 1024;
    for (int r = 0; r < 4; r++) {
        if (r == 2 && t % 4 == 0)
            return;
        dst[t] = src[(t + 1) % n] + 1.0f;
        kvl_sync();
        float *tmp = src;
        src = dst;
        dst = tmp;
    }
    out[kvl_block_x() * n + t] = src[t];
}

KVL_KERNEL divergent(float *out)
{
    unsigned t = kvl_thread();
    if (t & 1) {
        kvl_sync();
    } else {
        kvl_sync();
    }
    out[t] = 1.0f;
}

KVL_KERNEL shfl_missing(float *out, unsigned gone_lane)
{
    unsigned t = kvl_thread();
    if (kvl_lane() == gone_lane)
        return;
    out[t] = kvl_shfl_xor(float(t), 1);
}

KVL_KERNEL shfl_vs_sync(float *out)
{
    unsigned t = kvl_thread();
    if (kvl_lane() == 3) {
        kvl_sync();
    } else {
        out[t] = kvl_shfl_xor(float(t), 1);
    }
}

KVL_KERNEL shfl_vs_ballot(float *out)
{
    unsigned t = kvl_thread();
    if (kvl_lane() == 2)
        out[t] = float(kvl_ballot(1));
    else
        out[t] = kvl_shfl_xor(float(t), 1);
}

KVL_KERNEL trap(unsigned *ran)
{
    if (kvl_thread() == 7 && kvl_block_x() == 1)
        kvl_trap();
    kvl_sync();
    ran[kvl_block_x() * kvl_threads() + kvl_thread()] = 1;
}

/* Thread `who` traps in round 3 while the others are at barriers and warp ops; entries[]
 * counts how often each thread starts the body. */
KVL_KERNEL trap_busy(unsigned *entries, unsigned who)
{
    KVL_SHARED(float, s, 1024);
    unsigned t = kvl_thread(), n = kvl_threads();
    entries[kvl_block_x() * n + t]++;
    s[t] = float(t);
    for (unsigned r = 0; r < 6; r++) {
        kvl_sync();
        float x = warp_sum(s[(t + r) % n]);
        if (r == 3 && t == who)
            kvl_trap();
        kvl_sync();
        s[t] = x;
    }
}

KVL_KERNEL big_shared(float *out)
{
    KVL_SHARED(float, big, 10000);
    big[kvl_thread()] = 1.0f;
    out[kvl_thread()] = big[kvl_thread()];
}

/* Per thread: addresses of three static arrays, the first words of static and dynamic
 * shared memory before any write, and what it reads after the writes. */
KVL_KERNEL shared(unsigned long long *addr, unsigned *before, unsigned *after)
{
    unsigned t = kvl_thread(), n = kvl_threads(), b = kvl_block_x(), i = b * n + t;
    KVL_SHARED(char, c, 3);
    KVL_SHARED(double, d, 2);
    KVL_SHARED(unsigned, s, 4);
    unsigned *dw = (unsigned *)kvl_dyn_shared();
    before[2 * i] = s[0];
    before[2 * i + 1] = dw[t];
    kvl_sync();
    if (t == 0)
        s[0] = b + 1;
    dw[t] = t * 3 + b;
    if (t < 3)
        c[t] = 'x';
    if (t < 2)
        d[t] = 1.0;
    kvl_sync();
    addr[4 * i] = (unsigned long long)c;
    addr[4 * i + 1] = (unsigned long long)d;
    addr[4 * i + 2] = (unsigned long long)s;
    addr[4 * i + 3] = (unsigned long long)kvl_dyn_shared();
    after[2 * i] = s[0];
    after[2 * i + 1] = dw[(t + 1) % n];
}

/* The order in which threads pass a barrier. */
KVL_KERNEL order(unsigned *ctr, unsigned *ord, float *fsum)
{
    unsigned t = kvl_thread();
    kvl_sync();
    ord[t] = kvl_atomic_add_u32(ctr, 1);
    kvl_atomic_add_f32(fsum, 0.5f);
}

KVL_KERNEL barriers(float *out)
{
    KVL_SHARED(float, s, 1024);
    unsigned t = kvl_thread(), n = kvl_threads();
    s[t] = float(t);
    float acc = 0.0f;
    for (unsigned i = 0; i < 8; i++) {
        kvl_sync();
        acc += s[(t + i) % n];
    }
    out[kvl_block_x() * n + t] = acc;
}

KVL_KERNEL fill(float *buf) { buf[kvl_thread()] = kvl_exp2(1.0f); }

/* Each thread writes its slot of shared memory, then reads its neighbour's: the barrier
 * between orders them (-DKVL_SELFTEST_PLANT_RACE removes it: ThreadSanitizer must object). */
KVL_KERNEL neighbour(float *out)
{
    KVL_SHARED(float, s, 1024);
    unsigned t = kvl_thread(), n = kvl_threads();
    s[t] = float(t);
#if !defined(KVL_SELFTEST_PLANT_RACE)
    kvl_sync();
#endif
    out[kvl_block_x() * n + t] = s[(t + 1) % n];
}

} // namespace kern

/* ------------------------------------------------------------------ harness */
#define ST_CAT2(a, b) a##b
#define ST_CAT(a, b) ST_CAT2(a, b)
#define SELFTEST_FN ST_CAT(selftest_w, KVL_WARP)
int selftest_w32();
int selftest_w64();

namespace {

const unsigned W = KVL_WARP;
int g_fail = 0;

/* Threads mode starts a pool of OS threads per launch (slow, under ThreadSanitizer more so)
 * and has no seeded orders: fewer launches there. */
#if ST_THREADS_MODE
const int kRepeats = 2;                 // of the concurrent launches
const unsigned kSpeedBlocks = 16;       // of the speed check
const unsigned kSeedThreads = 256;      // per block in the seed checks
const kvl_emu::Dim3 kGrids[] = {{1, 1, 1}, {2, 2, 2}};
const uint64_t kSeeds[] = {0};       // of the early returns
#else
const int kRepeats = 20;
const unsigned kSpeedBlocks = 256;
const unsigned kSeedThreads = 512;
const kvl_emu::Dim3 kGrids[] = {{1, 1, 1}, {3, 1, 1}, {2, 3, 1}, {2, 2, 3}};
const uint64_t kSeeds[] = {0, 5};
#endif

void check(bool ok, const std::string &what)
{
    printf("%s [warp %u] %s\n", ok ? "PASS" : "FAIL", W, what.c_str());
    if (!ok)
        g_fail++;
}

kvl_emu::Launch cfg(kvl_emu::Dim3 grid, uint32_t threads, uint32_t dyn = 0, uint64_t seed = 0)
{
    kvl_emu::Launch l;
    l.grid = grid;
    l.block.x = threads;
    l.dyn_shared_bytes = dyn;
    l.shared_limit_bytes = 48 * 1024;
    l.seed = seed;
    return l;
}

template <class F> int go(const kvl_emu::Launch &l, F &&body, std::string *msg = nullptr)
{
    char err[512];
    int rc = kvl_emu::launch(l, body, err, sizeof err);
    if (msg)
        *msg = err;
    return rc;
}

bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

/* Launch of kern::reduce; true when sums, indices and thread ids are right. */
bool reduce_ok(kvl_emu::Dim3 g, unsigned threads, uint64_t seed)
{
    unsigned nb = g.x * g.y * g.z;
    std::vector<float> in(size_t(nb) * threads), out(nb, -1.0f);
    std::vector<unsigned> dims(nb * 6, 0), tids(in.size(), ~0u);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = float((i * 37 + 11) % 101);
    std::string msg;
    if (go(cfg(g, threads, 0, seed), [&] { kern::reduce(in.data(), out.data(), dims.data(), tids.data()); }, &msg)) {
        printf("  launch failed: %s\n", msg.c_str());
        return false;
    }
    for (unsigned b = 0; b < nb; b++) {
        double want = 0;
        for (unsigned t = 0; t < threads; t++) {
            want += in[size_t(b) * threads + t];
            if (tids[size_t(b) * threads + t] != t)
                return false;
        }
        unsigned want_dims[6] = {b % g.x, b / g.x % g.y, b / (g.x * g.y), g.x, g.y, g.z};
        if (out[b] != float(want) || memcmp(&dims[b * 6], want_dims, sizeof want_dims) != 0)
            return false;
    }
    return true;
}

void test_reduce()
{
    for (unsigned threads : {W, 2 * W, 3 * W, 256u, 512u, 1024u}) {
        bool ok = true;
        char names[64] = "";
        for (const auto &g : kGrids) {
            ok = ok && reduce_ok(g, threads, 0);
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, " %ux%ux%u", g.x, g.y, g.z);
        }
        check(ok, "1 block reduction, " + std::to_string(threads) + " threads, grids" + names);
    }
}

void test_ballot()
{
    const unsigned n = 4 * W;
    std::vector<int> pred(n);
    std::vector<unsigned long long> out(n, 0), want(4, 0);
    for (unsigned t = 0; t < n; t++) {
        unsigned lane = t % W, w = t / W;
        pred[t] = w == 0 ? int((lane * 2654435761u) >> 7) & 1 // scattered
                : w == 1 ? (lane >= W - 3 ? -5 : 0)           // top lanes, non-one values
                : w == 2 ? lane == W - 1                      // the last lane only
                         : 7;                                 // all
        if (pred[t])
            want[w] |= 1ull << lane;
    }
    std::string msg;
    int rc = go(cfg({1, 1, 1}, n), [&] { kern::ballot(pred.data(), out.data()); }, &msg);
    bool ok = rc == 0 && sizeof(kvl_lane_mask_t) * 8 == W;
    for (unsigned t = 0; t < n; t++)
        ok = ok && out[t] == want[t / W];
    ok = ok && want[2] == 1ull << (W - 1) && want[3] == (W == 64 ? ~0ull : 0xffffffffull);
    check(ok, "2 kvl_ballot mask equals the predicate bits over " + std::to_string(W) + " lanes");
}

void test_early_exit()
{
    for (unsigned threads : {W, 96u * W / 32, 1024u})
        for (uint64_t seed : kSeeds) {
            const unsigned blocks = 2, n = threads;
            std::vector<float> out(blocks * n, -7.0f);
            std::string msg;
            int rc = go(cfg({blocks, 1, 1}, n, 0, seed), [&] { kern::early_exit(out.data()); }, &msg);
            std::vector<float> a(n), b(n, -1.0f);
            std::vector<bool> alive(n);
            for (unsigned t = 0; t < n; t++) {
                a[t] = float(t);
                alive[t] = t % 3 != 1;
            }
            std::vector<float> *src = &a, *dst = &b;
            for (int r = 0; r < 4; r++) {
                for (unsigned t = 0; t < n; t++)
                    if (r == 2 && t % 4 == 0)
                        alive[t] = false;
                for (unsigned t = 0; t < n; t++)
                    if (alive[t])
                        (*dst)[t] = (*src)[(t + 1) % n] + 1.0f;
                std::swap(src, dst);
            }
            bool ok = rc == 0;
            for (unsigned blk = 0; blk < blocks; blk++)
                for (unsigned t = 0; t < n; t++)
                    ok = ok && out[blk * n + t] == (alive[t] ? (*src)[t] : -7.0f);
            check(ok, "3 early returns leave later barriers, " + std::to_string(n) + " threads, seed " +
                          std::to_string(seed) + (rc ? " (" + msg + ")" : ""));
        }
}

void test_errors()
{
    std::vector<float> out(1024, 0.0f);
    std::string msg;
    int rc = go(cfg({1, 1, 1}, 2 * W), [&] { kern::divergent(out.data()); }, &msg);
    check(rc != 0 && has(msg, "divergent barrier") && has(msg, "selftest.cpp"),
          "4 divergent barrier fails: " + msg);

    for (unsigned lane : {5u, 0u})
        for (uint64_t seed : {0ull, 3ull}) {
            rc = go(cfg({1, 1, 1}, 2 * W, 0, seed), [&] { kern::shfl_missing(out.data(), lane); }, &msg);
            check(rc != 0 && has(msg, "has returned") && has(msg, "lane " + std::to_string(lane)),
                  "5 kvl_shfl_xor with a returned lane fails: " + msg);
        }
    rc = go(cfg({1, 1, 1}, W), [&] { kern::shfl_vs_sync(out.data()); }, &msg);
    check(rc != 0 && has(msg, "waits at kvl_sync"), "5 kvl_shfl_xor with a lane at kvl_sync fails: " + msg);
    rc = go(cfg({1, 1, 1}, W), [&] { kern::shfl_vs_ballot(out.data()); }, &msg);
    check(rc != 0 && has(msg, "divergent warp op"), "5 kvl_shfl_xor beside kvl_ballot fails: " + msg);

    std::vector<unsigned> ran(3 * 64, 0);
    rc = go(cfg({3, 1, 1}, 64), [&] { kern::trap(ran.data()); }, &msg);
    bool later_blocks_ran = false;
    for (unsigned i = 64; i < ran.size(); i++)
        later_blocks_ran = later_blocks_ran || ran[i];
    check(rc != 0 && has(msg, "trapped") && has(msg, "block 1,0,0") && !later_blocks_ran && ran[0],
          "6 kvl_trap fails the launch and stops it: " + msg);

    bool once = true;
    for (unsigned who : {0u, W + 5, 255u}) {
        std::vector<unsigned> entries(2 * 256, 0);
        rc = go(cfg({2, 1, 1}, 256), [&] { kern::trap_busy(entries.data(), who); }, &msg);
        once = once && rc != 0 && has(msg, "trapped") && has(msg, "block 0,0,0");
        for (unsigned i = 0; i < entries.size(); i++)
            once = once && entries[i] == (i < 256 ? 1u : 0u);
    }
    check(once, "6 a trap amid barriers and warp ops: each thread ran once, the next block not at all");

    struct Bad {
        kvl_emu::Launch l;
        std::string a, b;
    };
    std::vector<Bad> bad;
    bad.push_back({cfg({1, 1, 1}, 1025), "1025", "1024"});
    bad.push_back({cfg({1, 1, 1}, W + 1), std::to_string(W + 1), std::to_string(W)});
    bad.push_back({cfg({1, 1, 1}, W, 50000), "50000", "49152"});
    bad.push_back({cfg({1, 65536, 1}, W), "65536", "65535"});
    bad.push_back({cfg({0, 1, 1}, W), "grid.x = 0", "2147483647"});
    bad.push_back({cfg({1, 1, 1}, W), "block.y = 2", "1..1"});
    bad.back().l.block.y = 2;
    for (const Bad &c : bad) {
        bool ran_body = false;
        rc = go(c.l, [&] { ran_body = true; }, &msg);
        check(rc != 0 && !ran_body && has(msg, c.a) && has(msg, c.b), "6 invalid launch fails: " + msg);
    }
    rc = go(cfg({1, 1, 1}, W, 10000), [&] { kern::big_shared(out.data()); }, &msg);
    check(rc != 0 && has(msg, "KVL_SHARED") && has(msg, "49152"), "6 static shared over the limit fails: " + msg);
    rc = go(cfg({1, 1, 1}, W, 8000), [&] { kern::big_shared(out.data()); }, &msg);
    check(rc == 0 && out[W - 1] == 1.0f, "6 static shared just under the limit runs " + msg);
}

void test_shared()
{
    const unsigned n = 256, blocks = 4, N = n * blocks;
    std::vector<unsigned long long> addr(4 * N);
    std::vector<unsigned> before(2 * N), after(2 * N);
    std::string msg;
    int rc = go(cfg({blocks, 1, 1}, n, 4 * n + 4), [&] { kern::shared(addr.data(), before.data(), after.data()); }, &msg);
    bool same = rc == 0, fresh = rc == 0, dyn_ok = rc == 0;
    for (unsigned i = 0; i < N; i++) {
        unsigned b = i / n, t = i % n;
        for (int k = 0; k < 4; k++)
            same = same && addr[4 * i + k] == addr[k]; // one address in every thread and block
        fresh = fresh && before[2 * i] == 0xffffffffu && before[2 * i + 1] == 0xffffffffu && after[2 * i] == b + 1;
        dyn_ok = dyn_ok && addr[4 * i + 3] % 16 == 0 && after[2 * i + 1] == (t + 1) % n * 3 + b;
    }
    same = same && addr[1] % 8 == 0 && addr[1] >= addr[0] + 3 && addr[2] >= addr[1] + 16;
    check(same, "7 KVL_SHARED arrays: same address in all threads, aligned, disjoint");
    check(fresh, "7 shared memory is fresh (0xff) in every block");
    check(dyn_ok, "7 kvl_dyn_shared is 16-aligned and shared by the block " + msg);
}

void test_threads()
{
    bool ok[2] = {false, false};
    auto worker = [&](int k) {
        bool good = true;
        for (int i = 0; i < kRepeats; i++)
            good = good && reduce_ok({2, 2, 1}, k ? 1024 : 256, uint64_t(i * k));
        ok[k] = good;
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    check(ok[0] && ok[1], "8 two OS threads launching concurrently both get correct results");
}

void test_seeds()
{
    const unsigned n = kSeedThreads;
    std::vector<float> ref;
    bool same = true;
    for (uint64_t seed : {0ull, 1ull, 2ull}) {
        std::vector<float> out(3 * n);
        same = same && go(cfg({3, 1, 1}, n, 0, seed), [&] { kern::barriers(out.data()); }) == 0;
        same = same && reduce_ok({3, 2, 1}, n, seed);
        if (ref.empty())
            ref = out;
        same = same && out == ref;
    }
    check(same, "9 results identical for seeds 0, 1, 2");

    auto order_of = [&](uint64_t seed, float *fsum) {
        std::vector<unsigned> ord(n, ~0u);
        unsigned ctr = 0;
        *fsum = 0.0f;
        go(cfg({1, 1, 1}, n, 0, seed), [&] { kern::order(&ctr, ord.data(), fsum); });
        return ord;
    };
    float f0, f1, f2, f3;
    std::vector<unsigned> o0 = order_of(0, &f0), o1 = order_of(1, &f1), o1b = order_of(1, &f2), o2 = order_of(2, &f3);
    std::vector<unsigned> sorted = o1;
    std::sort(sorted.begin(), sorted.end());
#if ST_THREADS_MODE
    bool perm = true;
    for (const std::vector<unsigned> *o : {&o0, &o1b, &o2}) {
        std::vector<unsigned> s = *o;
        std::sort(s.begin(), s.end());
        perm = perm && s == sorted;
    }
    for (unsigned t = 0; t < n; t++)
        perm = perm && sorted[t] == t;
    check(perm, "9 threads pass the barrier in some order (threads mode: the OS picks it)");
#else
    bool in_order = true;
    for (unsigned t = 0; t < n; t++)
        in_order = in_order && o0[t] == t;
    check(in_order, "9 seed 0 resumes threads in order");
    check(o1 == o1b && o1 != o2 && sorted == o0, "9 a seed gives a deterministic permutation; seeds 1 and 2 differ");
#endif
    check(f0 == 0.5f * n && f1 == f0 && f2 == f0 && f3 == f0, "9 kvl_atomic_add_u32/f32");
}

void test_neighbour()
{
    const unsigned blocks = 2, n = 4 * W;
    std::vector<float> out(blocks * n, -1.0f);
    std::string msg;
    int rc = go(cfg({blocks, 1, 1}, n), [&] { kern::neighbour(out.data()); }, &msg);
    bool ok = rc == 0;
    for (unsigned i = 0; i < blocks * n; i++)
        ok = ok && out[i] == float((i % n + 1) % n);
    check(ok, "11 a barrier orders shared-memory writes before the neighbours' reads" + (rc ? " (" + msg + ")" : ""));
}

void test_speed()
{
    const unsigned blocks = kSpeedBlocks, n = 256;
    std::vector<float> out(blocks * n);
    auto t0 = std::chrono::steady_clock::now();
    int rc = go(cfg({blocks, 1, 1}, n), [&] { kern::barriers(out.data()); });
    auto t1 = std::chrono::steady_clock::now();
    int rc2 = go(cfg({blocks, 1, 1}, n), [&] { kern::fill(out.data()); });
    auto t2 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    double ms_free = std::chrono::duration<double, std::milli>(t2 - t1).count();
    bool ok = rc == 0 && rc2 == 0 && ms < KVL_SELFTEST_SPEED_LIMIT_MS;
    char line[200];
    snprintf(line, sizeof line, "10 speed: %u blocks x 256 threads x 8 barriers %.1f ms, no barrier %.1f ms (limit %d ms)",
             blocks, ms, ms_free, KVL_SELFTEST_SPEED_LIMIT_MS);
    check(ok, line);
}

} // namespace

int SELFTEST_FN()
{
    test_reduce();
    test_ballot();
    test_early_exit();
    test_errors();
    test_shared();
    test_threads();
    test_seeds();
    test_neighbour();
    test_speed();
    return g_fail;
}

#if defined(KVL_SELFTEST_PLANT_OOB)
int main()
{
    /* One float short: the last thread writes one element past the buffer; ASan must say so. */
    float *buf = static_cast<float *>(malloc((W - 1) * sizeof(float)));
    std::string msg;
    int rc = go(cfg({1, 1, 1}, W), [&] { kern::fill(buf); }, &msg);
    free(buf);
    printf("no ASan report (rc %d %s)\n", rc, msg.c_str());
    return 1;
}
#elif defined(KVL_SELFTEST_PLANT_RACE)
int main()
{
    /* kern::neighbour without its barrier; built with -DKVL_EMU_THREADS -fsanitize=thread,
     * ThreadSanitizer must report a data race (and make the exit status non-zero). */
    std::vector<float> out(2 * 4 * W);
    std::string msg;
    int rc = go(cfg({2, 1, 1}, 4 * W), [&] { kern::neighbour(out.data()); }, &msg);
    printf("planted race ran (rc %d %s)\n", rc, msg.c_str());
    return rc;
}
#elif !defined(KVL_SELFTEST_NO_MAIN)
int main()
{
    int fails = SELFTEST_FN();
#if defined(KVL_SELFTEST_WITH_OTHER)
    fails += KVL_WARP == 32 ? selftest_w64() : selftest_w32();
#endif
    if (fails)
        printf("FAILED: %d checks\n", fails);
    else
        printf("ALL PASS\n");
    return fails != 0;
}
#endif

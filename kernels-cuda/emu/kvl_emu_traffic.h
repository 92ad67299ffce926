/*
 * kvl_emu_traffic.h - memory-traffic recording for emulated launches (fiber mode), a test-time
 * option: off unless a launch hands a kvl_emu_traffic to fill, and then one branch per access.
 *
 * The kernels' global accessors (common.cuh: kvl_at, kvl_at_c, kvl_copy_unit for the cache;
 * kvl_act, kvl_ld, kvl_st for everything else) call kvl_emu_record with the access's address,
 * size, kind and call site. Each lane's accesses are kept with the lane's occurrence count of
 * that (site, kind); after a block they are grouped into warp requests: the accesses the
 * lanes of one warp make at the same site in the same occurrence (the same program point in
 * the same iteration), as a GPU's load/store unit coalesces them. Per request: the distinct
 * bytes (useful), distinct 32-byte sectors and 128-byte lines; per launch, also the distinct
 * sectors and lines over all requests. An epoch is the part of a lane's run between two
 * rendezvous (kvl_sync, kvl_shfl_xor, kvl_ballot): the load requests of one warp in one epoch
 * do not wait for its warp ops, so they bound what a warp may have in flight.
 */
#ifndef KVL_EMU_TRAFFIC_H
#define KVL_EMU_TRAFFIC_H

#include <stdint.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

/* Kinds of access; kvl_emu_traffic.kinds is indexed by them. */
enum {
    KVL_TRAFFIC_CACHE_LOAD = 0,
    KVL_TRAFFIC_CACHE_STORE = 1,
    KVL_TRAFFIC_OTHER_LOAD = 2,
    KVL_TRAFFIC_OTHER_STORE = 3,
    KVL_TRAFFIC_KINDS = 4
};

/* The counts of one kind of access over a launch (mirrored by kvlayout_emu::TrafficKind). */
typedef struct kvl_emu_traffic_kind {
    uint64_t requests;       /* warp requests */
    uint64_t lane_accesses;  /* accesses of single lanes */
    uint64_t bytes;          /* bytes the lanes asked for (a byte two lanes read counts twice) */
    uint64_t useful_bytes;   /* distinct bytes per request, summed over requests */
    uint64_t sectors;        /* distinct 32-byte sectors per request, summed */
    uint64_t lines;          /* distinct 128-byte lines per request, summed */
    uint64_t unique_sectors; /* distinct sectors over the launch */
    uint64_t unique_lines;   /* distinct lines over the launch */
} kvl_emu_traffic_kind;

/* One launch's traffic (mirrored by kvlayout_emu::TrafficReport's C image). */
typedef struct kvl_emu_traffic {
    kvl_emu_traffic_kind kinds[KVL_TRAFFIC_KINDS];
    uint64_t load_epochs;         /* (warp, epoch) pairs with at least one load request */
    uint64_t static_shared_bytes; /* most static shared memory a thread had declared */
    uint64_t blocks;              /* blocks that made at least one access */
} kvl_emu_traffic;

/* A call site's id: file and line, hashed at compile time (KVL_SITE in common.cuh). */
constexpr uint64_t kvl_emu_site(const char *file, int line)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *file; ++file)
        h = (h ^ (unsigned char)*file) * 1099511628211ull;
    return (h ^ (uint64_t)(uint32_t)line) * 1099511628211ull;
}

namespace kvl_emu_traffic_detail {

struct Access {
    uint64_t site;
    uint64_t addr;
    uint32_t kind, occurrence, tid, epoch, bytes;
};

/* The recording of the running launch on this OS thread. */
struct Recorder {
    kvl_emu_traffic *out = nullptr;
    uint64_t block = ~0ull; /* linear index of the block whose accesses `acc` holds */
    std::vector<Access> acc;
    std::vector<std::vector<std::pair<uint64_t, uint32_t>>> seen; /* per lane: (site key, count) */
    std::unordered_set<uint64_t> sectors[KVL_TRAFFIC_KINDS], lines[KVL_TRAFFIC_KINDS];
    std::vector<uint64_t> scratch_s, scratch_l;
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    std::vector<std::pair<uint32_t, uint32_t>> epochs; /* (warp, epoch) of load requests */
};

inline thread_local Recorder *tls_recorder = nullptr;

/* Sorted unique values of v, counted (v is reordered). */
inline uint64_t count_unique(std::vector<uint64_t> &v)
{
    std::sort(v.begin(), v.end());
    return (uint64_t)(std::unique(v.begin(), v.end()) - v.begin());
}

/* One warp request: accesses [b, e) of r.acc (same warp, kind, site, occurrence). */
inline void add_request(Recorder &r, const Access *b, const Access *e, uint32_t warp)
{
    kvl_emu_traffic_kind &k = r.out->kinds[b->kind];
    r.scratch_s.clear();
    r.scratch_l.clear();
    r.spans.clear();
    uint32_t epoch = b->epoch, first = b->tid;
    for (const Access *a = b; a != e; ++a) {
        k.lane_accesses++;
        k.bytes += a->bytes;
        if (a->tid < first) {
            first = a->tid;
            epoch = a->epoch;
        }
        if (a->bytes == 0)
            continue;
        const uint64_t last = a->addr + a->bytes - 1;
        r.spans.push_back({a->addr, last + 1});
        for (uint64_t s = a->addr >> 5; s <= last >> 5; s++)
            r.scratch_s.push_back(s);
        for (uint64_t l = a->addr >> 7; l <= last >> 7; l++)
            r.scratch_l.push_back(l);
    }
    std::sort(r.spans.begin(), r.spans.end());
    uint64_t useful = 0, end = 0;
    for (const auto &s : r.spans) { /* the union of the lanes' byte ranges */
        const uint64_t from = std::max(s.first, end);
        if (s.second > from)
            useful += s.second - from;
        end = std::max(end, s.second);
    }
    k.requests++;
    k.useful_bytes += useful;
    k.sectors += count_unique(r.scratch_s);
    k.lines += count_unique(r.scratch_l);
    r.sectors[b->kind].insert(r.scratch_s.begin(), r.scratch_s.end());
    r.lines[b->kind].insert(r.scratch_l.begin(), r.scratch_l.end());
    if (b->kind == KVL_TRAFFIC_CACHE_LOAD || b->kind == KVL_TRAFFIC_OTHER_LOAD)
        r.epochs.push_back({warp, epoch});
}

/* Groups the recorded block's accesses into warp requests. */
inline void flush_block(Recorder &r, uint32_t warp_width)
{
    if (r.acc.empty())
        return;
    auto key = [warp_width](const Access &a) {
        return std::make_tuple(a.tid / warp_width, a.kind, a.site, a.occurrence);
    };
    std::sort(r.acc.begin(), r.acc.end(),
              [&](const Access &a, const Access &b) { return key(a) < key(b); });
    r.epochs.clear();
    for (size_t i = 0; i < r.acc.size();) {
        size_t j = i + 1;
        while (j < r.acc.size() && key(r.acc[j]) == key(r.acc[i]))
            j++;
        add_request(r, &r.acc[i], &r.acc[i] + (j - i), r.acc[i].tid / warp_width);
        i = j;
    }
    std::sort(r.epochs.begin(), r.epochs.end());
    r.out->load_epochs += (uint64_t)(std::unique(r.epochs.begin(), r.epochs.end()) - r.epochs.begin());
    r.out->blocks++;
    r.acc.clear();
    for (auto &s : r.seen)
        s.clear();
}

/* Ends the launch's recording: the last block, the launch-wide distinct counts. */
inline void finish(Recorder &r, uint32_t warp_width)
{
    flush_block(r, warp_width);
    for (int k = 0; k < KVL_TRAFFIC_KINDS; k++) {
        r.out->kinds[k].unique_sectors = r.sectors[k].size();
        r.out->kinds[k].unique_lines = r.lines[k].size();
    }
}

} // namespace kvl_emu_traffic_detail

/* Records an access of `n` bytes at `p` of `kind` from call site `site` by the calling thread.
 * Off (one branch) unless the launch records. */
static inline void kvl_emu_record(const void *p, int64_t n, int kind, uint64_t site)
{
    using namespace kvl_emu_traffic_detail;
    Recorder *r = tls_recorder;
    if (__builtin_expect(r == nullptr, 1))
        return;
    const auto &f = kvl_emu::detail::self();
    const uint64_t block =
        (uint64_t(kvl_block_z()) * kvl_blocks_y() + kvl_block_y()) * kvl_blocks_x() + kvl_block_x();
    if (block != r->block) {
        flush_block(*r, KVL_WARP);
        r->block = block;
        r->seen.resize(kvl_threads());
    }
    if (f.shared_used > r->out->static_shared_bytes)
        r->out->static_shared_bytes = f.shared_used;
    const uint64_t key = site * KVL_TRAFFIC_KINDS + (uint64_t)kind;
    uint32_t occurrence = 0;
    auto &seen = r->seen[f.tid];
    auto it = std::find_if(seen.begin(), seen.end(), [key](const auto &s) { return s.first == key; });
    if (it == seen.end())
        seen.push_back({key, 1});
    else
        occurrence = it->second++;
    r->acc.push_back(Access{site, (uint64_t)(uintptr_t)p, (uint32_t)kind, occurrence, f.tid,
                            f.rendezvous, (uint32_t)n});
}

#endif /* KVL_EMU_TRAFFIC_H */

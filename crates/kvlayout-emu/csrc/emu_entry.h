/*
 * emu_entry.h - the C entry points of one emulated kernel build. The including translation
 * unit defines KVL_EMU, KVL_WARP, KVL_EMU_SOURCE (the kernel translation unit to compile),
 * KVL_EMU_NS (a namespace for its copy of the kernels) and KVL_EMU_PREFIX(name) (the prefix
 * of its entry points), then includes this file, which compiles the kernel sources for the
 * host and wraps each kernel in an `extern "C"` function that launches it under the emulator
 * (kernels-cuda/emu/kvl_emu.h) and returns 0 or an error.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory a launch may touch through the cache accessors: an access outside ends it. */
typedef struct kvl_emu_region {
    const unsigned char *base;
    uint64_t len;
} kvl_emu_region;

#define KVL_EMU_MAX_REGIONS 8

/* One launch: the configuration (kvlayout::kernels::LaunchConfig), limits and regions. */
typedef struct kvl_emu_launch {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t dyn_shared_bytes;
    uint32_t shared_limit_bytes;
    uint64_t seed;
    kvl_emu_region regions[KVL_EMU_MAX_REGIONS];
    uint64_t n_regions;
    struct kvl_emu_traffic *traffic; /* filled when not null: the launch's memory traffic */
    uint64_t run_grid_x; /* blocks at x >= it are skipped (0: none); traffic sampling only */
} kvl_emu_launch;

/* The launch running on this OS thread (each test thread has its own), and the first access
 * outside its regions, described. */
static thread_local const kvl_emu_launch *kvl_emu_current;
static thread_local char kvl_emu_fault[160];

/* 1 when `n` bytes at `p` lie in one region of the launch; otherwise 0, the fault described. */
static inline int kvl_emu_access_ok(const void *p, int64_t n)
{
    /* Addresses as integers: the pointer may lie outside every object. */
    const uintptr_t a = (uintptr_t)p;
    for (uint64_t i = 0; i < kvl_emu_current->n_regions; i++) {
        const kvl_emu_region *r = &kvl_emu_current->regions[i];
        const uintptr_t base = (uintptr_t)r->base;
        if (a >= base && n >= 0 && (uint64_t)(a - base) + (uint64_t)n <= r->len)
            return 1;
    }
    if (kvl_emu_fault[0] == 0) {
        const uintptr_t base0 = (uintptr_t)kvl_emu_current->regions[0].base;
        snprintf(kvl_emu_fault, sizeof kvl_emu_fault,
                 "%lld bytes at buffer 0 %+lld, outside the launch's %llu regions",
                 (long long)n, (long long)(a - base0),
                 (unsigned long long)kvl_emu_current->n_regions);
    }
    return 0;
}

#include "kvl_port.h"
#include "kvl_dtype.h"
#include "kvl_kernels.h"
#include "kvl_emu_traffic.h"

namespace KVL_EMU_NS {
#include KVL_EMU_SOURCE
#include "traffic_probe.cuh"
}

template <class F>
static int kvl_emu_run(const kvl_emu_launch *l, F &&body, char *err, size_t err_len)
{
    kvl_emu::Launch cfg;
    cfg.grid = {l->grid[0], l->grid[1], l->grid[2]};
    cfg.block = {l->block[0], l->block[1], l->block[2]};
    cfg.dyn_shared_bytes = l->dyn_shared_bytes;
    cfg.shared_limit_bytes = l->shared_limit_bytes;
    cfg.seed = l->seed;
    cfg.run_grid_x = (uint32_t)l->run_grid_x;
    kvl_emu_current = l;
    kvl_emu_fault[0] = 0;
    kvl_emu_traffic_detail::Recorder rec;
    if (l->traffic) {
        *l->traffic = kvl_emu_traffic{};
        rec.out = l->traffic;
        kvl_emu_traffic_detail::tls_recorder = &rec;
    }
    int rc = kvl_emu::launch(cfg, body, err, err_len);
    if (l->traffic) {
        kvl_emu_traffic_detail::finish(rec, KVL_WARP);
        kvl_emu_traffic_detail::tls_recorder = nullptr;
    }
    if (rc != 0 && kvl_emu_fault[0] != 0) {
        size_t used = strlen(err);
        snprintf(err + used, err_len - used, ": access of %s", kvl_emu_fault);
    }
    kvl_emu_current = nullptr;
    return rc;
}

extern "C" int KVL_EMU_PREFIX(warp_size)(void) { return KVL_WARP; }

extern "C" int KVL_EMU_PREFIX(write_kv)(const kvl_emu_launch *l, const kvl_field_args *k,
                                        const kvl_field_args *v, const kvl_field_args *ks,
                                        const kvl_field_args *vs, const kvl_write_params *p,
                                        char *err, size_t err_len)
{
    return kvl_emu_run(
        l, [&] { KVL_EMU_NS::kvl_write_kv(*k, *v, *ks, *vs, *p); }, err, err_len);
}

extern "C" int KVL_EMU_PREFIX(paged_decode)(const kvl_emu_launch *l, const kvl_field_args *k,
                                            const kvl_field_args *v, const kvl_field_args *ks,
                                            const kvl_field_args *vs,
                                            const kvl_decode_params *p, char *err,
                                            size_t err_len)
{
    return kvl_emu_run(
        l, [&] { KVL_EMU_NS::kvl_paged_decode(*k, *v, *ks, *vs, *p); }, err, err_len);
}

extern "C" int KVL_EMU_PREFIX(paged_decode_reduce)(const kvl_emu_launch *l,
                                                   const kvl_field_args *v,
                                                   const kvl_decode_params *p, char *err,
                                                   size_t err_len)
{
    return kvl_emu_run(
        l, [&] { KVL_EMU_NS::kvl_paged_decode_reduce(*v, *p); }, err, err_len);
}

extern "C" int KVL_EMU_PREFIX(move_blocks)(const kvl_emu_launch *l, const kvl_field_args *src,
                                           const kvl_field_args *dst, const kvl_move_params *p,
                                           char *err, size_t err_len)
{
    return kvl_emu_run(
        l, [&] { KVL_EMU_NS::kvl_move_blocks(*src, *dst, *p); }, err, err_len);
}

/* Runs traffic probe `pattern` (traffic_probe.cuh) on one block of `threads` threads over a
 * buffer of `len` bytes aligned to 128, recording into `out`; 0, or non-zero with a message. */
extern "C" int KVL_EMU_PREFIX(traffic_probe)(int pattern, uint32_t threads, uint64_t len,
                                             kvl_emu_traffic *out, char *err, size_t err_len)
{
    unsigned char *buf = static_cast<unsigned char *>(aligned_alloc(128, (len + 127) / 128 * 128));
    if (!buf) {
        snprintf(err, err_len, "no memory for %llu bytes", (unsigned long long)len);
        return -1;
    }
    memset(buf, 0, len);
    kvl_emu_launch l;
    memset(&l, 0, sizeof l);
    l.grid[0] = l.grid[1] = l.grid[2] = 1;
    l.block[0] = threads;
    l.block[1] = l.block[2] = 1;
    l.shared_limit_bytes = 48 * 1024;
    l.regions[0] = kvl_emu_region{buf, len};
    l.n_regions = 1;
    l.traffic = out;
    int rc = kvl_emu_run(
        &l, [&] { KVL_EMU_NS::kvl_traffic_probe(pattern, buf); }, err, err_len);
    free(buf);
    return rc;
}

/* Reads the parameters of a kernel out of an argument block as a driver does: each at the
 * next multiple of its C alignment, in order (kvlayout::kernels::arg_slots must agree). */
struct kvl_emu_arg_reader {
    const unsigned char *block;
    size_t len;
    size_t at;
    int short_block;

    template <class T> T next()
    {
        T v;
        memset(&v, 0, sizeof v);
        at = (at + alignof(T) - 1) / alignof(T) * alignof(T);
        if (at + sizeof(T) > len)
            short_block = 1;
        else
            memcpy(&v, block + at, sizeof v);
        at += sizeof(T);
        return v;
    }
};

/* Launches kernel `kernel` (0 kvl_write_kv, 1 kvl_paged_decode, 2 kvl_paged_decode_reduce,
 * 3 kvl_move_blocks: kvlayout::kernels::Kernel's order) with the parameters in the `len`
 * bytes at `block`, which must be exactly the kernel's parameter block. */
extern "C" int KVL_EMU_PREFIX(launch_block)(const kvl_emu_launch *l, int kernel,
                                            const unsigned char *block, size_t len,
                                            char *err, size_t err_len)
{
    kvl_emu_arg_reader r = {block, len, 0, 0};
    int rc = -1;
    switch (kernel) {
    case 0: {
        kvl_field_args k = r.next<kvl_field_args>(), v = r.next<kvl_field_args>();
        kvl_field_args ks = r.next<kvl_field_args>(), vs = r.next<kvl_field_args>();
        kvl_write_params p = r.next<kvl_write_params>();
        if (!r.short_block && r.at == len)
            rc = KVL_EMU_PREFIX(write_kv)(l, &k, &v, &ks, &vs, &p, err, err_len);
        break;
    }
    case 1: {
        kvl_field_args k = r.next<kvl_field_args>(), v = r.next<kvl_field_args>();
        kvl_field_args ks = r.next<kvl_field_args>(), vs = r.next<kvl_field_args>();
        kvl_decode_params p = r.next<kvl_decode_params>();
        if (!r.short_block && r.at == len)
            rc = KVL_EMU_PREFIX(paged_decode)(l, &k, &v, &ks, &vs, &p, err, err_len);
        break;
    }
    case 2: {
        kvl_field_args v = r.next<kvl_field_args>();
        kvl_decode_params p = r.next<kvl_decode_params>();
        if (!r.short_block && r.at == len)
            rc = KVL_EMU_PREFIX(paged_decode_reduce)(l, &v, &p, err, err_len);
        break;
    }
    case 3: {
        kvl_field_args s = r.next<kvl_field_args>(), d = r.next<kvl_field_args>();
        kvl_move_params p = r.next<kvl_move_params>();
        if (!r.short_block && r.at == len)
            rc = KVL_EMU_PREFIX(move_blocks)(l, &s, &d, &p, err, err_len);
        break;
    }
    default:
        snprintf(err, err_len, "no kernel %d", kernel);
        return -1;
    }
    if (rc == -1 && (r.short_block || r.at != len))
        snprintf(err, err_len, "kernel %d: an argument block of %zu bytes, its parameters take %zu",
                 kernel, len, r.at);
    return rc;
}

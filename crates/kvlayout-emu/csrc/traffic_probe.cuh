/*
 * traffic_probe.cuh - hand-made access patterns for the traffic recorder's own tests
 * (crates/kvlayout-emu/tests/traffic.rs works their counts out by hand). Compiled into the
 * emulator builds only, never for a GPU. Thread t of a block over a buffer aligned to 128:
 *   0 unit stride: loads float t            1 stride 2: loads float 2t
 *   2 16-byte vectors: copies bytes [16t, 16t + 16) to KVL_PROBE_HALF past them
 *   3 gather: lane l of warp w loads float 8 ((5 l) mod W) + 8 W w (a sector each, permuted)
 *   4 broadcast: every thread loads float 0  5 unit-stride store of float t
 *   6 four 4-byte copies of float t + 256 i (i = 0..3), no rendezvous between them
 *   7 the same with a kvl_sync after each    8 unit stride shifted by 4 bytes: float t + 1
 *   9 a 16-byte load of bytes [16t, 16t + 16) made by the kernel, stated with KVL_CACHE_LOAD
 */
#define KVL_PROBE_HALF (64 * 1024)

typedef struct kvl_probe16 {
    uint64_t lo, hi;
} kvl_probe16;

KVL_KERNEL kvl_traffic_probe(int pattern, unsigned char *buf)
{
    float *a = (float *)buf;
    const int64_t t = kvl_thread(), lane = kvl_lane(), warp = kvl_warp();
    switch (pattern) {
    case 0: (void)kvl_ld(a + t); break;
    case 1: (void)kvl_ld(a + 2 * t); break;
    case 2: kvl_copy_unit(buf + KVL_PROBE_HALF + 16 * t, buf + 16 * t, 16); break;
    case 3: (void)kvl_ld(a + 8 * ((5 * lane) % KVL_WARP) + 8 * KVL_WARP * warp); break;
    case 4: (void)kvl_ld(a); break;
    case 5: kvl_st(a + t, 1.0f); break;
    case 6:
        for (int64_t i = 0; i < 4; i++)
            kvl_copy_unit(buf + KVL_PROBE_HALF + 4 * (t + 256 * i), buf + 4 * (t + 256 * i), 4);
        break;
    case 7:
        for (int64_t i = 0; i < 4; i++) {
            kvl_copy_unit(buf + KVL_PROBE_HALF + 4 * (t + 256 * i), buf + 4 * (t + 256 * i), 4);
            kvl_sync();
        }
        break;
    case 8: (void)kvl_ld(a + t + 1); break;
    case 9: {
        const kvl_probe16 *q = (const kvl_probe16 *)(buf + 16 * t);
        KVL_CACHE_LOAD(q, 16); const kvl_probe16 x = *q;
        kvl_st(a + KVL_PROBE_HALF / 4 + t, (float)(x.lo & 1));
        break;
    }
    default: kvl_trap();
    }
}

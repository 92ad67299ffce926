/*
 * move_blocks: the block movers (copy_blocks, swap_blocks, gather_blocks, scatter_blocks,
 * convert) as one kernel, launched once per stored field.
 *
 * Grid (pairs, layers x heads, capped); one block moves one (pair, layer, head): every slot
 * and element of the head, its threads over consecutive elements. Both sides are addressed
 * through their own field arguments, so any two layouts of the same content work. When a row
 * is one run of bytes on both sides (the Rust side decides from the descriptor and sets
 * row_unit_bytes), rows are copied in units of that many bytes instead of element by element:
 * a row's units go to consecutive threads, each row's base addresses computed once.
 */
#ifndef KVL_MOVE_BLOCKS_CUH
#define KVL_MOVE_BLOCKS_CUH

#include "common.cuh"

/* Copies `n` bytes (1, 2, 4, 8 or 16), both addresses aligned to `n` (a recorded cache load
 * and store). */
KVL_DEVICE void kvl_copy_unit_at(unsigned char *dst, const unsigned char *src, int n,
                                 kvl_site_t site)
{
    KVL_CHECK_ACCESS(src, n);
    KVL_CHECK_ACCESS(dst, n);
    KVL_CHECK_ALIGNED(src, n);
    KVL_CHECK_ALIGNED(dst, n);
    KVL_RECORD(src, n, KVL_TRAFFIC_CACHE_LOAD, site);
    KVL_RECORD(dst, n, KVL_TRAFFIC_CACHE_STORE, site);
    switch (n) {
    case 16: *(kvl_u128 *)dst = *(const kvl_u128 *)src; break;
    case 8: *(uint64_t *)dst = *(const uint64_t *)src; break;
    case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
    case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
    default: *dst = *src; break;
    }
}
#define kvl_copy_unit(dst, src, n) kvl_copy_unit_at((dst), (src), (n), KVL_SITE)

KVL_KERNEL kvl_move_blocks(kvl_field_args src, kvl_field_args dst, kvl_move_params p)
{
    kvl_plant_fields(&src, &dst);
    const int64_t src_block = kvl_ld(p.pairs + 2 * kvl_block_x());
    const int64_t dst_block = kvl_ld(p.pairs + 2 * kvl_block_x() + 1);
    const int64_t units = src.num_layers * p.heads;
    const int64_t unit = p.row_unit_bytes;
    for (int64_t lh = kvl_block_y(); lh < units; lh += kvl_blocks_y()) {
        const int64_t layer = lh / p.heads, h = p.head0 + lh % p.heads;
        const int64_t dh = p.dst_head0 + lh % p.heads;
        if (unit > 0) {
            /* `lanes` threads share a row, `rows` rows at a time; each row's bases once. */
            const int64_t per_row = src.width * src.elem_bytes / unit;
            const int64_t lanes = per_row < kvl_threads() ? per_row : kvl_threads();
            const int64_t rows = kvl_threads() / lanes;
            const int64_t lane = kvl_thread() % lanes;
            for (int64_t n = kvl_thread() / lanes; n < src.num_slots && kvl_thread() < rows * lanes;
                 n += rows) {
                const unsigned char *s =
                    p.src_buffers[src.buffer] + KVL_OFFSET(&src, layer, src_block, h, n, 0);
                unsigned char *d =
                    p.dst_buffers[dst.buffer] + KVL_OFFSET(&dst, layer, dst_block, dh, n, 0);
                for (int64_t u = lane; u < per_row; u += lanes)
                    kvl_copy_unit(d + u * unit, s + u * unit, (int)unit);
            }
        } else {
            for (int64_t e = kvl_thread(); e < src.num_slots * src.width; e += kvl_threads()) {
                const int64_t n = e / src.width, x = e % src.width;
                kvl_copy_unit(kvl_addr(p.dst_buffers, &dst, layer, dst_block, dh, n, x),
                              kvl_addr_c(p.src_buffers, &src, layer, src_block, h, n, x),
                              src.elem_bytes);
            }
        }
    }
}

#endif /* KVL_MOVE_BLOCKS_CUH */

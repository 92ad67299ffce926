/*
 * kvl_plant.cuh - deliberately broken kernel variants, one per bug class of
 * ../shared/anchors.md, compiled only into the emulator's test builds (KVL_PLANT = n) so that
 * the conformance suite can be shown to catch each one. Without KVL_PLANT this header defines
 * the correct behaviour and nothing else.
 *
 *   1  swapped V strides (V's head and slot strides exchanged)
 *   2  block size read as head count (a slot split by num_heads instead of block_size)
 *   3  page padding ignored (block stride recomputed from the unpadded extents)
 *   4  int32 offset overflow (offsets truncated to 32 bits)
 *   5  K's strides reused for V
 *   6  (2, B, ...) assumed for V (V placed after all blocks of K, with K's strides)
 */
#ifndef KVL_PLANT_CUH
#define KVL_PLANT_CUH

#if !defined(KVL_PLANT) || KVL_PLANT == 0

#define KVL_OFFSET(a, l, b, h, n, d) kvl_offset((a), (l), (b), (h), (n), (d))
#define KVL_BLOCK_SIZE(a) ((a)->block_size)
KVL_DEVICE void kvl_plant_fields(kvl_field_args *k, kvl_field_args *v)
{
    (void)k;
    (void)v;
}

#else

#if KVL_PLANT == 4
#define KVL_OFFSET(a, l, b, h, n, d) ((int64_t)(int32_t)kvl_offset((a), (l), (b), (h), (n), (d)))
#else
#define KVL_OFFSET(a, l, b, h, n, d) kvl_offset((a), (l), (b), (h), (n), (d))
#endif

#if KVL_PLANT == 2
#define KVL_BLOCK_SIZE(a) ((a)->num_heads)
#else
#define KVL_BLOCK_SIZE(a) ((a)->block_size)
#endif

KVL_DEVICE void kvl_plant_fields(kvl_field_args *k, kvl_field_args *v)
{
#if KVL_PLANT == 1
    int64_t t = v->head_stride_bytes;
    v->head_stride_bytes = v->slot_stride_bytes;
    v->slot_stride_bytes = t;
    (void)k;
#elif KVL_PLANT == 3
    int64_t row = v->dim_split == v->width ? v->width * v->elem_bytes : v->dim_chunk_stride_bytes * (v->width / v->dim_split);
    v->block_stride_bytes = v->num_heads * v->num_slots * row;
    (void)k;
#elif KVL_PLANT == 5
    v->head_stride_bytes = k->head_stride_bytes;
    v->slot_stride_bytes = k->slot_stride_bytes;
    v->block_stride_bytes = k->block_stride_bytes;
#elif KVL_PLANT == 6
    v->base_offset_bytes = k->base_offset_bytes + k->num_blocks * k->block_stride_bytes;
    v->head_stride_bytes = k->head_stride_bytes;
    v->slot_stride_bytes = k->slot_stride_bytes;
    v->block_stride_bytes = k->block_stride_bytes;
    v->buffer = k->buffer;
#else
    (void)k;
    (void)v;
#endif
}

#endif

#endif /* KVL_PLANT_CUH */

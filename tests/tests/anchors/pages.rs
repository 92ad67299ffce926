// ---------------------------------------------------------------------------------------------
// Case 4: padded pages; the registered span is the whole padded extent.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, Field, KvCacheLayout, LayoutError};

use crate::{layout, range, span, split_refused, sweep, view, K, V};

#[test]
fn case04_padded_pages() {
    // H=8, N=16, D=8 f16: row 32 B, dense page 16*8*32 = 4096 B, padded to 4160.
    for base in [0u64, 1024] {
        let l = layout(&format!(
            "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160 base={base}"
        ));
        assert_eq!(l.dense_page_bytes(), 4096);
        for (f, off) in [(Field::K, 0), (Field::V, 16)] {
            sweep(&l, f, [2, 3, 8, 16, 8], |a, b, h, n, d| {
                base + a * 3 * 4160 + b * 4160 + n * 256 + h * 32 + off + 2 * d
            });
            let args = l.kernel_args(f).unwrap();
            assert_eq!(
                (args.block_stride_bytes, args.layer_stride_bytes),
                (4160, 12480)
            );
        }
        assert_eq!(l.registered_spans(), span(base, 2 * 3 * 4160));
        assert_eq!(
            view(&l, Convention::Standard, K, 1),
            (
                vec![3, 8, 16, 8],
                vec![2080, 16, 128, 1],
                (base + 12480) / 2
            )
        );
        // A block's data is the dense 4096 B of each layer; the 64 B pad is not data.
        assert_eq!(
            l.block_regions(1, 0..2, 0..8).unwrap(),
            vec![range(base + 4160, 4096), range(base + 12480 + 4160, 4096)]
        );
        for r in [2, 4] {
            assert!(split_refused(&l, r), "padded pages split by {r}");
        }
    }
    // Head-major padded page: only the page stride changes.
    let h = layout("kv L=1 B=3 N=16 H=8 D=8 dtype=f16 order=HND page=4160");
    sweep(&h, Field::V, [1, 3, 8, 16, 8], |_, b, h_, n, d| {
        b * 4160 + h_ * 512 + n * 32 + 16 + 2 * d
    });
    assert!(split_refused(&h, 2));
    // Alignment rounds the padded page up: 4160 -> 4352 at 256.
    let a = layout("kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160 align=256");
    sweep(&a, Field::K, [2, 3, 8, 16, 8], |l_, b, h_, n, d| {
        l_ * 3 * 4352 + b * 4352 + n * 256 + h_ * 32 + 2 * d
    });
    assert_eq!(a.registered_spans(), span(0, 2 * 3 * 4352));
    assert!(split_refused(&a, 2));
    // A page smaller than the data, or padding where pages are not contiguous, is refused.
    assert!(matches!(
        "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4000".parse::<KvCacheLayout>(),
        Err(LayoutError::StrideTooSmall {
            value: 4000,
            needed: 4096,
            ..
        })
    ));
    assert!(matches!(
        "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=LHBNC page=4160".parse::<KvCacheLayout>(),
        Err(LayoutError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Case 5: block-outermost layouts.
// ---------------------------------------------------------------------------------------------

#[test]
fn case05_block_outermost_layouts() {
    // L=3, B=5, N=16, H=4, D=8 f16: row 32 B, page 16*4*32 = 2048 B; block stride 3*2048.
    let page = 2048u64;
    for order in ["BLNHC", "BLHNC"] {
        let l = layout(&format!("kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order={order}"));
        let in_page = |h: u64, n: u64| {
            if order == "BLNHC" {
                n * 128 + h * 32
            } else {
                h * 512 + n * 32
            }
        };
        for (f, off) in [(Field::K, 0), (Field::V, 16)] {
            sweep(&l, f, [3, 5, 4, 16, 8], |a, b, h, n, d| {
                b * 3 * page + a * page + in_page(h, n) + off + 2 * d
            });
            let args = l.kernel_args(f).unwrap();
            assert_eq!(
                (args.block_stride_bytes, args.layer_stride_bytes),
                (3 * 2048, 2048),
                "{order}"
            );
        }
        assert_eq!(l.registered_spans(), span(0, 5 * 3 * page), "{order}");
        // One RDMA read per block: all layers of block 4 are one range.
        assert_eq!(
            l.block_regions(4, 0..3, 0..4).unwrap(),
            vec![range(4 * 3 * page, 3 * page)],
            "{order}"
        );
        // One layer is B separate pages.
        assert_eq!(
            l.layer_regions(1..2).unwrap(),
            (0..5)
                .map(|b| range(b * 3 * page + page, page))
                .collect::<Vec<_>>(),
            "{order}"
        );
        let (shape, strides, offset) = view(&l, Convention::Standard, V, 2);
        assert_eq!(shape, vec![5, 4, 16, 8]);
        assert_eq!(
            strides[0],
            3 * 1024,
            "{order}: per-layer block stride = L * page"
        );
        assert_eq!(offset, 2 * 1024 + 8);
    }
}

// ---------------------------------------------------------------------------------------------
// Case 6: kernel-block split ratios 2 and 4; refused combinations fail at configuration time.
// ---------------------------------------------------------------------------------------------

#[test]
fn case06_kernel_block_split() {
    // Token-major paged, L=2 B=3 N=16 H=4 D=8 f16: row 32 B, token 128 B, page 2048 B,
    // layer 3*2048 B.
    let paged = layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let paged_at = |f_off: u64, l: u64, b: u64, h: u64, n: u64, d: u64| {
        l * 6144 + b * 2048 + n * 128 + h * 32 + f_off + 2 * d
    };
    // FlashAttention (2, B, N, H, D), same sizes: page of K (or V) 16*4*8*2 = 1024 B; layer
    // holds K of all blocks then V of all blocks: 2*3*1024 B.
    let fa = layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd");
    let fa_at = |f_off: u64, l: u64, b: u64, h: u64, n: u64, d: u64| {
        l * 6144 + f_off + b * 1024 + n * 64 + h * 16 + 2 * d
    };
    type At = dyn Fn(u64, u64, u64, u64, u64, u64) -> u64;
    let cases: [(&KvCacheLayout, &At, [u64; 2], u64); 2] = [
        (&paged, &paged_at, [0, 16], 2048),
        (&fa, &fa_at, [0, 3 * 1024], 1024),
    ];
    for (l, old, offs, page) in cases {
        for (f, off) in [Field::K, Field::V].into_iter().zip(offs) {
            sweep(l, f, [2, 3, 4, 16, 8], |a, b, h, n, d| {
                old(off, a, b, h, n, d)
            });
        }
        for r in [2u64, 4] {
            let s = l.split_blocks(r).unwrap();
            assert_eq!(s.geometry().num_blocks, 3 * r);
            assert_eq!(s.geometry().block_size, 16 / r);
            assert_eq!(s.registered_spans(), l.registered_spans());
            for (f, off) in [Field::K, Field::V].into_iter().zip(offs) {
                assert_eq!(
                    s.kernel_args(f).unwrap().block_stride_bytes,
                    (page / r) as i64
                );
                // Kernel block b*r + j, token n is allocator block b, token j*N/r + n.
                sweep(&s, f, [2, 3 * r, 4, 16 / r, 8], |a, nb, h, n, d| {
                    let (b, j) = (nb / r, nb % r);
                    old(off, a, b, h, j * 16 / r + n, d)
                });
            }
        }
    }
    // Accepted where the page is still token-outermost and dense.
    for ok in [
        "kv L=1 B=3 N=16 H=1 D=8 dtype=f16 order=HND",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=BLNHC",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2048 align=256",
    ] {
        let s = layout(ok)
            .split_blocks(2)
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(s.geometry().num_blocks, 6, "{ok}");
    }
    for refused in [
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2112",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=BLNHC",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-nhd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=vllm-paged-v1",
    ] {
        let l = layout(refused);
        for r in [2, 4] {
            assert!(split_refused(&l, r), "{refused} split by {r}");
        }
    }
    // A ratio that does not divide the block size.
    assert!(split_refused(&paged, 3));
}

use super::*;
use crate::arch::{available, prefetch_level};
use rows::WEIGHT_FLOOR;

/// The softmax state of `g` heads (accumulator rows of `s`), stepped by [`softmax_tile`].
struct State {
    maxes: Vec<f32>,
    sums: Vec<f32>,
    acc: Vec<f32>,
    s: usize,
}

impl State {
    fn new(g: usize, s: usize) -> Self {
        State {
            maxes: vec![f32::NEG_INFINITY; g],
            sums: vec![0f32; g * SUM_LANES],
            acc: vec![0f32; g * s],
            s,
        }
    }

    /// One step over the first `nt` logits of each head (rows [`TILE`] apart).
    fn step(&mut self, isa: Isa, logits: &mut [f32], nt: usize) {
        let step = SoftmaxStep {
            round: false,
            nt,
            g: self.maxes.len(),
            logits: StridedMut {
                data: logits,
                stride: TILE,
            },
            wscale: 1.0,
            vscale: None,
            maxes: &mut self.maxes,
            sums: &mut self.sums,
            acc: StridedMut {
                data: &mut self.acc,
                stride: self.s,
            },
        };
        softmax_tile(isa, step);
    }

    /// Head `j`'s running sum: the sum of its partial sums.
    fn sum(&self, j: usize) -> f32 {
        self.sums[j * SUM_LANES..(j + 1) * SUM_LANES].iter().sum()
    }
}

/// The softmax step of every build on logits spread over thousands: each weight is
/// `exp(l - max)` (relative 1e-5: the AVX-512 range reduction is in f32) or, below
/// [`WEIGHT_FLOOR`], exactly zero, never a subnormal; the running sums hold the weights; a
/// maximum that jumps by more than the floor zeroes the old state, a smaller jump rescales it.
#[test]
fn softmax_weights_flush_below_the_floor() {
    let (g, nt, s) = (2, 37, 16);
    // Head 0: logits from 0 down to -3600 (a third above the floor); head 1: around 10.
    let first: Vec<f32> = (0..2 * TILE)
        .map(|i| match (i / TILE, i % TILE) {
            (0, t) => -(t as f32) * 100.0 / 3.0 * if t % 2 == 0 { 0.1 } else { 1.0 },
            (_, t) => 10.0 - t as f32 * 0.25,
        })
        .collect();
    for isa in available() {
        let mut logits = first.clone();
        let mut st = State::new(g, s);
        st.step(isa, &mut logits, nt);
        for j in 0..g {
            check_weights(
                isa,
                j,
                &first[j * TILE..j * TILE + nt],
                &logits[j * TILE..],
                &st,
            );
        }
        check_jumps(isa, &mut st);
    }
}

/// Head `j`'s weights after one step over `first` (its logits): the maximum, each weight
/// (zero below the floor, else `exp` within 1e-5 and never subnormal), and the running sum.
fn check_weights(isa: Isa, j: usize, first: &[f32], weights: &[f32], st: &State) {
    let m = first.iter().copied().fold(f32::MIN, f32::max);
    assert_eq!(st.maxes[j], m, "{isa:?} head {j}");
    let mut total = 0f64;
    for (t, (&l, &w)) in first.iter().zip(weights).enumerate() {
        let x = l - m;
        if x < WEIGHT_FLOOR {
            assert_eq!(w, 0.0, "{isa:?} head {j} token {t}: logit {x}");
        } else {
            let want = f64::from(x).exp();
            assert!(
                (f64::from(w) - want).abs() <= 1e-5 * want,
                "{isa:?} head {j} token {t}: {w} against {want}"
            );
            assert!(w >= f32::MIN_POSITIVE, "{isa:?} head {j} token {t}: {w}");
        }
        total += f64::from(w);
    }
    let sum = st.sum(j);
    assert!(
        (f64::from(sum) - total).abs() <= 1e-6 * total,
        "{isa:?} head {j}"
    );
}

/// A second tile: head 0's maximum jumps by 100 (past the floor), head 1's by 1.
fn check_jumps(isa: Isa, st: &mut State) {
    let s = st.s;
    st.acc.fill(3.0);
    let before: Vec<f32> = (0..2).map(|j| st.sum(j)).collect();
    let mut logits = vec![0f32; 2 * TILE];
    logits[0] = 100.0;
    logits[TILE] = 11.0;
    st.step(isa, &mut logits, 1);
    assert!(
        st.acc[..s].iter().all(|&a| a == 0.0),
        "{isa:?}: head 0 not zeroed"
    );
    let c = (-1f32).exp();
    for &a in &st.acc[s..] {
        assert!(
            (a - 3.0 * c).abs() <= 1e-6,
            "{isa:?}: head 1 rescaled to {a}"
        );
    }
    let after: Vec<f32> = (0..2).map(|j| st.sum(j)).collect();
    assert_eq!(
        after[0], 1.0,
        "{isa:?}: head 0's sum is the new weight alone"
    );
    assert!(
        (after[1] - (before[1] * c + 1.0)).abs() <= 1e-5 * after[1],
        "{isa:?}"
    );
}

/// Logit adjustment on every build: key scales, then the soft-cap `c * tanh(l / c)` within
/// `c x 1.2e-7` of the f64 value, saturating past |l / c| = 9, sign and zero kept.
#[test]
fn adjust_logits_scale_and_cap() {
    let xs: Vec<f32> = (-2000..=2000)
        .map(|i| i as f32 * 0.011)
        .chain([0.0, -0.0, 1e-30, -1e-30, 1e-6, 40.0, -1e4, 1e30])
        .collect();
    let (g, ld) = (2, xs.len() + 3);
    let ks: Vec<f32> = (0..xs.len()).map(|i| [1.0, 0.5, 2.0][i % 3]).collect();
    for isa in available() {
        for cap in [None, Some(1.0f32), Some(50.0)] {
            let mut logits = vec![0f32; g * ld];
            for j in 0..g {
                logits[j * ld..j * ld + xs.len()].copy_from_slice(&xs);
            }
            let view = StridedMut {
                data: &mut logits,
                stride: ld,
            };
            adjust_logits(isa, xs.len(), g, view, &ks, cap);
            for j in 0..g {
                for (i, (&x, &k)) in xs.iter().zip(&ks).enumerate() {
                    let l = f64::from(x) * f64::from(k);
                    let (want, bound) = match cap {
                        Some(c) => {
                            let c = f64::from(c);
                            (c * (l / c).tanh(), c * 1.2e-7)
                        }
                        None => (l, l.abs() * 1e-7),
                    };
                    let got = f64::from(logits[j * ld + i]);
                    assert!(
                        (got - want).abs() <= bound,
                        "{isa:?} cap {cap:?}: {x} x {k} -> {got}, want {want}"
                    );
                    assert_eq!(got.is_sign_negative(), want.is_sign_negative(), "{x}");
                }
                assert!(logits[j * ld + xs.len()..(j + 1) * ld]
                    .iter()
                    .all(|&v| v == 0.0));
            }
        }
    }
}

/// `pv_transposed` on every build that has it and every kind, with and without the fp8
/// power of two, against the element decoder: two runs (16 tokens, then 5) of 23 elements,
/// 3 heads, added to accumulator rows 28 apart whose other slots stay as they were.
#[test]
fn transposed_values_every_kind() {
    let builds: Vec<Isa> = available()
        .into_iter()
        .filter(|&i| reads_transposed(i))
        .collect();
    if builds.is_empty() {
        use std::io::Write;
        // Straight to stderr, past the test harness's capture, so CI logs count it.
        let _ = writeln!(
            std::io::stderr().lock(),
            "skipped: pv_transposed kernel: this process runs no AVX-512 or AVX2 build ({})",
            crate::CpuFeatures::get().describe()
        );
    }
    for isa in builds {
        for kind in KINDS {
            for raw in [false, true] {
                transposed_values_on(isa, kind, raw);
            }
        }
    }
}

/// Every row kind.
const KINDS: [RowKind; 6] = [
    RowKind::Fp8E4m3,
    RowKind::Fp8E5m2,
    RowKind::I8,
    RowKind::Bf16,
    RowKind::F16,
    RowKind::F32,
];

fn transposed_values_on(isa: Isa, kind: RowKind, raw: bool) {
    let (width, tokens, g, ow) = (23, 21, 3, 28);
    let before = |i: usize| ((i % 13) as f32 - 6.0) / 1024.0;
    let w: Vec<f32> = (0..(g - 1) * TILE + tokens)
        .map(|i| ((i % TILE) as f32 + 1.0) * 0.01 * (i / TILE + 1) as f32)
        .collect();
    let (e, dtype) = (kind.elem(), kind.dtype());
    let fold = if kind == RowKind::Fp8E4m3 { 8 } else { 0 };
    let runs = [
        Run {
            off: 0,
            i0: 0,
            n: 16,
        },
        Run {
            off: 16 * e,
            i0: 16,
            n: 5,
        },
    ];
    // Element d of token t at `(d * tokens + t) * e`: element rows `tokens * e` apart.
    let mut buf = vec![0u8; width * tokens * e];
    for (i, x) in buf.chunks_exact_mut(e).enumerate() {
        let v = ((i * 7 % 23) as f32 - 11.0) * if kind == RowKind::I8 { 1.0 } else { 0.375 };
        crate::elem::encode(dtype, v, x);
    }
    let mut out: Vec<f32> = (0..g * ow).map(before).collect();
    let a = TransposedArgs {
        buf: &buf,
        runs: &runs,
        pf: &runs,
        dim: tokens * e,
        width,
        w: Strided {
            data: &w,
            stride: TILE,
        },
        g,
        out: StridedMut {
            data: &mut out,
            stride: ow,
        },
        level: prefetch_level(),
    };
    pv_transposed(isa, kind, raw, a);
    let f = if raw { 2f32.powi(fold) } else { 1.0 };
    for (i, &x) in out.iter().enumerate().filter(|(i, _)| i % ow >= width) {
        assert_eq!(
            x,
            before(i),
            "{isa:?} {kind:?}: slot {i} past the row changed"
        );
    }
    for j in 0..g {
        for d in 0..width {
            let want: f64 = (0..tokens)
                .map(|t| {
                    let at = (d * tokens + t) * e;
                    f64::from(w[j * TILE + t])
                        * f64::from(crate::elem::decode(dtype, &buf[at..at + e]))
                })
                .sum();
            let at = j * ow + d;
            let got = f64::from(out[at] - before(at)) * f64::from(f);
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{isa:?} {kind:?} raw {raw} head {j} element {d}: {got} against {want}"
            );
        }
    }
}

/// Every finite bit pattern of each kind (two-byte kinds: a spread of them) widened by
/// each build's kernels equals the element decoder, raw fp8 included (bf16 subnormals:
/// zero in the bf16-operand kernels), and is never an f32 subnormal (fp8 subnormals
/// included); and the value kernel puts each element where the kernel order says.
#[test]
fn widening_matches_the_element_decoder() {
    for kind in KINDS {
        let (e, dtype) = (kind.elem(), kind.dtype());
        let bytes: Vec<u8> = (0..=u16::MAX)
            .step_by(if e == 1 { 257 } else { 61 })
            .flat_map(|x| {
                let b = (u32::from(x) * 0x0001_0001).to_le_bytes();
                b[..e].to_vec()
            })
            .collect::<Vec<_>>()
            .chunks_exact(e)
            .filter(|b| crate::elem::decode(dtype, b).is_finite())
            .flatten()
            .copied()
            .collect();
        let want: Vec<f32> = bytes
            .chunks_exact(e)
            .map(|b| crate::elem::decode(dtype, b))
            .collect();
        for isa in available() {
            // `vdpbf16ps` reads bf16 subnormals (below 2^-126) as zero; every fp8 value
            // is a normal bf16.
            let want: Vec<f32> = want
                .iter()
                .map(|x| {
                    if isa.bf16_operands(kind) && x.abs() < f32::MIN_POSITIVE {
                        0.0
                    } else {
                        *x
                    }
                })
                .collect();
            for raw in [false, true] {
                let f = match (raw, fp8_fold(isa, kind)) {
                    (true, Some(f)) => f * f,
                    (true, None) => continue,
                    (false, _) => 1.0,
                };
                widening_on(isa, kind, raw, &bytes, &want, f);
            }
        }
    }
}

/// [`widening_matches_the_element_decoder`] on one build, the row `bytes` whose elements
/// read `want` (times `f`, the power of two raw fp8 lacks).
fn widening_on(isa: Isa, kind: RowKind, raw: bool, bytes: &[u8], want: &[f32], f: f32) {
    let width = want.len();
    let mut rows = RowSet::new(bytes.len());
    rows.push(bytes, 0);
    let none = RowSet::new(0);
    let (order, vorder) = (
        Order::of(isa, kind, Role::Key),
        Order::of(isa, kind, Role::Value),
    );
    let pw = order.padded(width).max(vorder.padded(width));
    let t = TileRows {
        kind,
        raw,
        rows: &rows,
        hoff: 0,
        next: &none,
        next_hoff: 0,
        width,
        level: prefetch_level(),
    };
    let mut scratch = vec![0f32; width];
    // Keys: one query row per probed element picks that element alone.
    for i in (0..width).step_by(7) {
        let mut q = vec![0f32; width];
        q[i] = 1.0;
        let mut qk = vec![0f32; pw];
        order.arrange(&q, &mut qk);
        let mut out = [0f32; 1];
        let q = Strided {
            data: &qk,
            stride: pw,
        };
        let logits = StridedMut {
            data: &mut out,
            stride: 1,
        };
        qk_tile(isa, &t, q, 1, logits, &mut scratch);
        assert_eq!(out[0] * f, want[i], "{kind:?} element {i} on {isa:?}");
        // What the kernels widen is never an f32 subnormal (an FMA with one takes a
        // microcode assist on Intel cores): with a query of 1, the logit is the widened
        // element itself.
        assert!(
            out[0] == 0.0 || out[0].abs() >= f32::MIN_POSITIVE,
            "{kind:?} element {i} on {isa:?} raw {raw}: widened to the subnormal {:e}",
            out[0]
        );
    }
    // Values: weight 1 on one row.
    let mut acc = vec![0f32; pw];
    let w = Strided {
        data: &[1.0],
        stride: 1,
    };
    let view = StridedMut {
        data: &mut acc,
        stride: pw,
    };
    pv_tile(isa, &t, w, 1, view, &mut scratch);
    let mut got = vec![0f32; width];
    vorder.restore(&acc, f, &mut got);
    assert_eq!(got, want, "{kind:?} values on {isa:?} raw {raw}");
}

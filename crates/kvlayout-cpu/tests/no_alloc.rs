//! `paged_decode` allocates nothing per step once warmed up (anchors case 15): a counting
//! global allocator watches decode steps on the per-item and the split-context paths, for
//! token- and head-major pages, heads outside the blocks, gathered (legacy) rows and inline
//! scales.

#![deny(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

mod common;

use common::decode_step;
use kvlayout::KvCacheLayout;
use kvlayout_cpu::{CpuBackend, DecodeParams, HostCache, HostExec};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations count: the test thread and the threads of the pool
    /// under test (not, say, the threads of an earlier backend's pool still shutting down).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// The counting allocator: this test's only unsafe code.
#[allow(unsafe_code)]
// SAFETY: every method forwards to the system allocator with its own arguments, and counting
// (a relaxed atomic add, a thread-local read) neither allocates nor touches the memory.
unsafe impl GlobalAlloc for Counting {
    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    /// # Safety
    /// As [`GlobalAlloc::dealloc`].
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    /// # Safety
    /// As [`GlobalAlloc::realloc`].
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations during `count` decode steps after three warm-up steps.
fn steps(spec: &str, threads: usize, seqs: usize, context: u32, count: usize) -> usize {
    let per_seq = (context as usize).div_ceil(16);
    let l: KvCacheLayout = format!("{spec} B={}", seqs * per_seq).parse().unwrap();
    let mut cache = HostCache::new(l).unwrap();
    cache.fill(0x3c);
    let table: Vec<i32> = (0..(seqs * per_seq) as i32).rev().collect();
    let lens = vec![context; seqs];
    let q = vec![0.5f32; seqs * 8 * 64];
    let mut out = vec![0f32; seqs * 8 * 64];
    let be = CpuBackend::new(Some(threads));
    let params = DecodeParams {
        num_q_heads: 8,
        scale: 0.125,
        sliding_window: None,
        soft_cap: Some(30.0),
    };
    let d = decode_step(&q, &table, per_seq, &lens, params);
    let cache = cache.as_ref(); // held across steps, as a serving loop holds its cache
    for _ in 0..3 {
        be.paged_decode(&cache, &d, &mut out).unwrap(); // warm-up: scratch grows
    }
    be.pool().broadcast(|_| COUNTED.with(|c| c.set(true)));
    COUNTED.with(|c| c.set(true));
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..count {
        be.paged_decode(&cache, &d, &mut out).unwrap();
    }
    let n = ALLOCATIONS.load(Ordering::SeqCst) - before;
    COUNTED.with(|c| c.set(false));
    be.pool().broadcast(|_| COUNTED.with(|c| c.set(false)));
    n
}

const SPECS: [&str; 5] = [
    "kv N=16 H=2 D=64 dtype=bf16 order=NHD",
    "kv N=16 H=2 D=64 dtype=fp8_e4m3 order=HND",
    "kv N=16 H=2 D=64 dtype=f32 order=HLBNC", // one head per item
    "kv N=16 H=2 D=64 dtype=f16 tensor=vllm-paged-v1", // gathered rows
    "kv-scaled N=16 H=2 D=64 dtype=int8 order=NHD", // inline scales
];

#[test]
fn decode_steps_do_not_allocate() {
    for spec in SPECS {
        // One thread: the decode itself allocates nothing, on either path.
        // 16 sequences: one item per sequence (or per sequence and head); 16 x 64 tokens x 2
        // heads is large enough to go to the pool, as is 1 x 1024 x 2 below.
        assert_eq!(steps(spec, 1, 16, 64, 10), 0, "{spec}: allocated");
        // 1 sequence: split-context partitions.
        assert_eq!(
            steps(spec, 1, 1, 1024, 10),
            0,
            "{spec}: split-context allocated"
        );
        // A step small enough to run on the calling thread (1 x 256 tokens x 2 heads).
        assert_eq!(
            steps(spec, 2, 1, 256, 10),
            0,
            "{spec}: calling-thread step allocated"
        );
        // Two threads: rayon's work-stealing deques (crossbeam) occasionally resize when jobs
        // are stolen; that is the scheduler, not the step, so it must stay far below one per
        // step.
        let n = steps(spec, 2, 16, 64, 40);
        assert!(n < 20, "{spec}: {n} allocations in 40 two-thread steps");
        let n = steps(spec, 2, 1, 1024, 40);
        assert!(
            n < 20,
            "{spec}: {n} allocations in 40 two-thread split steps"
        );
    }
}

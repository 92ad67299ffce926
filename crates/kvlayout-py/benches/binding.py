"""The Python binding's overhead (a benchmark, not a test).

1. Per call: ``Layout.offset``, ``Layout.view`` and ``Layout.check`` from Python against the
   same calls timed inside Rust (``kvlayout._native._time_calls``), on Llama-3-8B.
2. The main job's decode step (Llama-3-8B layer 0, bf16 token-major pages, 8 sequences of
   1024 tokens, 32 query heads) on the CPU backend through ``Backend.paged_decode`` against
   the same step timed inside Rust (``Backend._time_decode``: the op alone), runs
   interleaved, in the same process. Target: Python within 5% of Rust.

Run: ``.venv/bin/python crates/kvlayout-py/benches/binding.py [--runs 30] [--json]``
after ``pip install ./crates/kvlayout-py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import ml_dtypes
import numpy as np

import kvlayout

SEQS, CONTEXT = 8, 1024


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def per_call(layout: kvlayout.Layout, cache: kvlayout.Cache, n: int) -> dict:
    g = (layout.num_blocks - 1, layout.num_kv_heads - 1)
    k = cache.view("k", "flash-attn", 0)
    calls = {
        "offset": lambda: layout.offset("v", 0, g[0], g[1], 1, 3),
        "view": lambda: layout.view("flash-attn", "k", 0),
        "check": lambda: layout.check(k, "k", "flash-attn", 0, base=cache.buffers[0]),
    }
    out = {}
    for name, call in calls.items():
        call()
        start = time.perf_counter()
        for _ in range(n):
            call()
        python_ns = (time.perf_counter() - start) / n * 1e9
        rust_ns = kvlayout._native._time_calls(layout, name, n)
        out[name] = {"python_ns": python_ns, "rust_ns": rust_ns, "overhead_ns": python_ns - rust_ns}
    return out


def decode_step(runs: int, threads: int | None) -> dict:
    layout = kvlayout.Layout("llama-3-8b")
    be = kvlayout.open("cpu", threads=threads)
    cache = kvlayout.Cache.zeros(layout)
    rng = np.random.default_rng(1)
    n, h, d = layout.block_size, layout.num_kv_heads, layout.kv_widths[0]
    per_seq = CONTEXT // n
    blocks = rng.permutation(layout.num_blocks)[: SEQS * per_seq].astype(np.int32)
    table = blocks.reshape(SEQS, per_seq)
    for s in range(SEQS):
        slots = (table[s][:, None] * n + np.arange(n)[None, :]).reshape(-1).astype(np.int64)
        kv = rng.standard_normal((2, CONTEXT, h, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
        be.write_kv(cache, kv[0], kv[1], slots, layer=0)
    query = rng.standard_normal((SEQS, 4 * h, d), dtype=np.float32).astype(ml_dtypes.bfloat16)
    lens = np.full(SEQS, CONTEXT, dtype=np.uint32)
    out = be.paged_decode(cache, query, table, lens)  # first touch, warm-up
    python_s, rust_s = [], []
    for _ in range(runs):
        start = time.perf_counter()
        be.paged_decode(cache, query, table, lens, out=out)
        python_s.append(time.perf_counter() - start)
        rust_s += be._time_decode(cache, query, table, lens, 0, 1)
    py_med, rust_med = statistics.median(python_s), statistics.median(rust_s)
    return {
        "backend": be.name,
        "kernels": be.kernels,
        "python_ms": py_med * 1e3,
        "rust_ms": rust_med * 1e3,
        "python_over_rust": py_med / rust_med,
        "runs": runs,
    }, layout, cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30, help="timed decode runs of each kind")
    ap.add_argument("--calls", type=int, default=200_000, help="calls per overhead figure")
    ap.add_argument("--threads", type=int, default=None, help="CPU backend threads")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    decode, layout, cache = decode_step(a.runs, a.threads)
    calls = per_call(layout, cache, a.calls)
    report = {"cpu": cpu_name(), "python": platform.python_version(), "decode": decode, "calls": calls}
    if a.json:
        print(json.dumps(report, indent=2))
        return
    print(f"CPU: {report['cpu']}; Python {report['python']}; kvlayout {kvlayout.__version__}")
    print(f"{'call':8} {'python ns':>10} {'rust ns':>10} {'overhead ns':>12}")
    for name, c in calls.items():
        print(f"{name:8} {c['python_ns']:10.0f} {c['rust_ns']:10.0f} {c['overhead_ns']:12.0f}")
    k = decode["kernels"]
    print(
        f"decode step ({decode['backend']}, {k['build']}, {k['threads']} threads, median of "
        f"{decode['runs']}): python {decode['python_ms']:.3f} ms, rust {decode['rust_ms']:.3f} ms, "
        f"ratio {decode['python_over_rust']:.3f} (target <= 1.05)"
    )


if __name__ == "__main__":
    main()

"""Paged decode attention computed independently with numpy (float64).

Reads the dense inputs the Rust test generated (before they were written into any cache):
    meta.json  {"seqs", "q_heads", "kv_heads", "head", "head_v", "max_len", "lens",
                "scale", "window", "soft_cap"}
    q.f32      [seqs, q_heads, head]            little-endian float32
    k.f32      [seqs, max_len, kv_heads, head]
    v.f32      [seqs, max_len, kv_heads, head_v]
and writes out.f32 [seqs, q_heads, head_v]: softmax(scale * q k^T [soft-capped, windowed]) v,
with query head h reading KV head h // (q_heads // kv_heads).
"""

import json
import sys

import numpy as np


def main(folder):
    with open(f"{folder}/meta.json") as f:
        m = json.load(f)
    s, hq, hkv, d, dv, t = (m[k] for k in ("seqs", "q_heads", "kv_heads", "head", "head_v", "max_len"))
    load = lambda name, shape: np.fromfile(f"{folder}/{name}", dtype="<f4").astype(np.float64).reshape(shape)
    q = load("q.f32", (s, hq, d))
    k = load("k.f32", (s, t, hkv, d))
    v = load("v.f32", (s, t, hkv, dv))
    out = np.zeros((s, hq, dv))
    group = hq // hkv
    for i in range(s):
        length = m["lens"][i]
        start = max(0, length - m["window"]) if m["window"] else 0
        if length == 0:
            continue
        for h in range(hq):
            kv = h // group
            logits = (k[i, start:length, kv, :] @ q[i, h]) * m["scale"]
            if m["soft_cap"]:
                c = m["soft_cap"]
                logits = c * np.tanh(logits / c)
            p = np.exp(logits - logits.max())
            out[i, h] = (p / p.sum()) @ v[i, start:length, kv, :]
    out.astype("<f4").tofile(f"{folder}/out.f32")


if __name__ == "__main__":
    main(sys.argv[1])

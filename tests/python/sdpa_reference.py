"""Paged-decode attention computed independently with numpy (float64).

Usage: python3 sdpa_reference.py IN_DIR OUT_DIR

IN_DIR/problems.json is a list of problems; each names little-endian float32 files in IN_DIR
holding the dense inputs the Rust test generated (before they were written into any cache):

    {"seqs", "q_heads", "kv_heads", "head", "head_v", "max_len", "lens": [..],
     "scale", "window": int|null, "soft_cap": float|null, "mla": bool,
     "q": file [seqs, q_heads, head],
     "k": file [seqs, max_len, kv_heads, head],
     "v": file [seqs, max_len, kv_heads, head_v] (absent for MLA: V is the first head_v
          elements of the latent K),
     "out": file name to write in OUT_DIR, [seqs, q_heads, head_v]}

For each sequence s and query head h (KV head h // (q_heads // kv_heads)):
    logits = scale * q[s, h] . k[s, t, kv]         for t in [max(0, len - window), len)
    logits = soft_cap * tanh(logits / soft_cap)    if soft_cap
    out[s, h] = softmax(logits) @ v[s, t, kv]      (zeros for an empty sequence)
"""

import json
import os
import sys

import numpy as np


def load(folder, name, shape):
    data = np.fromfile(os.path.join(folder, name), dtype="<f4").astype(np.float64)
    return data.reshape(shape)


def solve(folder, p):
    s, hq, hkv = p["seqs"], p["q_heads"], p["kv_heads"]
    d, dv, t = p["head"], p["head_v"], p["max_len"]
    q = load(folder, p["q"], (s, hq, d))
    k = load(folder, p["k"], (s, t, hkv, d))
    v = k[..., :dv] if p["mla"] else load(folder, p["v"], (s, t, hkv, dv))
    group = hq // hkv
    out = np.zeros((s, hq, dv))
    for i in range(s):
        length = p["lens"][i]
        if length == 0:
            continue
        start = max(0, length - p["window"]) if p["window"] else 0
        for h in range(hq):
            kv = h // group
            logits = (k[i, start:length, kv, :] @ q[i, h]) * p["scale"]
            if p["soft_cap"]:
                c = p["soft_cap"]
                logits = c * np.tanh(logits / c)
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v[i, start:length, kv, :]
    return out


def main(in_dir, out_dir):
    with open(os.path.join(in_dir, "problems.json")) as f:
        problems = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    for p in problems:
        solve(in_dir, p).astype("<f4").tofile(os.path.join(out_dir, p["out"]))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: sdpa_reference.py IN_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])

"""Paged-decode attention computed independently with numpy (float64).

Usage: python3 sdpa_reference.py IN_DIR OUT_DIR

IN_DIR/problems.json is a list of problems; each names little-endian float32 files in IN_DIR
holding the dense inputs the Rust test generated (before they were written into any cache):

    {"seqs", "q_heads", "kv_heads", "head", "head_v", "max_len", "lens": [..],
     "scale", "window": int|null, "soft_cap": float|null, "mla": bool,
     "cache": {"dtype": "f32"|"f16"|"bf16"|"fp8_e4m3"|"fp8_e5m2"|"int8",
               "k_scale": float, "v_scale": float, "inline": bool},
     "q": file [seqs, q_heads, head],
     "k": file [seqs, max_len, kv_heads, head],
     "v": file [seqs, max_len, kv_heads, head_v] (absent for MLA: V is the first head_v
          elements of the latent K),
     "out": name of the outputs to write in OUT_DIR}

For each sequence s and query head h (KV head h // (q_heads // kv_heads)):
    logits = scale * q[s, h] . k[s, t, kv]         for t in [max(0, len - window), len)
    logits = soft_cap * tanh(logits / soft_cap)    if soft_cap
    out[s, h] = softmax(logits) @ v[s, t, kv]      (zeros for an empty sequence)

Written to OUT_DIR, for a problem whose "out" is NAME:
    NAME           f32 [seqs, q_heads, head_v]: the attention of the dense inputs;
    NAME.bound     f64 [seqs, q_heads, head_v]: how far the cache's quantization can move each
                   output element from NAME (see `attend`);
    NAME.mirror    f32 [seqs, q_heads, head_v]: the attention of the values the cache holds,
                   quantized here as the documented write does (see `cached`);
    NAME.mags      f64 [seqs, q_heads, 2]: per output row, over the tokens attended, of those
                   cached values: max |v| and max |scale| * sum_i |q_i k_i|;
and OUT_DIR/stats.json: {NAME: max |scale * q . k| over the dense logits attended}.
"""

import json
import os
import sys

import numpy as np

# Float cache dtypes: (explicit mantissa bits, exponent of the smallest normal, largest
# finite value). Encoding rounds to nearest even and saturates (fp8, as NVIDIA's cuda_fp8.hpp).
FLOATS = {
    "f32": (23, -126, float(np.finfo(np.float32).max)),
    "f16": (10, -14, 65504.0),
    "bf16": (7, -126, float.fromhex("0x1.fep127")),
    "fp8_e4m3": (3, -6, 448.0),
    "fp8_e5m2": (2, -14, 57344.0),
}
# Largest magnitude of a dtype of inline-scale rows: the row's scale is amax / this.
INLINE_MAX = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
# Standard deviations of a logit's rounding error allowed (see `attend`): a sum of dozens of
# independent bounded errors, whose tails fall faster than a normal's (6 sigma: 2e-9).
LOGIT_SIGMAS = 6.0


def load(folder, name, shape):
    data = np.fromfile(os.path.join(folder, name), dtype="<f4").astype(np.float64)
    return data.reshape(shape)


def encode(x, dtype):
    """The stored value of each element of `x` (float64 holding float32 values): int8 rounds
    half away from zero and saturates at +-127; floats round to the nearest multiple of the
    element's ulp (ties to even: an even multiple has an even mantissa) and saturate."""
    if dtype == "int8":
        return np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), -127.0, 127.0)
    m, emin, top = FLOATS[dtype]
    _, e = np.frexp(x)  # |x| in [2^(e-1), 2^e)
    ulp = np.ldexp(1.0, np.maximum(e - 1, emin) - m)
    return np.clip(np.round(x / ulp) * ulp, -top, top)


def cached(x, cache, tensor):
    """What the cache stores for the dense rows `x` (last axis: a row) written with the
    per-tensor scale `tensor`: `(stored, step, err)`, the value read back being
    `stored * step`. write_kv divides each element by the tensor scale (in f32), for
    inline-scale rows also by the row's scale `amax / INLINE_MAX` (amax of the divided row,
    in f32), and encodes the quotient; `step` is the tensor scale times the row scale.

    `err` bounds |stored * step - x| per element from the dense value alone: half a
    quantization step (int8: step / 2; floats: half an ulp, at most |x| 2^-(m+1) for a
    normal and 2^(emin-m-1) step for a subnormal), plus |x| 2^-22 for the two f32 divisions.
    (Saturation is not covered: no quotient here exceeds the dtype's largest value.)
    """
    dtype = cache["dtype"]
    xs = x.astype(np.float32) / np.float32(tensor)
    row = np.ones(x.shape[:-1] + (1,), dtype=np.float32)
    if cache["inline"]:
        amax = np.abs(xs).max(axis=-1, keepdims=True)
        row = np.where(amax > 0, amax / np.float32(INLINE_MAX[dtype]), np.float32(1.0))
        row = row.astype(np.float32)
        xs = xs / row
    stored = encode(xs.astype(np.float64), dtype)
    step = tensor * row.astype(np.float64)
    ax = np.abs(x)
    if dtype == "int8":
        half = 0.5 * step * np.ones_like(x)
    else:
        m, emin, _ = FLOATS[dtype]
        half = np.maximum(ax * 2.0 ** -(m + 1), 2.0 ** (emin - m - 1) * step)
    return stored, step, half + ax * 2.0**-22


def attend(p, q, k, v, kerr=None, verr=None):
    """Decode attention of `q` over `k`, `v` (dense [seqs, max_len, kv_heads, width]).

    Returns `(out, mags, bound, max_logit)`. With per-element bounds `kerr`, `verr` on how far
    a cache's values lie from `k`, `v`, `bound` bounds how far attention over the cache's
    values lies from `out`, element by element:

    - a logit moves by at most e = |scale| * sum_i |q_i| kerr_i; rounding errors of distinct
      elements are independent and spread evenly within +-kerr_i (the usual model of
      round-to-nearest), so the sum has a standard deviation of sqrt(sum_i q_i^2 kerr_i^2 / 3)
      and e is taken as the smaller of the worst case and LOGIT_SIGMAS of those (the worst
      case over a row of 64 elements is 8 / sqrt(3) = 4.6 of them, yet the sum reaches it
      only when every element errs by a full half step in the direction of its query);
      the soft-cap is 1-Lipschitz, so a capped logit moves no further;
    - logits that move by at most e change each softmax weight p_t by a factor within
      e^(+-2e), so the output moves by at most (e^(2e) - 1) * sum_t p_t |v_t - out|, plus
      e^(2e) * sum_t p_t verr_t from the values' own errors (a convex combination of them).
    """
    s, hq, hkv = p["seqs"], p["q_heads"], p["kv_heads"]
    dv = p["head_v"]
    group = hq // hkv
    out = np.zeros((s, hq, dv))
    mags = np.zeros((s, hq, 2))
    bound = np.zeros((s, hq, dv))
    max_logit = 0.0
    for i in range(s):
        length = p["lens"][i]
        if length == 0:
            continue
        start = max(0, length - p["window"]) if p["window"] else 0
        for h in range(hq):
            kv = h // group
            kk = k[i, start:length, kv, :]
            vv = v[i, start:length, kv, :]
            logits = (kk @ q[i, h]) * p["scale"]
            max_logit = max(max_logit, float(np.abs(logits).max()))
            mags[i, h] = (
                np.abs(vv).max(),
                (np.abs(kk) @ np.abs(q[i, h])).max() * abs(p["scale"]),
            )
            if p["soft_cap"]:
                c = p["soft_cap"]
                logits = c * np.tanh(logits / c)
            w = np.exp(logits - logits.max())
            w /= w.sum()
            out[i, h] = w @ vv
            if kerr is not None:
                ke = kerr[i, start:length, kv, :]
                worst = ke @ np.abs(q[i, h])
                sigma = np.sqrt((ke * ke) @ (q[i, h] * q[i, h]) / 3.0)
                e = abs(p["scale"]) * np.minimum(worst, LOGIT_SIGMAS * sigma).max()
                spread = w @ np.abs(vv - out[i, h])
                own = w @ verr[i, start:length, kv, :]
                bound[i, h] = np.expm1(2.0 * e) * spread + np.exp(2.0 * e) * own
    return out, mags, bound, max_logit


def solve(folder, p):
    s, hq, hkv = p["seqs"], p["q_heads"], p["kv_heads"]
    d, dv, t = p["head"], p["head_v"], p["max_len"]
    q = load(folder, p["q"], (s, hq, d))
    k = load(folder, p["k"], (s, t, hkv, d))
    v = k[..., :dv] if p["mla"] else load(folder, p["v"], (s, t, hkv, dv))
    cache = p["cache"]
    k_stored, k_step, kerr = cached(k, cache, cache["k_scale"])
    if p["mla"]:
        # One stored latent, written with k_scale; V (its first head_v elements) reads it back
        # with v_scale.
        v_stored = k_stored[..., :dv]
        v_step = k_step / cache["k_scale"] * cache["v_scale"]
        verr = kerr[..., :dv]
    else:
        v_stored, v_step, verr = cached(v, cache, cache["v_scale"])
    out, _, bound, max_logit = attend(p, q, k, v, kerr, verr)
    mirror, mags, _, _ = attend(p, q, k_stored * k_step, v_stored * v_step)
    return out, bound, mirror, mags, max_logit


def main(in_dir, out_dir):
    with open(os.path.join(in_dir, "problems.json")) as f:
        problems = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    stats = {}
    for p in problems:
        out, bound, mirror, mags, max_logit = solve(in_dir, p)
        name = os.path.join(out_dir, p["out"])
        out.astype("<f4").tofile(name)
        bound.astype("<f8").tofile(name + ".bound")
        mirror.astype("<f4").tofile(name + ".mirror")
        mags.astype("<f8").tofile(name + ".mags")
        stats[p["out"]] = max_logit
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: sdpa_reference.py IN_DIR OUT_DIR")
    main(sys.argv[1], sys.argv[2])

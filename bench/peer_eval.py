#!/usr/bin/env python3
"""The peer of `kvscope-cli eval` for bench/peers.sh: the same exact attention and the same scoring
of a compressed selection, in torch float32 (its BLAS: oneDNN / OpenBLAS), on one layer of a
capture.

What it computes per kv head, as engine/attention/exact_attention.cpp does (docs/evaluation.md):
  - the window: s = min(256, n/32) sinks, E = min(256, n/8) evaluation queries, middle [s, n-E);
  - the exact side: logits of the E evaluation queries of every query head of the GQA group
    against all keys (causal), softmax, outputs, and the norms Eq. (2) needs;
  - for every keep ratio and seed, a `uniform` selection (m = round(ratio * n_mid) middle tokens at
    random, weight n_mid / m: the method of the benchmark) scored against the exact side: the kept
    columns' logits gathered from the exact logits plus log w, masked softmax, P V, and the
    relative / normalised errors and the kept mass.
The random draws are torch's, not KVScope's Philox stream, so the error figures agree with
KVScope's only statistically (both are printed); the work is the same.

Usage: peer_eval.py CAPTURE [--layer 0] [--ratios 0.5,0.25,0.125] [--seeds 3] [--threads 2]
Prints one line of JSON: cpu_s (process CPU time of the evaluation, after loading), wall_s, and
the mean relative error per ratio.
"""
import argparse
import json
import math
import struct
import sys
import time

import torch


def read_safetensors(path, names):
    """The named tensors of a .safetensors file as float32 torch tensors (F32, F16, BF16)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        out = {}
        for name in names:
            if name not in header:
                sys.exit(f"peer_eval: {path} has no tensor '{name}'")
            meta = header[name]
            begin, end = meta["data_offsets"]
            f.seek(base + begin)
            raw = bytearray(f.read(end - begin))
            dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}.get(meta["dtype"])
            if dtype is None:
                sys.exit(f"peer_eval: tensor '{name}' has dtype {meta['dtype']} (need F32, F16 or BF16)")
            out[name] = torch.frombuffer(raw, dtype=dtype).reshape(meta["shape"]).float()
    return out


def evaluate_layer(q, k, v, ratios, seeds):
    """q: [q_heads, n, d], k: [kv_heads, n, d], v: [kv_heads, n, dv]. Returns mean relative error
    per ratio (over kv heads, group heads, seeds and queries)."""
    kv_heads, n, d = k.shape
    group = q.shape[0] // kv_heads
    s, E = min(256, n // 32), min(256, n // 8)
    mid_begin, mid_end = s, n - E
    n_mid = mid_end - mid_begin
    scale = 1.0 / math.sqrt(d)
    pos = torch.arange(n - E, n)
    causal = torch.arange(n)[None, :] <= pos[:, None]  # [E, n]
    totals = {r: 0.0 for r in ratios}
    counts = {r: 0 for r in ratios}
    for h in range(kv_heads):
        K, V = k[h], v[h]
        Qe = q[h * group:(h + 1) * group, n - E:, :]  # [g, E, d]
        logits = torch.matmul(Qe, K.T) * scale  # [g, E, n]
        logits = logits.masked_fill(~causal, float("-inf"))
        shift = logits.amax(dim=-1, keepdim=True)
        p = torch.exp(logits - shift)
        z = p.sum(dim=-1, keepdim=True)
        exact = torch.matmul(p, V) / z  # [g, E, dv]
        exact_norm = exact.norm(dim=-1)
        softmax_norm = (p / z).norm(dim=-1)
        v_frob = torch.sqrt(torch.cumsum((V * V).sum(-1), 0))[n - E:]  # [E]
        window = torch.arange(n - E, n)
        sinks = torch.arange(0, s)
        for r in ratios:
            m = int(round(r * n_mid))
            for seed in range(seeds):
                gen = torch.Generator().manual_seed(seed * 1000003 + h)
                sel = torch.randperm(n_mid, generator=gen)[:m].sort().values + mid_begin
                logw = math.log(n_mid / m) if m > 0 else 0.0
                cols = torch.cat([sinks, sel, window])
                bias = torch.cat([torch.zeros(s), torch.full((m,), logw), torch.zeros(E)])
                w = logits[:, :, cols] + bias  # gathered, window already masked causally
                m2 = w.amax(dim=-1, keepdim=True)
                x = torch.exp(w - m2)
                den = x.sum(-1, keepdim=True)
                approx = torch.matmul(x, V[cols]) / den
                diff = (approx - exact).norm(dim=-1)
                rel = diff / exact_norm
                _normalized = diff / (softmax_norm * v_frob)
                inv_w = torch.exp(-bias)
                _mass = (x * inv_w).sum(-1) * torch.exp(m2 - shift).squeeze(-1) / z.squeeze(-1)
                totals[r] += rel.sum().item()
                counts[r] += rel.numel()
    return {str(r): totals[r] / counts[r] for r in ratios}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("capture")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--ratios", default="0.5,0.25,0.125")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ratios = [float(x) for x in a.ratios.split(",")]
    L = a.layer
    t = read_safetensors(a.capture, [f"layers.{L}.query", f"layers.{L}.key", f"layers.{L}.value"])
    q, k, v = t[f"layers.{L}.query"], t[f"layers.{L}.key"], t[f"layers.{L}.value"]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with torch.no_grad():
        errors = evaluate_layer(q, k, v, ratios, a.seeds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"peer": "torch float32", "torch": torch.__version__, "threads": a.threads,
                      "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                      "mean_relative": errors}))


if __name__ == "__main__":
    main()

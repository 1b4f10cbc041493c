#!/usr/bin/env python3
"""A straightforward PyTorch implementation of practical BalanceKV, the whole walk as the authors'
public balanced_walk runs it, as the baseline for the CUDA kernels (docs/performance.md: the
kernel should be >= 20x faster) and as an executable statement of the algorithm.

The full walk of one layer (docs/methods.md, docs/balancekv.md), batched over heads and blocks,
sequential over the B steps of a block (the walk is inherently sequential there). Per round t:

  * gather the surviving tokens in walk order, zero-pad to a multiple of the block B;
  * centre each block by its mean over all B rows, the zero padding included;
  * K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * ((<v_i w_i, v_j w_j> + 1e-8) + 0.025) in float32,
    w the weights accumulated so far (1 in round 1); an overflowed exp stays inf;
  * sigma_0 = +1, p_i = 1/2 - gamma * sum_j K_ij sigma_j over the whole block row with sigma_j = 0
    for j >= i (so one inf in row i gives NaN and sigma_i = -1), sigma_i = +1 iff u_i < p_i;
  * drop the padding; c_neg / c_pos = the first index where the running count of -1 / +1 signs
    reaches n//2 (0 if never), c = max(c_neg, c_pos); weight 2*sigma_i up to c (negated when
    sigma_c = +1), 1 after c; keep the first n//2 tokens by stable descending weight;
  * multiply the weights, n = n//2.

Modes:
  (default)        time the walk on the GPU: one layer of H heads x N tokens, d = dv = 128, B = 128,
                   two rounds (bench/bench_gpu.cpp's BM_GpuWalkLayerTwoRounds does the same work),
                   uniforms from torch's generator; prints one JSON object (milliseconds, median
                   over --reps).
  --check-golden   run the port on ../shared/golden/*.json fed KVScope's Philox uniforms
                   (counter_uniform(seed, 1, layer, kv_head, round, block, step), engine/core/random.h)
                   and report how many cases give the authors' indices and weights exactly.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

VALUE_BIAS = 0.025
VALUE_EPS = 1e-8


def balancekv_walk(key, value, gamma, temp, beta, rounds, block, uniforms):
    """key, value: [b, h, n, d] float32. uniforms(t, shape) -> [b, h, blocks, B] float32 for round
    t. Returns (indices [b, h, n >> rounds] into the n tokens, in walk order; weights)."""
    import torch

    b, h, n, d = key.shape
    dev = key.device
    order = torch.arange(n, device=dev).expand(b, h, n)  # walk order of the survivors
    weight = torch.ones(b, h, n, device=dev, dtype=torch.float32)
    for t in range(rounds):
        padded = -(-n // block) * block
        idx = order.unsqueeze(-1)
        k = key.gather(2, idx.expand(-1, -1, -1, d))
        v = value.gather(2, idx.expand(-1, -1, -1, value.shape[-1])) * weight.unsqueeze(-1)
        k = torch.nn.functional.pad(k, (0, 0, 0, padded - n)).view(b, h, -1, block, d)
        v = torch.nn.functional.pad(v, (0, 0, 0, padded - n)).view(b, h, -1, block, v.shape[-1])
        k = k - k.mean(dim=-2, keepdim=True)
        gram = torch.matmul(k, k.transpose(-1, -2))
        kern = torch.exp(temp * gram / math.sqrt(d) - beta)
        kern = kern * (torch.matmul(v, v.transpose(-1, -2)) + VALUE_EPS + VALUE_BIAS)
        u = uniforms(t, kern.shape[:4])
        sigma = torch.zeros(kern.shape[:4], device=dev, dtype=torch.float32)
        sigma[..., 0] = 1.0
        for i in range(1, block):
            partial = (kern[..., i, :] * sigma).sum(dim=-1)
            p = 0.5 - gamma * partial
            sigma[..., i] = torch.where(u[..., i] < p, 1.0, -1.0)
        sigma = sigma.reshape(b, h, -1)[..., :n]

        half = n // 2
        neg = (sigma < 0).to(torch.int64).cumsum(-1)
        pos = (sigma > 0).to(torch.int64).cumsum(-1)
        c = torch.maximum(torch.argmax((neg == half).to(torch.int64), dim=-1),
                          torch.argmax((pos == half).to(torch.int64), dim=-1))
        at = torch.arange(n, device=dev)
        upto = at <= c.unsqueeze(-1)
        sign_c = sigma.gather(-1, c.unsqueeze(-1))
        factor = torch.where(upto, 2.0 * sigma * torch.where(sign_c > 0, -1.0, 1.0),
                             torch.ones_like(sigma))
        keep = torch.argsort(-factor, dim=-1, stable=True)[..., :half]
        order = order.gather(-1, keep)
        weight = weight.gather(-1, keep) * factor.gather(-1, keep)
        n = half
    return order, weight


# ---- KVScope's Philox4x32-10 uniforms (engine/core/random.h), vectorised with numpy.

def counter_uniforms(seed, purpose, layer, head, rnd, blocks, steps):
    """counter_uniform(seed, purpose, layer, head, rnd, block, step) for every block < blocks and
    step < steps, as a [blocks, steps] float64 array."""
    import numpy as np

    m = np.uint64(0xFFFFFFFF)
    blk, stp = np.meshgrid(np.arange(blocks, dtype=np.uint64), np.arange(steps, dtype=np.uint64),
                           indexing="ij")
    c0 = stp.copy()
    c1 = blk.copy()
    c2 = np.full_like(c0, (rnd & 0xFFFF) | ((head << 16) & 0xFFFFFFFF))
    c3 = np.full_like(c0, (layer & 0xFFFF) | ((purpose << 16) & 0xFFFFFFFF))
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & m
        hi1, lo1 = p1 >> np.uint64(32), p1 & m
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & m, lo1, (hi0 ^ c3 ^ k1) & m, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & m
        k1 = (k1 + np.uint64(0xBB67AE85)) & m
    bits = ((c0 << np.uint64(21)) ^ (c1 >> np.uint64(11))) & np.uint64((1 << 53) - 1)
    return bits.astype(np.float64) * (1.0 / 9007199254740992.0)


def read_safetensors(path):
    """{name: float32 torch tensor} of a KVScope capture (F32/F16/BF16 tensors)."""
    import numpy as np
    import torch

    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype=np.float32)
        elif info["dtype"] == "F16":
            arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        elif info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def head_tensor(tensors, kind, layer, head):
    """Keys or values of one kv head as [n, d], whatever the capture's layout of that layer."""
    name = f"layers.{layer}.{kind}"  # [kv_heads, n, d] (docs/capture-format.md)
    if name not in tensors:
        raise KeyError(f"{name}: no such tensor in the capture")
    return tensors[name][head]


def check_golden(golden_dir, sample_dir, limit):
    import torch

    total = matched = 0
    first_bad = None
    for fname in sorted(os.listdir(golden_dir)):
        if not fname.endswith(".json"):
            continue
        g = json.load(open(os.path.join(golden_dir, fname)))
        cap = os.path.join(golden_dir, g["capture"])
        if not os.path.exists(cap):
            cap = os.path.join(sample_dir, g["capture"])
        tensors = read_safetensors(cap)
        sink, n = g["sink"], g["n"]
        mid_end = n - g["eval"]
        cases = g["cases"][:limit] if limit else g["cases"]
        for c in cases:
            layer, head, seed = c["layer"], c["kv_head"], c["seed"]
            keys = head_tensor(tensors, "key", layer, head)[sink:mid_end]
            values = head_tensor(tensors, "value", layer, head)[sink:mid_end]
            rounds = round(math.log2(1 / c["ratio"]))

            def uniforms(t, shape):
                u = counter_uniforms(seed, 1, layer, head, t, shape[2], shape[3])
                return torch.from_numpy(u).to(torch.float32).view(shape)

            idx, w = balancekv_walk(keys[None, None], values[None, None], c["gamma"], c["temp"],
                                    0.0, rounds, c["block"], uniforms)
            got = sorted(zip((idx[0, 0] + sink).tolist(), w[0, 0].tolist()))
            want = list(zip(c["indices"], c["weights"]))
            ok = [i for i, _ in got] == [i for i, _ in want] and all(
                abs(a[1] - b[1]) <= 1e-6 * abs(b[1]) for a, b in zip(got, want))
            total += 1
            matched += ok
            if not ok and first_bad is None:
                first_bad = {k: c[k] for k in ("layer", "kv_head", "ratio", "gamma", "temp",
                                               "block", "seed")}
                first_bad["file"] = fname
        print(f"{fname}: {matched}/{total} cases identical so far", file=sys.stderr)
    print(json.dumps({"golden_cases": total, "identical": matched, "first_mismatch": first_bad}))
    return 0 if matched == total else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--temp", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda",
                    help="cuda (the measurement); cpu only to smoke-test the script with small sizes")
    ap.add_argument("--check-golden", action="store_true",
                    help="compare with ../shared/golden (KVScope's uniforms) instead of timing")
    ap.add_argument("--golden-dir", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                         "shared", "golden"))
    ap.add_argument("--limit", type=int, default=0, help="--check-golden: cases per file (0: all)")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print(json.dumps({"error": "PyTorch is not installed"}))
        return 2
    if args.check_golden:
        sample = os.path.join(os.path.dirname(__file__), "..", "sample_data")
        with torch.no_grad():
            return check_golden(args.golden_dir, sample, args.limit)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False: no CUDA device"}))
        return 2

    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(42)
    # Same value ranges as bench_gpu.cpp: keys uniform in [-0.6, 0.6], values in [-0.1, 0.1].
    shape = (1, args.heads, args.tokens, args.dim)
    keys = (torch.rand(shape, device=dev, generator=gen) * 2 - 1) * 0.6
    values = (torch.rand(shape, device=dev, generator=gen) * 2 - 1) * 0.1

    def uniforms(t, s):
        return torch.rand(s, device=dev, generator=gen)

    def run():
        balancekv_walk(keys, values, args.gamma, args.temp, 0.0, args.rounds, args.block, uniforms)

    with torch.no_grad():
        for _ in range(args.warmup):
            run()
        if on_gpu:
            torch.cuda.synchronize()
        times, cpu_times = [], []  # wall (or GPU event) ms; process CPU ms (CPU device only)
        for _ in range(args.reps):
            if on_gpu:
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0, c0 = time.perf_counter(), time.process_time()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
                cpu_times.append((time.process_time() - c0) * 1e3)
    times.sort()
    cpu_times.sort()
    print(json.dumps({
        "torch_walk_ms": times[len(times) // 2],
        "torch_walk_min_ms": times[0],
        # CPU time of the process per walk (all its threads): what a loaded machine disturbs least.
        **({"torch_walk_cpu_ms": cpu_times[len(cpu_times) // 2]} if cpu_times else {}),
        "heads": args.heads, "tokens": args.tokens, "dim": args.dim, "block": args.block,
        "rounds": args.rounds, "reps": args.reps,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

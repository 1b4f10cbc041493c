#!/usr/bin/env python3
"""A straightforward PyTorch implementation of the practical BalanceKV blockwise walk, timed on the
GPU, as the baseline for the CUDA kernel (DESIGN.md section 6: the kernel should be >= 20x faster).

Same work as bench/bench_gpu.cpp's BM_GpuWalkLayerTwoRounds: one layer of H heads x N tokens,
d = dv = 128, blocks of B = 128, keys already centred and values already weighted (as the engine
hands them to Backend::walk_blocks), two rounds (round 2 walks N/2 tokens per head). Per round:

    K_ij  = exp(temp <k_i,k_j>/sqrt(d) - beta) * (<v_i,v_j> + value_bias)   (batched bmm)
    sigma_0 = +1; p_i = 1/2 - gamma * sum_{j<i} K_ij sigma_j; sigma_i = +1 iff u_i < clip(p_i,0,1)

batched over all blocks, sequential over the B steps (the walk is inherently sequential inside a
block). The uniforms come from torch's generator, not the engine's Philox counters, so the signs
are not bit-comparable with the kernel's; the arithmetic and the amount of work are the same.

Prints one JSON object (times in milliseconds, median over --reps).
"""
import argparse
import json
import math
import sys
import time


def walk_round(keys, values, block, gamma, temp, beta, value_bias, generator):
    import torch

    rows, d = keys.shape
    blocks = rows // block
    k = keys.view(blocks, block, d)
    v = values.view(blocks, block, values.shape[1])
    kernel = torch.exp(torch.bmm(k, k.transpose(1, 2)) * (temp / math.sqrt(d)) - beta)
    kernel *= torch.bmm(v, v.transpose(1, 2)) + value_bias
    u = torch.rand(blocks, block, device=keys.device, generator=generator)
    sigma = torch.empty(blocks, block, device=keys.device)
    partial = torch.zeros(blocks, block, device=keys.device)
    p_all = torch.empty(blocks, block, device=keys.device)
    sigma[:, 0] = 1.0
    p_all[:, 0] = 0.5
    partial += kernel[:, :, 0]
    for i in range(1, block):
        p = 0.5 - gamma * partial[:, i]
        p_all[:, i] = p
        s = torch.where(u[:, i] < p.clamp(0.0, 1.0), 1.0, -1.0)
        sigma[:, i] = s
        partial += kernel[:, :, i] * s[:, None]
    return sigma, p_all


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda",
                    help="cuda (the measurement); cpu only to smoke-test the script with small sizes")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print(json.dumps({"error": "PyTorch is not installed"}))
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False: no CUDA device"}))
        return 2
    if args.tokens % (args.block << (args.rounds - 1)) != 0:
        print(json.dumps({"error": "--tokens must be a multiple of block * 2^(rounds-1)"}))
        return 2

    dev = torch.device(args.device)
    on_gpu = dev.type == "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(42)
    rows = args.heads * args.tokens
    # Same value ranges as bench_gpu.cpp: keys uniform in [-0.6, 0.6], values in [-0.1, 0.1].
    keys = (torch.rand(rows, args.dim, device=dev, generator=gen) * 2 - 1) * 0.6
    values = (torch.rand(rows, args.dim, device=dev, generator=gen) * 2 - 1) * 0.1

    def run():
        for r in range(args.rounds):
            # Round r walks the first tokens / 2^r tokens of every head, laid out contiguously.
            n = rows >> r
            walk_round(keys[:n], values[:n], args.block, args.gamma, 1.0, 0.0, 0.025, gen)

    with torch.no_grad():
        for _ in range(args.warmup):
            run()
        if on_gpu:
            torch.cuda.synchronize()
        times = []
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
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    print(json.dumps({
        "torch_walk_ms": times[len(times) // 2],
        "torch_walk_min_ms": times[0],
        "heads": args.heads, "tokens": args.tokens, "dim": args.dim, "block": args.block,
        "rounds": args.rounds, "reps": args.reps,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "torch": torch.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

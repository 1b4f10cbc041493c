#!/usr/bin/env python3
"""Golden kept sets of BUZZ from its authors' own cache class.

Usage:
  /usr/bin/python3 tools/buzz_golden.py --repo /work/.mirror/JunqiZhao888+buzz-llm/repo \
      [--commit HEAD] [--out tests/data/buzz_authors.json] [CAPTURE.safetensors ...]

--repo is a git directory (bare or not) of the authors' repository, github.com/JunqiZhao888/buzz-llm.
Nothing of their code is stored in KVScope: at run time this script reads
`entry_function/eval_inside_forward/cache/cache_entity_collection.py` and the slicing helpers it
imports (`entry_function/deprecated/llm_cached/cache_data_access/kv_crud_manager.py`) out of the
git objects with `git show`, picks the classes `BuzzKVCacheWithAccumulation` (their `buzz`) and
`BuzzKVCacheNoMax` (their `buzz_no_max`, the paper's Fig. 8(b) ablation) with `ast`, and executes
only those (plus the module's DIM_TO_SLICE tables) with torch and their helper module; their
`print` in __init__ is silenced. Needs torch and numpy (Debian: python3-torch, python3-numpy; run
it with /usr/bin/python3).

What it runs, for every kv head of every capture (default: sample_data/*.safetensors) and keep
ratio 1/2, 1/4, 1/8, under KVScope's protocol (engine/eval/protocol.cpp: s = min(256, n/32) sinks,
E = min(256, n/8) evaluation queries, budget m = round(ratio * n_mid)):

1. Their class is fed one token per step, as their eval_long_ppl.py does: tokens 0 .. n-E-1 in
   order; at each step the new token's key joins the cache and its query's softmax over the
   *current, already compressed* cache (itself included), <q,k>/sqrt(d) in float64, is passed as
   `attn_scores` (shape 1 x 1 x 1 x cache length). Their class has no GQA path (its masks have
   the query heads' shape), so the GQA group's query heads are summed into that one row: the kv
   head's score as KVScope defines it (KVScope averages; the argmax is the same). The cache's
   "keys" are the token indices, so its content says which tokens it holds. Parameters are the
   ones KVScope's buzz uses by default on that budget (docs/methods.md, buzz): sink_size =
   max(4, s) (the protocol's sinks play BUZZ's sinks), stride 5, window 160 and threshold 400
   unless the window takes more than half of m; then window = floor(m/2) and threshold =
   round(window * (s^2+1)/(s+1)) for odd stride s (s-1 for even), the paper's Theorem 3.1.
   Variant "logn" multiplies the logits by log_512(cache length) (the paper's Eq. 7-8, as the
   line left commented out in their modify_llama_forward.py writes it); variant "no_local_max"
   runs BuzzKVCacheNoMax instead (no scores).
2. KVScope's mapping of the end of the prefix, on their object: while the middle holds more than
   m tokens and an eviction can still shrink it, one more of their evictions runs (their
   threshold set to -1 and the score update skipped, so their own code picks what survives;
   the paper's Remark 2, with m in place of its container T + k + w); then the free slots are filled with the most recent dropped middle tokens (KVScope's top_up = recent).

Output: JSON with the buzz-llm commit, and per case the capture, layer, kv head, ratio, variant,
window, threshold, how many middle tokens the stream left (`streamed`), the final kept middle
tokens (`kept`: the middle [mid_begin, mid_end) as hex, digit j for tokens mid_begin + 4j ..
mid_begin + 4j + 3, bit value 1 for the first), the evictions, and the smallest relative gap between a chunk's maximum and its
runner-up over every local-max decision (`min_gap`; a gap near 1e-12 would be a tie that
rounding could flip). tests/test_buzz.cpp checks KVScope's buzz against the committed file.
"""

import argparse
import ast
import contextlib
import glob
import io
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch

COLLECTION = "entry_function/eval_inside_forward/cache/cache_entity_collection.py"
HELPERS = "entry_function/deprecated/llm_cached/cache_data_access/kv_crud_manager.py"
CLASSES = ("BuzzKVCacheWithAccumulation", "BuzzKVCacheNoMax")

K_SINK, STRIDE, WINDOW, THRESHOLD = 4, 5, 160, 400  # KVScope's buzz defaults (authors' config)


def git_show(repo, commit, path):
    return subprocess.run(["git", "--git-dir", repo, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def load_authors_classes(repo, commit):
    """Their classes, built from the git objects at run time (nothing of theirs is stored)."""
    ns = {"__name__": "buzz_llm_helpers"}
    exec(compile(git_show(repo, commit, HELPERS), HELPERS, "exec"), ns)
    tree = ast.parse(git_show(repo, commit, COLLECTION), COLLECTION)
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.startswith("DIM_TO_SLICE") for t in node.targets):
            keep.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in CLASSES:
            keep.append(node)
    module = ast.Module(body=keep, type_ignores=[])
    exec(compile(module, COLLECTION, "exec"), ns)
    missing = [c for c in CLASSES if c not in ns]
    if missing:
        sys.exit(f"buzz_golden.py: {COLLECTION} at {commit} has no {', '.join(missing)}")
    return ns


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    base = 8 + size
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": np.float32, "F16": np.float16}
    tensors = {}
    for name, t in header.items():
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data, np.uint16, count=math.prod(t["shape"]),
                                offset=base + t["data_offsets"][0])
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            dt = dtypes[t["dtype"]]
            arr = np.frombuffer(data, dt, count=math.prod(t["shape"]),
                                offset=base + t["data_offsets"][0])
        tensors[name] = arr.reshape(t["shape"]).astype(np.float32).astype(np.float64)
    return meta, tensors


def llround(x):
    return int(math.floor(x + 0.5))


def theorem_ratio(stride):
    """Theorem 3.1 (Eq. 6): T/w for stride s."""
    return (stride * stride + 1) / (stride + 1) if stride % 2 else stride - 1


def buzz_params(budget):
    if 2 * WINDOW > budget:
        window = budget // 2
        return window, max(STRIDE, llround(window * theorem_ratio(STRIDE)))
    return WINDOW, THRESHOLD


class GapProbe:
    """Wraps their get_local_max_bool_mask to record how close each chunk's runner-up came."""

    def __init__(self, cls):
        self.orig = cls.get_local_max_bool_mask
        self.min_gap = math.inf
        probe = self

        def wrapped(evicted_score, cur_stride, prob=1):
            row = evicted_score[0].tolist()
            for c in range(0, len(row), cur_stride):
                chunk = sorted(row[c:c + cur_stride], reverse=True)
                if len(chunk) > 1:
                    gap = (chunk[0] - chunk[1]) / max(abs(chunk[0]), 1e-300)
                    probe.min_gap = min(probe.min_gap, gap)
            return probe.orig(evicted_score, cur_stride, prob)

        cls.get_local_max_bool_mask = staticmethod(wrapped)

    def restore(self, cls):
        cls.get_local_max_bool_mask = staticmethod(self.orig)


def mask_hex(tokens, begin, end):
    """The kept middle as hex: digit j holds tokens begin+4j .. begin+4j+3, bit value 1 first."""
    bits = [0] * (end - begin)
    for t in tokens:
        bits[t - begin] = 1
    bits += [0] * (-len(bits) % 4)
    return "".join("0123456789abcdef"[bits[j] | bits[j + 1] << 1 | bits[j + 2] << 2 |
                                      bits[j + 3] << 3] for j in range(0, len(bits), 4))


def run_case(ns, keys, queries, n, sink, eval_len, ratio, variant):
    mid_begin, mid_end = sink, n - eval_len
    n_mid = mid_end - mid_begin
    budget = llround(ratio * n_mid)
    window, threshold = buzz_params(budget)
    sink_size = max(K_SINK, sink)
    cls = ns["BuzzKVCacheNoMax" if variant == "no_local_max" else "BuzzKVCacheWithAccumulation"]
    with contextlib.redirect_stdout(io.StringIO()):
        cache = cls(sink_size=sink_size, window_size=window, stride_size=STRIDE,
                    sample_threshold=threshold, k_seq_dim=2, v_seq_dim=2)
    probe = GapProbe(cls) if variant != "no_local_max" else None
    d = keys.shape[1]
    past = None
    evictions = 0
    try:
        for t in range(mid_end):
            tok = torch.tensor([[[[float(t)]]]], dtype=torch.float64)
            if past is None:
                past = [tok, tok.clone()]
            else:
                past = [torch.cat([past[0], tok], dim=2), torch.cat([past[1], tok.clone()], dim=2)]
            idx = past[0][0, 0, :, 0].long().numpy()
            logits = queries[:, t, :] @ keys[idx].T / math.sqrt(d)  # [group, cache]
            if variant == "logn":
                logits = logits * (math.log(len(idx)) / math.log(512))
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            attn = torch.from_numpy(p.sum(axis=0)).view(1, 1, 1, -1)
            before = past[0].shape[2]
            past = cache(past, attn)
            evictions += past[0].shape[2] < before
        streamed = [int(x) for x in past[0][0, 0, :, 0].tolist() if x >= mid_begin]

        # KVScope's end of the prefix: their eviction, repeated while the middle does not fit.
        def middle(pkv):
            return [int(x) for x in pkv[0][0, 0, :, 0].tolist() if x >= mid_begin]

        def fresh_count(pkv):
            other = pkv[0].shape[2] - sink_size - window
            return max(0, other - cache.cur_sample_size)

        small_stride = (STRIDE + 1) // 2
        cache.sample_threshold = -1
        if hasattr(cache, "_update_hh_score"):
            cache._update_hh_score = lambda _scores: None
        fit_evictions = 0
        while len(middle(past)) > budget and (
                fresh_count(past) > 0 or (cache.cur_sample_size > 1 and small_stride > 1)):
            past = cache(past, None)
            fit_evictions += 1
        kept = middle(past)
        if len(kept) > budget:  # KVScope would cut the window; its defaults never get here
            sys.exit(f"buzz_golden.py: {len(kept)} tokens left for m = {budget} (window {window})")
        topped = budget - len(kept)
        dropped = sorted(set(range(mid_begin, mid_end)) - set(kept), reverse=True)
        kept = sorted(kept + dropped[:topped])
    finally:
        if probe:
            probe.restore(cls)
    return {
        "ratio": ratio, "variant": variant, "budget": budget, "window": window,
        "threshold": threshold, "evictions": evictions, "fit_evictions": fit_evictions,
        "topped_up": topped, "min_gap": (probe.min_gap if probe and probe.min_gap < math.inf
                                         else None),
        "streamed": len(streamed), "mid_begin": mid_begin, "mid_end": mid_end,
        "kept": mask_hex(kept, mid_begin, mid_end),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="git dir of github.com/JunqiZhao888/buzz-llm")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", help="default: tests/data/buzz_authors.json of this repository")
    ap.add_argument("--ratios", default="0.5,0.25,0.125")
    ap.add_argument("--variants", default="default,logn,no_local_max")
    ap.add_argument("captures", nargs="*")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    captures = args.captures or sorted(glob.glob(os.path.join(root, "sample_data", "*.safetensors")))
    args.out = args.out or os.path.join(root, "tests", "data", "buzz_authors.json")
    commit = subprocess.run(["git", "--git-dir", args.repo, "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    ns = load_authors_classes(args.repo, commit)
    ratios = [float(r) for r in args.ratios.split(",")]
    variants = args.variants.split(",")
    torch.set_default_dtype(torch.float64)
    cases = []
    for path in captures:
        meta, tensors = read_safetensors(path)
        layers, kv_heads = int(meta["num_layers"]), int(meta["kv_heads"])
        group = int(meta["q_heads"]) // kv_heads
        n = tensors["layers.0.key"].shape[1]
        sink, eval_len = min(256, n // 32), max(1, min(256, n // 8))
        for layer in range(layers):
            keys_all = tensors[f"layers.{layer}.key"]
            queries_all = tensors[f"layers.{layer}.query"]
            for head in range(kv_heads):
                keys = keys_all[head]
                queries = queries_all[head * group:(head + 1) * group]
                for variant in variants:
                    for ratio in ratios:
                        c = run_case(ns, keys, queries, n, sink, eval_len, ratio, variant)
                        cases.append({"capture": os.path.basename(path), "layer": layer,
                                      "kv_head": head, **c})
        print(f"{os.path.basename(path)}: {layers} layers x {kv_heads} kv heads", file=sys.stderr)
    gaps = [c["min_gap"] for c in cases if c["min_gap"] is not None]
    out = {
        "source": "github.com/JunqiZhao888/buzz-llm",
        "commit": commit,
        "classes": {"default": "BuzzKVCacheWithAccumulation", "logn": "BuzzKVCacheWithAccumulation",
                    "no_local_max": "BuzzKVCacheNoMax"},
        "generator": "tools/buzz_golden.py",
        "stride": STRIDE, "sink_k": K_SINK,
        "min_gap": min(gaps) if gaps else None,
        "cases": cases,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"{len(cases)} cases, smallest local-max gap {out['min_gap']:.3g}, commit {commit} -> "
          f"{args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The peer of `kvscope-cli embed` for bench/peers.sh: scikit-learn's t-SNE (Barnes-Hut, angle 0.5,
perplexity 30, PCA init, learning rate "auto", 1000 iterations: the settings KVScope's t-SNE
follows) on the keys of one kv head of a capture, written as CSV token,x,y like `embed --out`.

With --trust CSV...: instead, the trustworthiness (k = 10, sklearn.manifold.trustworthiness) of
each given embedding of those keys, on one fixed random subsample of --subsample points (the
exact measure is O(n^2) in memory; the same subsample is used for every embedding, so they are
comparable with each other).
"""
import argparse
import csv
import json
import struct
import sys
import time

import numpy as np


def read_keys(path, layer, head):
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        name = f"layers.{layer}.key"
        if name not in header:
            sys.exit(f"peer_tsne: {path} has no tensor '{name}'")
        meta = header[name]
        if meta["dtype"] != "F32":
            sys.exit(f"peer_tsne: '{name}' is {meta['dtype']}; synthesise with --dtype f32")
        begin, end = meta["data_offsets"]
        f.seek(8 + header_len + begin)
        data = np.frombuffer(f.read(end - begin), dtype=np.float32).reshape(meta["shape"])
    return np.ascontiguousarray(data[head])


def read_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return np.array([[float(r["x"]), float(r["y"])] for r in rows], dtype=np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("capture")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--trust", nargs="+")
    ap.add_argument("--subsample", type=int, default=5000)
    a = ap.parse_args()
    x = read_keys(a.capture, a.layer, a.head)
    if a.trust:
        from sklearn.manifold import trustworthiness

        idx = np.sort(np.random.default_rng(0).choice(len(x), min(a.subsample, len(x)), replace=False))
        for path in a.trust:
            y = read_csv(path)
            if len(y) != len(x):
                sys.exit(f"peer_tsne: {path} has {len(y)} rows, the keys {len(x)}")
            t = trustworthiness(x[idx], y[idx], n_neighbors=10)
            print(f"      {path}: {t:.4f}")
        return
    from sklearn.manifold import TSNE

    t0 = time.process_time()
    tsne = TSNE(n_components=2, perplexity=30, init="pca", learning_rate="auto", n_iter=1000,
                method="barnes_hut", angle=0.5, n_jobs=a.threads, random_state=0)
    y = tsne.fit_transform(x)
    print(f"sklearn TSNE: KL {tsne.kl_divergence_:.4f}, {time.process_time() - t0:.2f} s CPU")
    if a.out:
        with open(a.out, "w") as f:
            f.write("token,x,y\n")
            for i, (u, v) in enumerate(y):
                f.write(f"{i},{u:.7g},{v:.7g}\n")


if __name__ == "__main__":
    main()

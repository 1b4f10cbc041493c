#!/usr/bin/env python3
"""Golden kept sets from kvpress's own presses (docs/methods.md, "kvpress presses").

The press files are read at run time from a git directory of NVIDIA/kvpress (never copied into
this repository); the little of `transformers` they import is stubbed here. Each press's
`score()` runs in float64 on KVScope captures under the mapping of docs/methods.md: the press's
prefill is the prefix [0, n-E) of the capture, its keys and values are the captured ones, its
"hidden states" are the captured queries of [0, n-E) rotated back to before RoPE (q_proj is the
identity), and RoPE is the capture's (rope_theta / rope_layout; interleaved captures are permuted
to the rotate-half channel order, which leaves every dot product unchanged). The scores of the
middle [s, n-E) are ranked (ties to the lower position) and the top m kept (stored as a bit mask
over the middle, see bitmask()); when the m-th and (m+1)-th scores are equal to 1e-9 (relative),
the positions holding that score are recorded as ambiguous (a mask too).

    /usr/bin/python3 tools/kvpress_golden.py --kvpress /work/.mirror/NVIDIA+kvpress/repo \\
        --synth synth_gqa.safetensors --out tests/data/kvpress_golden.json

`--synth` is `kvscope-cli synth --shape llama3-8b --tokens 1024 --layers 1 --dtype f32 --seed 0
--out FILE` (the C++ test regenerates it in memory). Needs torch and numpy.
"""
import argparse
import dataclasses
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import types

import numpy as np
import torch

CAPTURES = ["sample_data/stories260K_lily.safetensors", "sample_data/stories260K_dragon.safetensors",
            "sample_data/kjv3M_beginning.safetensors"]
RATIOS = [0.5, 0.25, 0.125]
SYNTH_HEADS = 2  # kv heads of the synthetic capture recorded (of 8), to keep the file small


def read_safetensors(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "F32":
            x = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "F16":
            x = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit("%s: dtype %s not handled" % (path, t["dtype"]))
        tensors[name] = x.reshape(t["shape"]).astype(np.float64)
    return meta, tensors


def rope_of(meta):
    """The capture's RoPE, by engine/io/capture.cpp's rule (read_rope)."""
    if "rope_theta" in meta or "rope_layout" in meta:
        return float(meta["rope_theta"]), meta["rope_layout"]
    if "llama2c_config" in meta:
        return 10000.0, "interleaved"
    if "synthetic_shape" in meta:
        return 500000.0, "half"
    raise SystemExit("capture without RoPE metadata")


def window(n):
    s, e = min(256, n // 32), min(256, n // 8)
    return s, e


def budget(ratio, n_mid):
    return int(math.floor(ratio * n_mid + 0.5))  # EvalWindow::make: round(keep_ratio * n_mid)


# ---- the stubbed transformers modules


def repeat_kv(hidden_states, n_rep):
    b, h, s, d = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    return hidden_states[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def install_transformers_stub():
    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class Placeholder:  # classes the presses name in isinstance checks or type hints only
        pass

    names = ["Gemma3ForConditionalGeneration", "LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM",
             "PreTrainedModel", "QuantizedCache", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Cache"]
    module("transformers", **{n: type(n, (Placeholder,), {}) for n in names})
    module("transformers.models")
    module("transformers.models.llama")
    module("transformers.models.llama.modeling_llama", repeat_kv=repeat_kv, rotate_half=rotate_half)
    for sub, cls in [("gemma3", "Gemma3Attention"), ("phi3", "Phi3Attention"), ("qwen3", "Qwen3Attention")]:
        module("transformers.models." + sub)
        module("transformers.models.%s.modeling_%s" % (sub, sub), **{cls: type(cls, (Placeholder,), {})})


def extract_kvpress(git_dir, commit, dest):
    """kvpress/utils.py and the press files, from the git directory, into dest/kvpress."""
    files = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "--name-only", commit, "kvpress/presses/"],
                           check=True, capture_output=True, text=True).stdout.split()
    os.makedirs(os.path.join(dest, "kvpress", "presses"))
    open(os.path.join(dest, "kvpress", "__init__.py"), "w").close()
    open(os.path.join(dest, "kvpress", "presses", "__init__.py"), "w").close()
    for path in ["kvpress/utils.py"] + [f for f in files if f.endswith(".py") and not f.endswith("__init__.py")]:
        text = subprocess.run(["git", "--git-dir", git_dir, "show", commit + ":" + path], check=True,
                              capture_output=True, text=True).stdout
        # Everything in float64: the presses' explicit float32 casts become float64.
        text = text.replace("torch.float32", "torch.float64")
        with open(os.path.join(dest, path), "w") as f:
            f.write(text)


# ---- a stand-in for the attention module the presses read


class RotaryEmbedding:
    def __init__(self, theta, d):
        self.inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)

    def __call__(self, x, position_ids):
        freqs = position_ids.to(torch.float64)[..., None] * self.inv_freq  # [b, p, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def make_module(q_heads, kv_heads, d, theta):
    m = torch.nn.Module()
    m.config = types.SimpleNamespace(num_attention_heads=q_heads, num_key_value_heads=kv_heads, head_dim=d,
                                     num_hidden_layers=1, _attn_implementation="sdpa")
    m.head_dim = d
    m.num_key_value_groups = q_heads // kv_heads
    m.q_proj = lambda h: h[..., : q_heads * d]
    m.k_proj = lambda h: h[..., q_heads * d:]
    m.rotary_emb = RotaryEmbedding(theta, d)
    m.layer_idx = 0
    return m


def to_half_layout(x, layout):
    """Channels of an interleaved capture in rotate-half order: (2i, 2i+1) -> (i, i + d/2)."""
    if layout == "half":
        return x
    d = x.shape[-1]
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    return x[..., perm]


def unrotate(x, theta):
    """x [heads, n, d] in half layout, token t at position t: R(t)^T x."""
    n, d = x.shape[1], x.shape[2]
    freq = theta ** (-2.0 * np.arange(d // 2) / d)
    ang = np.arange(n)[:, None] * freq[None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * c + b * s, -a * s + b * c], axis=-1)


def kept_sets(scores_mid, m):
    """Top m of scores_mid (ties to the lower position) and the positions tied with the boundary."""
    order = sorted(range(len(scores_mid)), key=lambda i: (-scores_mid[i], i))
    kept = sorted(order[:m])
    ambiguous = []
    if 0 < m <= len(order):
        lo = scores_mid[order[m - 1]]
        hi = scores_mid[order[m]] if m < len(order) else None
        for i, v in enumerate(scores_mid):
            for bound in [lo, hi]:
                if bound is not None and abs(v - bound) <= 1e-9 * max(abs(bound), 1e-300):
                    ambiguous.append(i)
                    break
        # Only a boundary tie between a kept and a dropped score is ambiguous.
        if hi is None or abs(lo - hi) > 1e-9 * max(abs(lo), abs(hi), 1e-300):
            ambiguous = []
    return kept, ambiguous


MASK_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"


def bitmask(positions, count):
    """Middle positions (token - s) as a bit mask, 6 bits a character: character k holds positions
    6k..6k+5 (bit j: 6k+j), written as MASK_DIGITS[value]; "" for no position."""
    if not positions:
        return ""
    digits = [0] * ((count + 5) // 6)
    for i in positions:
        digits[i // 6] |= 1 << (i % 6)
    return "".join(MASK_DIGITS[v] for v in digits)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpress", required=True, help="git directory of NVIDIA/kvpress")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--synth", help="synthetic GQA capture (head dim 128), see the docstring")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    commit = subprocess.run(["git", "--git-dir", args.kvpress, "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    torch.set_default_dtype(torch.float64)
    install_transformers_stub()
    tmp = tempfile.mkdtemp(prefix="kvpress_golden_")
    extract_kvpress(args.kvpress, commit, tmp)
    sys.path.insert(0, tmp)
    P = lambda mod: importlib.import_module("kvpress.presses." + mod)  # noqa: E731

    # name -> (press factory, KVScope method and parameters it is compared with)
    presses = {
        "keydiff": (lambda: P("keydiff_press").KeyDiffPress(), "keydiff", {}),
        "lagkv": (lambda: P("lagkv_press").LagKVPress(), "lagkv", {}),
        "cur": (lambda: P("cur_press").CURPress(), "cur", {}),
        "expected-attention": (lambda: P("expected_attention_press").ExpectedAttentionPress(),
                               "expected-attention", {}),
        "knorm": (lambda: P("knorm_press").KnormPress(), "knorm", {}),
        # KVScope's snapkv and tova rules differ from the presses on purpose (docs/methods.md):
        # their defaults are compared, not asserted; their kvpress variants must match.
        "snapkv": (lambda: P("snapkv_press").SnapKVPress(), "snapkv", {"window": 64}),
        "tova": (lambda: P("tova_press").TOVAPress(), "tova", {}),
    }
    variants = {  # press name -> (case name, KVScope parameters)
        "snapkv": ("snapkv variant=kvpress", {"window": 64, "variant": 1}),
        "tova": ("tova variant=kvpress", {"variant": 1}),
    }
    ScorerPress = P("scorer_press").ScorerPress

    class Fixed(ScorerPress):  # a press whose scores are given (AdaKV's inner press)
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return self.fixed.clone()

    captures = [c for c in CAPTURES] + ([args.synth] if args.synth else [])
    cases = []
    for path in captures:
        meta, t = read_safetensors(path)
        L, H, G, d = (int(meta[k]) for k in ["num_layers", "kv_heads", "q_heads", "head_dim"])
        theta, layout = rope_of(meta)
        synthetic = "synthetic_shape" in meta
        # The synthetic capture is recorded by what it is, not by its file name (the C++ test
        # regenerates it in memory), so the output does not depend on where it was written.
        capture_name = "synthetic" if synthetic else os.path.basename(path)
        n = t["layers.0.key"].shape[1]
        s, e = window(n)
        ctx = n - e
        module = make_module(G, H, d, theta)
        pos = torch.arange(ctx)[None]
        cos, sin = module.rotary_emb(None, pos)
        for layer in range(L):
            keys = to_half_layout(t["layers.%d.key" % layer][:, :ctx], layout)
            values = t["layers.%d.value" % layer][:, :ctx]
            q_post = to_half_layout(t["layers.%d.query" % layer][:, :ctx], layout)
            q_pre = unrotate(q_post, theta)
            k_pre = unrotate(keys, theta)
            # The hidden states: pre-RoPE queries, then pre-RoPE keys; q_proj and k_proj pick them.
            hidden = torch.cat([torch.tensor(q_pre).transpose(0, 1).reshape(1, ctx, G * d),
                                torch.tensor(k_pre).transpose(0, 1).reshape(1, ctx, H * d)], dim=-1)
            K, V = torch.tensor(keys)[None], torch.tensor(values)[None]
            kwargs = {"position_embeddings": (cos, sin)}
            layer_scores = {}
            for name, (factory, method, params) in presses.items():
                press = factory()
                with torch.no_grad():
                    scores = press.score(module, hidden, K.clone(), V.clone(), None, kwargs)
                layer_scores[name] = scores
                scores = scores[0].numpy()
                for h in range(min(H, SYNTH_HEADS) if synthetic else H):
                    mid = scores[h, s:ctx].tolist()
                    case = {"capture": capture_name, "press": name, "method": method, "params": params,
                            "layer": layer, "kv_head": h, "n": n, "sink": s, "eval": e, "ratios": []}
                    if name in variants:  # the same kept sets, checked again with these parameters
                        case["variant"] = {"press": variants[name][0], "params": variants[name][1]}
                    for ratio in RATIOS:
                        m = budget(ratio, ctx - s)
                        kept, amb = kept_sets(mid, m)
                        case["ratios"].append({"ratio": ratio, "budget": m, "kept": bitmask(kept, ctx - s),
                                               "ambiguous": bitmask(amb, ctx - s)})
                    cases.append(case)
            # AdaKV (adakv_press.py) around a port that matches its press, on the middle: the
            # press's compress() sees the middle's scores of every kv head with the compression
            # ratio whose int(n_mid * (1 - ratio)) is m, and masks what it drops.
            for inner in ["expected-attention", "keydiff"]:
                mid_scores = layer_scores[inner][:, :, s:ctx]
                case_heads = range(min(H, SYNTH_HEADS) if synthetic else H)
                cases_here = [{"capture": capture_name, "press": "adakv+" + inner,
                               "method": "adakv(%s)" % inner, "params": {}, "layer": layer, "kv_head": h,
                               "n": n, "sink": s, "eval": e, "ratios": []} for h in case_heads]
                for ratio in RATIOS:
                    m = budget(ratio, ctx - s)
                    fixed = Fixed(compression_ratio=1 - (m + 0.5) / (ctx - s))
                    fixed.fixed = mid_scores
                    ada = P("adakv_press").AdaKVPress(press=fixed)
                    ada.compress(module, hidden, K[:, :, s:ctx], V[:, :, s:ctx], None, kwargs)
                    _, heads_masked, seq_masked = module.masked_key_indices
                    for case, h in zip(cases_here, case_heads):
                        dropped = set(seq_masked[heads_masked == h].tolist())
                        kept = [i for i in range(ctx - s) if i not in dropped]
                        case["ratios"].append({"ratio": ratio, "budget": m, "kept": bitmask(kept, ctx - s),
                                               "ambiguous": ""})
                cases.extend(cases_here)
            # ChunkKV (chunkkv_press.py) around a port that matches its press. Its chunks start where
            # its input starts, so the check uses s = 20 sinks (a multiple of chunk_length: the
            # chunks of the middle are then aligned at position 0 as KVScope's) and gives the press
            # the middle's scores; its kept count (whole chunks) is the budget KVScope is given.
            s20 = 20
            for inner in ["expected-attention", "keydiff"]:
                mid_scores = layer_scores[inner][:, :, s20:ctx]
                case_heads = range(min(H, SYNTH_HEADS) if synthetic else H)
                cases_here = [{"capture": capture_name, "press": "chunkkv+" + inner,
                               "method": "chunkkv(%s)" % inner, "params": {}, "layer": layer, "kv_head": h,
                               "n": n, "sink": s20, "eval": e, "budget_given": True, "ratios": []}
                              for h in case_heads]
                for ratio in RATIOS:
                    fixed = Fixed(compression_ratio=1 - ratio)
                    fixed.fixed = mid_scores
                    chunk = P("chunkkv_press").ChunkKVPress(press=fixed)
                    idx = torch.arange(ctx - s20, dtype=torch.float64).view(1, 1, -1, 1).expand(1, H, -1, d)
                    kept_idx, _ = chunk.compress(module, hidden, idx.clone(), idx.clone(), None, kwargs)
                    for case, h in zip(cases_here, case_heads):
                        kept = sorted(int(v) for v in kept_idx[0, h, :, 0].tolist())
                        case["ratios"].append({"ratio": ratio, "budget": len(kept),
                                               "kept": bitmask(kept, ctx - s20), "ambiguous": ""})
                cases.extend(cases_here)
            # CriticalKV (criticalkv_press.py) around expected-attention, with W_O = I (KVScope's
            # projection = identity) and, where the capture carries it (layers.L.wo,
            # docs/capture-format.md), with the model's W_O (projection = wo): the press is given
            # the middle's scores and values, and the ratio whose int((1 - ratio) n_mid / 2) is m / 2.
            projections = [("W_O=I", 1, torch.eye(G * d, dtype=torch.float64))]
            wo_name = "layers.%d.wo" % layer
            if wo_name in t:  # [q_heads, d_v, hidden]: o_proj.weight is its [hidden, q_heads * d_v]
                wo = torch.tensor(t[wo_name])
                projections.append(("W_O", 0, wo.reshape(G * d, wo.shape[2]).transpose(0, 1)))
            for (label, projection, weight), inner in [(p, i) for p in projections for i in ["expected-attention"]]:
                module.config.hidden_size = weight.shape[0]
                module.o_proj = types.SimpleNamespace(weight=weight)
                mid_scores = layer_scores[inner][:, :, s:ctx]
                case_heads = range(min(H, SYNTH_HEADS) if synthetic else H)
                cases_here = [{"capture": capture_name, "press": "criticalkv+" + inner + " " + label,
                               "method": "criticalkv(%s)" % inner, "params": {"projection": projection},
                               "layer": layer, "kv_head": h, "n": n, "sink": s, "eval": e, "ratios": []}
                              for h in case_heads]
                for ratio in RATIOS:
                    m = budget(ratio, ctx - s)
                    fixed = Fixed(compression_ratio=1 - (m + 0.5) / (ctx - s))
                    fixed.fixed = mid_scores
                    critical = P("criticalkv_press").CriticalKVPress(press=fixed)
                    with torch.no_grad():
                        scores = critical.score(module, hidden, K[:, :, s:ctx], V[:, :, s:ctx], None, kwargs)
                    for case, h in zip(cases_here, case_heads):
                        kept, amb = kept_sets(scores[0, h].tolist(), m)
                        case["ratios"].append({"ratio": ratio, "budget": m, "kept": bitmask(kept, ctx - s),
                                               "ambiguous": bitmask(amb, ctx - s)})
                cases.extend(cases_here)
            # Compactor (compactor_press.py) at each ratio (its blending is the compression ratio
            # 1 - (s + m) / (n - E)), with sketch_dimension = d and torch.randn made sqrt(d) I, so
            # the sketch is the identity (KVScope's sketch = exact; the Gaussian draw is torch's).
            case_heads = range(min(H, SYNTH_HEADS) if synthetic else H)
            cases_here = [{"capture": capture_name, "press": "compactor", "method": "compactor",
                           "params": {"sketch": 1}, "layer": layer, "kv_head": h, "n": n, "sink": s,
                           "eval": e, "ratios": []} for h in case_heads]
            randn = torch.randn
            torch.randn = lambda *shape, **kw: (math.sqrt(d) * torch.eye(d, dtype=torch.float64)).expand(*shape)
            try:
                for ratio in RATIOS:
                    m = budget(ratio, ctx - s)
                    press = P("compactor_press").CompactorPress(compression_ratio=1 - (s + m) / ctx,
                                                                sketch_dimension=d)
                    with torch.no_grad():
                        scores = press.score(module, hidden, K.clone(), V.clone(), None, kwargs)[0].numpy()
                    for case, h in zip(cases_here, case_heads):
                        kept, amb = kept_sets(scores[h, s:ctx].tolist(), m)
                        case["ratios"].append({"ratio": ratio, "budget": m, "kept": bitmask(kept, ctx - s),
                                               "ambiguous": bitmask(amb, ctx - s)})
            finally:
                torch.randn = randn
            cases.extend(cases_here)
    out = {"kvpress_commit": commit, "generator": "tools/kvpress_golden.py",
           "synthetic": {"shape": "llama3-8b", "tokens": 1024, "layers": 1, "seed": 0, "kv_heads": SYNTH_HEADS},
           "cases": cases}
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("%s: %d cases from kvpress %s" % (args.out, len(cases), commit))


if __name__ == "__main__":
    main()

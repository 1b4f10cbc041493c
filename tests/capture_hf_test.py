#!/usr/bin/env python3
"""Tests for tools/capture_hf.py (docs/capturing.md).

  capture_hf_test.py --cli PATH --writer-only
      The dependency-free safetensors writer: a small capture in F32/F16/BF16 is read back by a
      reader written here and opened by `kvscope-cli info`; a truncated copy is refused.
  capture_hf_test.py --cli PATH
      The model path: a tiny randomly initialised Llama and a Qwen2 (biased q/k/v projections),
      each hidden 64, 2 layers, 4 heads, 2 kv heads (nothing downloaded), are captured by
      running the tool as a user would, on the CPU and, where torch sees one, on the GPU; and
      softmax(q k^T / sqrt(d)) v over causal positions, computed from the captured tensors
      with the GQA mapping, must reproduce the model's own attention outputs (the input of
      o_proj); the file then opens and evaluates in kvscope-cli. Exits 77 (CTest SKIP_RETURN_CODE) with a message when torch or transformers is
      missing.
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "capture_hf.py")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import capture_hf  # noqa: E402

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL: " + message)


def read_safetensors(path):
    """(header dict, metadata dict, {name: (shape, flat float list)}), checking the layout."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_len].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    body = data[8 + header_len:]
    tensors = {}
    end = 0
    for name, entry in header.items():
        begin, stop = entry["data_offsets"]
        count = math.prod(entry["shape"])
        raw = body[begin:stop]
        if entry["dtype"] == "F32":
            values = list(struct.unpack("<%df" % count, raw))
        elif entry["dtype"] == "F16":
            values = list(struct.unpack("<%de" % count, raw))
        elif entry["dtype"] == "BF16":
            values = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in struct.unpack("<%dH" % count, raw)]
        else:
            raise AssertionError("unknown dtype " + entry["dtype"])
        tensors[name] = (entry["shape"], values)
        end = max(end, stop)
    check(end == len(body), "%s: data section is %d bytes, tensors end at %d" % (path, len(body), end))
    check((8 + header_len) % 8 == 0, "%s: header not padded to 8 bytes" % path)
    return header, metadata, tensors


def run_cli(cli, *args):
    result = subprocess.run([cli, *args], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------


def writer_test(cli, workdir):
    layers, q_heads, kv_heads, n, d = 2, 4, 2, 6, 4
    # Deterministic values with a spread of magnitudes (bf16/f16 rounding is exercised).
    def values(layer, kind, heads):
        return [math.sin(1.7 * i + 0.3 * layer + kind) * (1 + (i % 5)) for i in range(heads * n * d)]

    tokens = ["<s>", "Once", " upon", " a", " time", " caf\u00e9"]
    for flag, (dtype, _) in sorted(capture_hf.DTYPES.items()):
        expected = {}
        tensors = []
        for L in range(layers):
            for kind, name, heads in ((0, "key", kv_heads), (1, "query", q_heads), (2, "value", kv_heads)):
                vals = values(L, kind, heads)
                tname = "layers.%d.%s" % (L, name)
                expected[tname] = vals
                tensors.append(capture_hf.ListTensor(tname, [heads, n, d], vals, dtype))
        metadata = capture_hf.capture_metadata(
            model="writer-test", num_layers=layers, q_heads=q_heads, kv_heads=kv_heads, head_dim=d,
            tokens=tokens, prompt="Once upon a time caf\u00e9", source="tests/capture_hf_test.py (writer)")
        path = os.path.join(workdir, "writer_%s.safetensors" % flag)
        capture_hf.write_safetensors(path, tensors, metadata)

        _, meta, read = read_safetensors(path)
        check(meta.get("format") == "kvscope/1", "%s: format metadata" % flag)
        check(meta.get("rope") == "applied", "%s: rope metadata" % flag)
        check(json.loads(meta.get("tokens", "[]")) == tokens, "%s: tokens round trip" % flag)
        check(sorted(read) == sorted(expected), "%s: tensor names %s" % (flag, sorted(read)))
        tolerance = {"F32": 1e-6, "F16": 1e-3, "BF16": 8e-3}[dtype]
        for tname, vals in expected.items():
            shape, got = read[tname]
            worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, vals))
            check(worst <= tolerance, "%s %s: worst relative error %.2g > %.2g" % (flag, tname, worst, tolerance))

        rc, out = run_cli(cli, "info", path)
        check(rc == 0, "kvscope-cli info %s failed (%d): %s" % (path, rc, out[-500:]))
        check("writer-test" in out, "kvscope-cli info %s does not show the model name: %s" % (path, out[-500:]))

    # A truncated copy must be refused with an error naming the file, not crash.
    with open(os.path.join(workdir, "writer_f32.safetensors"), "rb") as f:
        data = f.read()
    broken = os.path.join(workdir, "truncated.safetensors")
    with open(broken, "wb") as f:
        f.write(data[: len(data) - 40])
    rc, out = run_cli(cli, "info", broken)
    check(rc == 1 and "truncated.safetensors" in out, "truncated capture: rc %d, %s" % (rc, out[-500:]))

    # bf16 rounding is round-to-nearest-even on the upper 16 bits.
    check(capture_hf.float_to_bf16_bits(1.0) == 0x3F80, "bf16(1.0)")
    check(capture_hf.float_to_bf16_bits(1.0 + 2 ** -8) == 0x3F80, "bf16 ties to even (down)")
    check(capture_hf.float_to_bf16_bits(1.0 + 3 * 2 ** -8) == 0x3F82, "bf16 ties to even (up)")


# ---------------------------------------------------------------------------------------------


def model_test(cli, workdir):
    try:
        import torch
        import transformers
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                                  Qwen2ForCausalLM)
    except ImportError as e:
        print("SKIP: torch/transformers not available (%s); the model capture test needs them" % e)
        return SKIP

    prompt = "once upon a time there was a little dragon who liked to fly over the hills and the sea " * 3
    words = ["<unk>", "<s>", "</s>"] + sorted(set(prompt.split()))
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")

    # Two architectures built like Llama: Qwen2 adds biases to q/k/v (so a capture that skipped
    # them would not reproduce the outputs). Randomly initialised, nothing downloaded.
    common = dict(vocab_size=len(words) + 5, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    archs = [("llama", LlamaConfig(**common), LlamaForCausalLM),
             ("qwen2", Qwen2Config(**common), Qwen2ForCausalLM)]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for arch, config, model_class in archs:
        torch.manual_seed(0)
        model = model_class(config).eval()
        if arch == "qwen2":
            # Random init leaves the biases at zero; make them matter.
            with torch.no_grad():
                for layer in model.model.layers:
                    for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                        check(proj.bias is not None, "qwen2 %s has a bias" % proj)
                        proj.bias.normal_(0.0, 0.5)
        model_dir = os.path.join(workdir, "tiny-" + arch)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        for device in devices:
            status = check_capture(cli, workdir, arch, device, model, model_dir, tokenizer, prompt)
            if status:
                return status
    print("model test: transformers %s, torch %s, devices %s" % (transformers.__version__, torch.__version__,
                                                                  ",".join(devices)))
    return 0


def check_capture(cli, workdir, arch, device, model, model_dir, tokenizer, prompt):
    """Captures `model_dir` with the tool on `device` and checks the file against `model`'s own
    attention outputs (computed on the CPU in float32)."""
    import torch

    out = os.path.join(workdir, "tiny-%s-%s.safetensors" % (arch, device))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    result = subprocess.run([sys.executable, TOOL, "--model", model_dir, "--prompt", prompt, "--out", out,
                             "--device", device], capture_output=True, text=True, env=env)
    check(result.returncode == 0, "%s/%s: capture_hf.py failed: %s" % (arch, device, result.stderr[-2000:]))
    if result.returncode != 0:
        return 1

    # The model's own attention outputs (the input of o_proj, per layer) on the token ids the tool
    # used: it loads the tokenizer with AutoTokenizer, which for some model types rebuilds it
    # (transformers 5 gives Qwen2 its own pre-tokenizer), so tokenise the same way here.
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(model_dir)(prompt, return_tensors="pt", add_special_tokens=True)["input_ids"]
    n = ids.shape[1]
    check(n >= 8, "%s: the prompt gives %d tokens, too few for the checks" % (arch, n))
    attn_out, proj_out = {}, {}
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        (lambda L: lambda module, args: attn_out.__setitem__(L, args[0][0].detach().double()))(L))
        for L, layer in enumerate(model.model.layers)]
    handles += [layer.self_attn.o_proj.register_forward_hook(
        (lambda L: lambda module, args, output: proj_out.__setitem__(L, output[0].detach().double()))(L))
        for L, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for h in handles:
        h.remove()

    _, meta, tensors = read_safetensors(out)
    shapes = {k: meta.get(k) for k in ("num_layers", "q_heads", "kv_heads", "head_dim")}
    check(shapes == {"num_layers": "2", "q_heads": "4", "kv_heads": "2", "head_dim": "16"},
          "%s/%s: metadata shapes: %s" % (arch, device, shapes))
    check(len(json.loads(meta["tokens"])) == n, "%s/%s: one token string per position" % (arch, device))
    d, group = 16, 2
    worst = 0.0
    wrong_mapping = 0.0
    worst_wo, wrong_wo = 0.0, 0.0
    for L in range(2):
        def t(name, heads):
            shape, vals = tensors["layers.%d.%s" % (L, name)]
            check(shape == [heads, n, d], "%s: layers.%d.%s shape %s" % (arch, L, name, shape))
            return torch.tensor(vals, dtype=torch.float64).reshape(heads, n, d)

        q, k, v = t("query", 4), t("key", 2), t("value", 2)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        for h in range(4):
            for kv, is_right in ((h // group, True), ((h // group + 1) % 2, False)):
                scores = (q[h] @ k[kv].T) / math.sqrt(d)
                weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
                z = weights @ v[kv]
                ref = attn_out[L][:, h * d:(h + 1) * d]
                err = ((z - ref).abs() / ref.abs().clamp(min=1.0)).max().item()
                if is_right:
                    worst = max(worst, err)
                else:
                    wrong_mapping = max(wrong_mapping, err)
        # The output projection (layers.L.wo, [q_heads, d, hidden]): the heads' attention outputs
        # through it give o_proj's output; the heads in another order do not.
        shape, vals = tensors["layers.%d.wo" % L]
        hidden = model.config.hidden_size
        check(shape == [4, d, hidden], "%s: layers.%d.wo shape %s" % (arch, L, shape))
        wo = torch.tensor(vals, dtype=torch.float64).reshape(4, d, hidden)
        heads = attn_out[L].reshape(n, 4, d)
        through = sum(heads[:, h] @ wo[h] for h in range(4))
        swapped = sum(heads[:, h] @ wo[(h + 1) % 4] for h in range(4))
        scale = proj_out[L].abs().clamp(min=1.0)
        worst_wo = max(worst_wo, ((through - proj_out[L]).abs() / scale).max().item())
        wrong_wo = max(wrong_wo, ((swapped - proj_out[L]).abs() / scale).max().item())
    # On a GPU, the capture's float32 products may use TF32 or another summation order.
    tolerance = 1e-4 if device == "cpu" else 2e-3
    check(worst_wo < 1e-5, "%s/%s: layers.L.wo gives o_proj's output: worst relative error %.3g"
          % (arch, device, worst_wo))
    check(wrong_wo > 1e-3, "%s/%s: the W_O check has teeth: heads in another order should not match (%.3g)"
          % (arch, device, wrong_wo))
    check(worst < tolerance, "%s/%s: captured q/k/v reproduce attention outputs: worst relative error %.3g"
          % (arch, device, worst))
    check(wrong_mapping > 1e-3, "%s/%s: the check has teeth: the wrong GQA mapping should not match (%.3g)"
          % (arch, device, wrong_mapping))

    # Keys are stored after RoPE: at position > 0 they differ from the raw k_proj output.
    raw = {}
    handle = model.model.layers[0].self_attn.k_proj.register_forward_hook(
        lambda module, args, output: raw.__setitem__("k", output[0].detach().double()))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    k0 = torch.tensor(tensors["layers.0.key"][1], dtype=torch.float64).reshape(2, n, d)
    raw_k0 = raw["k"].reshape(n, 2, d).transpose(0, 1)
    atol = 1e-5 if device == "cpu" else 2e-3
    check(torch.allclose(k0[:, 0], raw_k0[:, 0], atol=atol), "%s/%s: position 0 is unrotated" % (arch, device))
    check(not torch.allclose(k0[:, 5], raw_k0[:, 5], atol=1e-3), "%s/%s: keys are stored after RoPE" % (arch, device))

    # The file opens in KVScope's engine and evaluates.
    rc, out_text = run_cli(cli, "info", out)
    check(rc == 0, "%s/%s: kvscope-cli info failed (%d): %s" % (arch, device, rc, out_text[-500:]))
    report = os.path.join(workdir, "eval-%s-%s.json" % (arch, device))
    rc, out_text = run_cli(cli, "eval", out, "--methods", "balancekv,uniform", "--ratios", "0.5", "--seeds", "2",
                           "--json", report)
    check(rc == 0, "%s/%s: kvscope-cli eval failed (%d): %s" % (arch, device, rc, out_text[-800:]))
    if rc == 0:
        with open(report) as f:
            text = f.read()
        check("balancekv" in text and "uniform" in text, "%s/%s: eval report names both methods" % (arch, device))
    print("model test %s on %s: worst relative error %.3g over 2 layers x 4 heads x %d positions"
          % (arch, device, worst, n))
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="path of kvscope-cli")
    parser.add_argument("--writer-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvscope_capture_hf_") as workdir:
        if args.writer_only:
            writer_test(args.cli, workdir)
            status = 0
        else:
            status = model_test(args.cli, workdir)
            if status == SKIP:
                return SKIP
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return status


if __name__ == "__main__":
    sys.exit(main())

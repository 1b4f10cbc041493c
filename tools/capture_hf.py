#!/usr/bin/env python3
"""Capture queries, keys (after RoPE) and values from a Hugging Face causal LM (docs/capturing.md).

Runs one prompt through a `transformers` causal LM and writes a KVScope capture in the
safetensors format of docs/capture-format.md:

    layers.{L}.query  [q_heads,  n, head_dim]   after RoPE
    layers.{L}.key    [kv_heads, n, head_dim]   after RoPE, as attention uses them
    layers.{L}.value  [kv_heads, n, head_dim]

with `__metadata__` format=kvscope/1, model, num_layers, q_heads, kv_heads, head_dim,
rope=applied, tokens (JSON list of token strings), prompt, source.

How it hooks the model: Llama, Qwen2, Mistral (and the many models built like them) call a
module-level `apply_rotary_pos_emb(q, k, cos, sin, ...)` inside each attention module's forward.
The function is looked up in the modeling module at call time, so replacing it there (for the
duration of the run) sees q and k exactly as attention receives them, whatever attention kernel
(eager, sdpa, flash) runs next. A pre-hook on each attention module tells the patched function
which layer is calling; a forward hook on `v_proj` records the values (RoPE does not touch
them). Models whose attention does not go through such a function are refused with a clear
message rather than captured wrongly.

The safetensors file is written by this script itself (struct + json), so neither the
`safetensors` package nor numpy is needed to write it; numpy, when present (transformers needs
it), only speeds up turning tensors into bytes.

Usage:
  tools/capture_hf.py --model NAME_OR_PATH (--prompt TEXT | --prompt-file F) --out X.safetensors
                      [--layers 0,1,...] [--dtype f32|f16|bf16] [--device cpu|cuda]
                      [--max-tokens N]
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys

FORMAT = "kvscope/1"
# Capture dtype flag -> (safetensors dtype name, bytes per element).
DTYPES = {"f32": ("F32", 4), "f16": ("F16", 2), "bf16": ("BF16", 2)}


class CaptureError(Exception):
    """Bad input or an unsupported model: the message names the flag/module and the problem."""


# ---------------------------------------------------------------------------------------------
# safetensors writing (no dependencies)


def float_to_bf16_bits(value):
    """Round a float to bfloat16 (round to nearest even), returning the 16 bits."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if math.isnan(value):
        return 0x7FC0
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + rounding) >> 16) & 0xFFFF


def floats_to_bytes(values, dtype):
    """Little-endian bytes of a flat list of Python floats in safetensors dtype F32/F16/BF16."""
    n = len(values)
    if dtype == "F32":
        return struct.pack("<%df" % n, *values)
    if dtype == "F16":
        return struct.pack("<%de" % n, *values)
    if dtype == "BF16":
        return struct.pack("<%dH" % n, *(float_to_bf16_bits(v) for v in values))
    raise CaptureError("unknown dtype %r" % dtype)


class ListTensor:
    """A tensor given as a flat list of floats (row-major) and its shape."""

    def __init__(self, name, shape, values, dtype):
        if math.prod(shape) != len(values):
            raise CaptureError("%s: shape %s does not hold %d values" % (name, shape, len(values)))
        self.name, self.shape, self.dtype = name, list(shape), dtype
        self._values = values

    @property
    def nbytes(self):
        return math.prod(self.shape) * (2 if self.dtype in ("F16", "BF16") else 4)

    def to_bytes(self):
        return floats_to_bytes(self._values, self.dtype)


class TorchTensor:
    """A torch tensor to be stored as safetensors dtype F32/F16/BF16."""

    def __init__(self, name, tensor, dtype):
        import torch

        torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
        self.name, self.dtype = name, dtype
        self._tensor = tensor.detach().to("cpu", torch_dtype).contiguous()
        self.shape = list(self._tensor.shape)

    @property
    def nbytes(self):
        return self._tensor.numel() * self._tensor.element_size()

    def to_bytes(self):
        import torch

        # Reinterpret as integers of the same width: numpy has no bfloat16.
        as_int = self._tensor if self.dtype == "F32" else self._tensor.view(torch.int16)
        try:
            data = as_int.numpy().tobytes()
        except Exception:  # no numpy: slower, but still dependency-free
            import array

            data = array.array("f" if self.dtype == "F32" else "h", as_int.flatten().tolist())
            if sys.byteorder != "little":
                data.byteswap()
            data = data.tobytes()
        if len(data) != self.nbytes:
            raise CaptureError("%s: serialised %d bytes, expected %d" % (self.name, len(data), self.nbytes))
        return data


def write_safetensors(path, tensors, metadata):
    """Writes `tensors` (objects with name, shape, dtype, nbytes, to_bytes()) and string metadata.

    Layout (the safetensors spec): u64 little-endian header length, the JSON header (padded with
    spaces to a multiple of 8 bytes), then the tensors back to back in header order. Written to a
    temporary file and renamed, so a failed run never leaves a half-written capture.
    """
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise CaptureError("metadata %r must be a string" % key)
    header = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    header_bytes = json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for t in tensors:
            data = t.to_bytes()
            if len(data) != t.nbytes:
                raise CaptureError("%s: %d bytes, header says %d" % (t.name, len(data), t.nbytes))
            out.write(data)
    os.replace(tmp, path)


def capture_metadata(model, num_layers, q_heads, kv_heads, head_dim, tokens, prompt, source, extra=None):
    """The `__metadata__` of docs/capture-format.md (all values strings)."""
    metadata = {
        "format": FORMAT,
        "model": model,
        "num_layers": str(num_layers),
        "q_heads": str(q_heads),
        "kv_heads": str(kv_heads),
        "head_dim": str(head_dim),
        "rope": "applied",
        "tokens": json.dumps(tokens, ensure_ascii=False),
        "prompt": prompt,
        "source": source,
    }
    metadata.update(extra or {})
    return metadata


# ---------------------------------------------------------------------------------------------
# hooking a transformers model


def model_dims(config):
    """(q_heads, kv_heads, head_dim) from a transformers config."""
    q_heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    if q_heads % kv_heads != 0:
        raise CaptureError("config: num_attention_heads %d is not a multiple of "
                           "num_key_value_heads %d" % (q_heads, kv_heads))
    return q_heads, kv_heads, head_dim


def attention_modules(model):
    """The self-attention module of every decoder layer, in layer order."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None) if base is not None else None
    if layers is None and hasattr(model, "get_decoder"):
        layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise CaptureError("--model: %s has no model.layers (decoder layers); supported are "
                           "Llama-style models (Llama, Qwen2, Mistral, ...)" % type(model).__name__)
    modules = []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj")):
            raise CaptureError("--model: layer %d has no self_attn with q_proj/k_proj/v_proj" % i)
        modules.append(attn)
    return modules


def to_heads_first(t, heads, n, head_dim, what):
    """[batch, heads, n, d] or [batch, n, heads, d] (batch 1) -> [heads, n, d]."""
    if t.dim() != 4 or t.shape[0] != 1 or t.shape[-1] != head_dim:
        raise CaptureError("%s: unexpected shape %s (expected [1, %d, %d, %d])" % (what, tuple(t.shape), heads, n, head_dim))
    if t.shape[1] == heads and t.shape[2] == n:
        return t[0]
    if t.shape[1] == n and t.shape[2] == heads:
        return t[0].transpose(0, 1)
    raise CaptureError("%s: shape %s does not match %d heads x %d tokens" % (what, tuple(t.shape), heads, n))


def capture_model(model, input_ids, layers=None, keep_dtype=None):
    """Runs `input_ids` ([1, n] tensor) through `model` and returns per captured layer a dict
    {query [q_heads, n, d], key [kv_heads, n, d], value [kv_heads, n, d]} (CPU tensors in
    `keep_dtype`, default float32), keys and queries after RoPE.

    `layers` lists the model layers to keep (default all).
    """
    import torch

    keep_dtype = keep_dtype or torch.float32
    q_heads, kv_heads, head_dim = model_dims(model.config)
    modules = attention_modules(model)
    wanted = list(range(len(modules))) if layers is None else list(layers)
    for L in wanted:
        if not 0 <= L < len(modules):
            raise CaptureError("--layers: layer %d out of range [0, %d)" % (L, len(modules)))
    n = input_ids.shape[1]
    records = {L: {} for L in wanted}
    state = {"layer": None}

    # Patch apply_rotary_pos_emb in every modeling module the attention classes come from.
    patched = {}
    for attn in modules:
        module_name = type(attn).__module__
        if module_name in patched:
            continue
        modeling = sys.modules[module_name]
        original = getattr(modeling, "apply_rotary_pos_emb", None)
        if original is None:
            raise CaptureError("--model: %s (%s) has no apply_rotary_pos_emb to hook; supported "
                               "are Llama-style attention modules (Llama, Qwen2, Mistral, ...)"
                               % (type(attn).__name__, module_name))

        def rope_hook(q, k, *args, _original=original, **kwargs):
            q_rot, k_rot = _original(q, k, *args, **kwargs)
            L = state["layer"]
            if L in records:
                records[L]["query"] = to_heads_first(q_rot, q_heads, n, head_dim, "layer %d query" % L).to("cpu", keep_dtype)
                records[L]["key"] = to_heads_first(k_rot, kv_heads, n, head_dim, "layer %d key" % L).to("cpu", keep_dtype)
            return q_rot, k_rot

        patched[module_name] = (modeling, original)
        modeling.apply_rotary_pos_emb = rope_hook

    handles = []

    def enter(L):
        def hook(module, args, *rest):
            state["layer"] = L
        return hook

    def leave(module, args, output):
        state["layer"] = None

    def value_hook(L):
        def hook(module, args, output):
            if L in records:
                v = output.reshape(1, n, kv_heads, head_dim)
                records[L]["value"] = v[0].transpose(0, 1).to("cpu", keep_dtype)
        return hook

    try:
        for L, attn in enumerate(modules):
            handles.append(attn.register_forward_pre_hook(enter(L)))
            handles.append(attn.register_forward_hook(leave))
            handles.append(attn.v_proj.register_forward_hook(value_hook(L)))
        with torch.no_grad():
            model(input_ids=input_ids.to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
        for modeling, original in patched.values():
            modeling.apply_rotary_pos_emb = original

    for L in wanted:
        missing = [name for name in ("query", "key", "value") if name not in records[L]]
        if missing:
            raise CaptureError("layer %d: %s not recorded: the attention module did not call "
                               "apply_rotary_pos_emb / v_proj as Llama-style models do" % (L, ", ".join(missing)))
    return [records[L] for L in wanted]


def token_strings(tokenizer, ids):
    """The text each token adds, found by decoding a short window with and without it (so
    SentencePiece's leading spaces and multi-byte characters come out right); falls back to the
    raw token when the window's decoding is not a prefix (normalising decoders)."""
    raw = tokenizer.convert_ids_to_tokens(ids)
    out = []
    for i in range(len(ids)):
        start = max(0, i - 6)
        def text(window):
            return tokenizer.decode(window, skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False) if window else ""
        before, after = text(ids[start:i]), text(ids[start:i + 1])
        out.append(after[len(before):] if after.startswith(before) else str(raw[i]))
    return out


def parse_layers(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CaptureError("--layers %r: expected comma-separated layer numbers, e.g. 0,1,5" % text)


def capture_prompt(model, tokenizer, prompt, args, layers, out, shown=None):
    """Runs the model on one prompt and writes its capture to `out` (named `shown` in messages)."""
    import torch
    import transformers

    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=not args.no_bos)["input_ids"]
    if args.max_tokens is not None:
        ids = ids[:, : args.max_tokens]
    n = ids.shape[1]
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and n > limit:
        print("warning: %d tokens exceed the model's max_position_embeddings %d" % (n, limit), file=sys.stderr)
    print("capturing %s: %d tokens, %d layers" % (args.model, n, model.config.num_hidden_layers), file=sys.stderr)

    records = capture_model(model, ids, layers)
    q_heads, kv_heads, head_dim = model_dims(model.config)
    st_dtype = DTYPES[args.dtype][0]
    tensors = []
    modules = attention_modules(model)
    source_layers = layers if layers is not None else list(range(len(records)))
    for i, rec in enumerate(records):
        tensors.append(TorchTensor("layers.%d.key" % i, rec["key"], st_dtype))
        tensors.append(TorchTensor("layers.%d.query" % i, rec["query"], st_dtype))
        tensors.append(TorchTensor("layers.%d.value" % i, rec["value"], st_dtype))
        # Each query head's slice of the output projection, transposed (docs/capture-format.md,
        # layers.L.wo), as kvpress's CriticalKVPress.vwl1norm views o_proj.weight.
        o_proj = getattr(modules[source_layers[i]], "o_proj", None)
        if o_proj is not None:
            wo = o_proj.weight.detach().transpose(0, 1).reshape(q_heads, head_dim, -1)
            tensors.append(TorchTensor("layers.%d.wo" % i, wo.to("cpu", torch.float32), st_dtype))
    has_wo = sum(t.name.endswith(".wo") for t in tensors)
    if has_wo not in (0, len(records)):
        raise CaptureError("--model: only %d of %d layers have an o_proj" % (has_wo, len(records)))
    id_list = ids[0].tolist()
    extra = {"hf_model_type": str(getattr(model.config, "model_type", "")),
             "torch_dtype": args.model_dtype}
    if layers is not None:
        extra["source_layers"] = ",".join(str(L) for L in layers)
    # RoPE for methods that undo it (docs/capture-format.md): Llama / Qwen2 / Mistral rotate
    # channel halves (rotate_half). Scaled RoPE (Llama 3.1, YaRN) is left unstated, and those
    # methods then refuse the capture.
    theta = getattr(model.config, "rope_theta", None)
    scaling = getattr(model.config, "rope_scaling", None)
    if theta and (not scaling or scaling.get("rope_type", scaling.get("type")) == "default"):
        extra["rope_theta"] = repr(float(theta))
        extra["rope_layout"] = "half"
    metadata = capture_metadata(
        model=args.model, num_layers=len(records), q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim, tokens=token_strings(tokenizer, id_list), prompt=prompt,
        source="tools/capture_hf.py (transformers %s, torch %s)" % (transformers.__version__, torch.__version__),
        extra=extra)
    write_safetensors(out, tensors, metadata)
    print("wrote %s: %d layers x %d tokens, %d query heads, %d kv heads, head dim %d, %s"
          % (shown or out, len(records), n, q_heads, kv_heads, head_dim, st_dtype), file=sys.stderr)


def read_prompts(path):
    """--prompts FILE.jsonl: one {"prompt": ..., "label": ...} per line (label optional)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise CaptureError("--prompts %s: %s" % (path, e))
    out = []
    for number, line in enumerate(text, 1):
        if not line.strip():
            continue
        where = "--prompts %s line %d" % (path, number)
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise CaptureError("%s: not JSON (%s)" % (where, e))
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise CaptureError('%s: expected {"prompt": "...", "label": "..."} with a prompt' % where)
        if "label" in obj and not isinstance(obj["label"], str):
            raise CaptureError('%s: "label" is not a string' % where)
        out.append((obj["prompt"], obj.get("label", ""), number))
    if not out:
        raise CaptureError("--prompts %s: no prompt in the file" % path)
    return out


def capture_file_name(index, count, label):
    """007-genesis-1.safetensors, as kvscope-cli capture --prompts names its files."""
    slug = ""
    for ch in label:
        if (ch.isascii() and ch.isalnum()) or ch in "-_":
            slug += ch.lower()
        elif slug and not slug.endswith("-"):
            slug += "-"
        if len(slug) >= 40:
            break
    slug = slug.rstrip("-")
    number = str(index).zfill(max(3, len(str(count))))
    return number + ("-" + slug if slug else "") + ".safetensors"


def capture_set(model, tokenizer, args, layers):
    """One capture per prompt into --out-dir and its manifest.jsonl (docs/capturing.md): written in
    a folder of their own first, moved next to the manifest only when every prompt is captured."""
    prompts = read_prompts(args.prompts)
    entries = []
    for i, (prompt, label, _) in enumerate(prompts):
        entries.append({"path": capture_file_name(i, len(prompts), label),
                        "label": label or "prompt %d" % i, "prompt": prompt})
    for e in entries:
        if os.path.exists(os.path.join(args.out_dir, e["path"])):
            raise CaptureError("--out-dir %s: %s is already there" % (args.out_dir, e["path"]))
    partial = os.path.join(args.out_dir, ".kvscope-capture-partial-%d" % os.getpid())
    os.makedirs(partial, exist_ok=True)
    try:
        for i, (prompt, _, line) in enumerate(prompts):
            print("prompt %d/%d (%s line %d)" % (i + 1, len(prompts), args.prompts, line), file=sys.stderr)
            capture_prompt(model, tokenizer, prompt, args, layers, os.path.join(partial, entries[i]["path"]),
                           shown=os.path.join(args.out_dir, entries[i]["path"]))
        with open(os.path.join(partial, "manifest.jsonl"), "w", encoding="utf-8") as f:
            for e in entries:
                f.write(json.dumps(e, ensure_ascii=False) + "\n")
        for e in entries:
            os.rename(os.path.join(partial, e["path"]), os.path.join(args.out_dir, e["path"]))
        os.rename(os.path.join(partial, "manifest.jsonl"), os.path.join(args.out_dir, "manifest.jsonl"))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print("wrote %s: %d captures" % (os.path.join(args.out_dir, "manifest.jsonl"), len(entries)), file=sys.stderr)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="transformers model name or local path")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file holding the prompt text (UTF-8)")
    source.add_argument("--prompts", help="a capture set instead: FILE.jsonl with one "
                        '{"prompt": ..., "label": ...} per line, one capture each into --out-dir')
    parser.add_argument("--out", help="output .safetensors (one prompt)")
    parser.add_argument("--out-dir", help="with --prompts: the folder for the captures and manifest.jsonl")
    parser.add_argument("--layers", help="comma-separated layers to capture (default: all); "
                        "stored as layers.0, layers.1, ... in this order")
    parser.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="tensor dtype in the file")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--max-tokens", type=int, help="keep only the first N prompt tokens")
    parser.add_argument("--model-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="dtype the model runs in (default float32)")
    parser.add_argument("--no-bos", action="store_true", help="do not let the tokenizer add BOS / special tokens")
    args = parser.parse_args(argv)

    try:
        if args.prompts:
            if args.out or not args.out_dir:
                raise CaptureError("--prompts: give --out-dir DIR (not --out) for the captures")
            if os.path.exists(os.path.join(args.out_dir, "manifest.jsonl")):
                raise CaptureError("--out-dir %s: already holds a manifest.jsonl (choose a new folder)" % args.out_dir)
            read_prompts(args.prompts)  # a bad file is refused before the model loads
        elif not args.out or args.out_dir:
            raise CaptureError("--out FILE.safetensors for one prompt (--out-dir only with --prompts)")
        elif not args.out.endswith(".safetensors"):
            raise CaptureError("--out %s: must end in .safetensors" % args.out)
        if args.max_tokens is not None and args.max_tokens < 1:
            raise CaptureError("--max-tokens must be >= 1")
        layers = parse_layers(args.layers) if args.layers else None
        if args.prompt_file:
            try:
                with open(args.prompt_file, encoding="utf-8") as f:
                    prompt = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise CaptureError("--prompt-file %s: %s" % (args.prompt_file, e))
        else:
            prompt = args.prompt
        if not args.prompts and not prompt:
            raise CaptureError("--prompt: the prompt is empty")
        try:
            import torch
            import transformers
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as e:
            raise CaptureError("this tool needs torch and transformers (pip install torch transformers): %s" % e)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise CaptureError("--device cuda: no CUDA device is available to torch")

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=getattr(torch, args.model_dtype))
        model.eval().to(args.device)
        if args.prompts:
            capture_set(model, tokenizer, args, layers)
        else:
            capture_prompt(model, tokenizer, prompt, args, layers, args.out)
        return 0
    except CaptureError as e:
        print("capture_hf.py: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Regenerates the malformed-capture corpus in this directory (standard library only).

Each file is a small KVScope capture (2 layers, 4 query heads, 2 kv heads, 4 tokens, d = 2) with
exactly one defect; tests/test_malformed.cpp opens each and checks the error names the file, the
tensor and the problem. The valid_* files are the well-formed originals (and fuzz seeds).
Run: python3 tests/malformed/make_corpus.py
"""
import json
import math
import os
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, Q_HEADS, KV_HEADS, N, D = 2, 4, 2, 4, 2


def metadata(**override):
    m = {
        "format": "kvscope/1",
        "model": "corpus-model",
        "num_layers": str(LAYERS),
        "q_heads": str(Q_HEADS),
        "kv_heads": str(KV_HEADS),
        "head_dim": str(D),
        "rope": "applied",
        "tokens": json.dumps(["<s>", "Once", " upon", " a"]),
        "prompt": "Once upon a",
        "source": "tests/malformed/make_corpus.py",
    }
    for k, v in override.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    return m


def values(layer, kind, heads, n=N, d=D):
    # Small distinct numbers, exact in F16 and F32.
    return [((layer * 7 + kind * 3 + i) % 17 - 8) / 8.0 for i in range(heads * n * d)]


def tensors(layers=LAYERS):
    """[(name, shape, values)] in file order."""
    out = []
    for L in range(layers):
        out.append((f"layers.{L}.key", [KV_HEADS, N, D], values(L, 0, KV_HEADS)))
        out.append((f"layers.{L}.value", [KV_HEADS, N, D], values(L, 1, KV_HEADS)))
        out.append((f"layers.{L}.query", [Q_HEADS, N, D], values(L, 2, Q_HEADS)))
    return out


def pack(vals, dtype):
    if dtype == "F32":
        return struct.pack(f"<{len(vals)}f", *vals)
    if dtype == "F16":
        return struct.pack(f"<{len(vals)}e", *vals)
    if dtype == "F64":
        return struct.pack(f"<{len(vals)}d", *vals)
    raise ValueError(dtype)


def safetensors(name, ts=None, meta=None, dtype="F32", header_edit=None, raw_header=None,
                cut=None, data_edit=None):
    ts = tensors() if ts is None else ts
    header, data = {}, b""
    if meta is not False:
        header["__metadata__"] = metadata() if meta is None else meta
    for tname, shape, vals in ts:
        blob = pack(vals, dtype)
        header[tname] = {"dtype": dtype, "shape": shape,
                         "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    if header_edit:
        header_edit(header)
    if data_edit:
        data = data_edit(header, data)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    blob = struct.pack("<Q", len(text)) + text + data
    if cut is not None:
        blob = blob[:cut] if cut >= 0 else blob[:len(blob) + cut]
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(blob)


def npy(shape, vals, descr="<f4", fortran=False, version=1, extra_bytes=0):
    fmt = {"<f4": "f", "<f2": "e", "<f8": "d"}[descr]
    body = struct.pack(f"<{len(vals)}{fmt}", *vals) + b"\0" * extra_bytes
    shape_text = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    text = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    prefix = 10 if version == 1 else 12
    text += " " * ((64 - (prefix + len(text) + 1) % 64) % 64) + "\n"
    text = text.encode("latin1")
    if version == 1:
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text))
    else:
        head = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(text))
    return head + text + body


def npz(name, members=None, compression=zipfile.ZIP_STORED, force_zip64=False, cut=None,
        flip=None):
    """members: [(member name, bytes)]; default: the valid capture."""
    if members is None:
        members = [("metadata.json", json.dumps(metadata()).encode())]
        members += [(t + ".npy", npy(shape, vals)) for t, shape, vals in tensors()]
    path = os.path.join(HERE, name)
    with zipfile.ZipFile(path, "w") as z:
        for mname, data in members:
            info = zipfile.ZipInfo(mname, (1980, 1, 1, 0, 0, 0))  # fixed date: reproducible
            info.compress_type = compression
            with z.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)
    if cut is not None or flip is not None:
        blob = bytearray(open(path, "rb").read())
        if flip is not None:
            blob[flip(blob)] ^= 0xFF
        if cut is not None:
            blob = blob[:cut]
        open(path, "wb").write(bytes(blob))


def with_value(ts, tname, index, value):
    out = []
    for n, shape, vals in ts:
        if n == tname:
            vals = list(vals)
            vals[index] = value
        out.append((n, shape, vals))
    return out


def main():
    # ---- valid seeds
    safetensors("valid_f32.safetensors")
    safetensors("valid_f16.safetensors", dtype="F16")
    npz("valid_stored.npz")
    npz("valid_deflated.npz", compression=zipfile.ZIP_DEFLATED)
    npz("valid_zip64.npz", compression=zipfile.ZIP_DEFLATED, force_zip64=True)

    # ---- container-level damage (safetensors)
    with open(os.path.join(HERE, "too_short.safetensors"), "wb") as f:
        f.write(b"\x10\x00\x00")
    safetensors("truncated.safetensors", cut=-20)
    safetensors("header_too_long.safetensors", raw_header=b'{"__metadata__": {}}')
    blob = bytearray(open(os.path.join(HERE, "header_too_long.safetensors"), "rb").read())
    blob[0:8] = struct.pack("<Q", 1 << 40)
    open(os.path.join(HERE, "header_too_long.safetensors"), "wb").write(bytes(blob))
    # A text file opened as a capture: its first 8 bytes read as a length of exabytes.
    with open(os.path.join(HERE, "text_file.safetensors"), "wb") as f:
        f.write(b"Once upon a time, there was a little girl named Lily.\n")
    safetensors("invalid_json.safetensors", raw_header=b'{"layers.0.key": {"dtype": "F32",')
    safetensors("header_not_object.safetensors", raw_header=b"[1, 2, 3]")

    def edit(tname, key, value):
        def f(h):
            h[tname][key] = value
        return f

    safetensors("offsets_out_of_range.safetensors",
                header_edit=edit("layers.1.query", "data_offsets", [384, 10000]))
    safetensors("offsets_negative.safetensors",
                header_edit=edit("layers.0.value", "data_offsets", [-8, 56]))

    def overlap(h):
        # layers.0.value starts inside layers.0.key; sizes stay consistent.
        b, e = h["layers.0.value"]["data_offsets"]
        h["layers.0.value"]["data_offsets"] = [b - 8, e - 8]
    safetensors("overlapping.safetensors", header_edit=overlap)
    safetensors("size_mismatch.safetensors",
                header_edit=edit("layers.0.key", "shape", [2, 4, 3]))
    safetensors("unknown_dtype.safetensors", header_edit=edit("layers.1.value", "dtype", "Q7"))
    safetensors("unsupported_dtype_f64.safetensors", dtype="F64")
    safetensors("metadata_not_string.safetensors",
                header_edit=lambda h: h["__metadata__"].update({"num_layers": 2}))

    # ---- capture layout errors
    ts = tensors()
    safetensors("wrong_rank.safetensors",
                ts=[(n, [s[0] * s[1], s[2]] if n == "layers.1.key" else s, v) for n, s, v in ts])
    safetensors("tokens_mismatch_between_layers.safetensors",
                ts=[(n, [s[0], 2, 4] if n == "layers.1.value" else s, v) for n, s, v in ts])
    safetensors("head_dim_mismatch.safetensors", meta=metadata(head_dim="4"))
    three = tensors(3)
    safetensors("missing_layer.safetensors",
                ts=[t for t in three if not t[0].startswith("layers.1.")],
                meta=metadata(num_layers="3"))
    safetensors("missing_value.safetensors", ts=[t for t in ts if t[0] != "layers.1.value"])
    safetensors("missing_query_in_one_layer.safetensors",
                ts=[t for t in ts if t[0] != "layers.1.query"])
    safetensors("layer_beyond_num_layers.safetensors", ts=tensors(3))
    safetensors("kv_heads_mismatch.safetensors", meta=metadata(kv_heads="1", q_heads="4"))
    safetensors("q_heads_not_multiple.safetensors", meta=metadata(q_heads="3"))
    safetensors("no_metadata.safetensors", meta=False)
    safetensors("wrong_format.safetensors", meta=metadata(format="kvscope/2"))
    safetensors("missing_head_dim.safetensors", meta=metadata(head_dim=None))
    safetensors("num_layers_not_integer.safetensors", meta=metadata(num_layers="two"))
    safetensors("rope_not_applied.safetensors", meta=metadata(rope="none"))
    safetensors("tokens_count_mismatch.safetensors",
                meta=metadata(tokens=json.dumps(["<s>", "Once", " upon"])))
    safetensors("tokens_not_json.safetensors", meta=metadata(tokens="<s> Once upon a"))

    # ---- non-finite values: the file opens; the affected kv head is refused on load
    safetensors("nan_key.safetensors", ts=with_value(ts, "layers.1.key", N * D + 3, math.nan))
    safetensors("inf_query.safetensors", ts=with_value(ts, "layers.0.query", 3 * N * D, math.inf))

    # ---- npz damage
    npz("truncated.npz", cut=300)
    with open(os.path.join(HERE, "not_a_zip.npz"), "wb") as f:
        f.write(b"this is not a zip archive, just text pretending to be one" * 2)
    good = [("metadata.json", json.dumps(metadata()).encode())] + \
           [(t + ".npy", npy(s, v)) for t, s, v in tensors()]

    def replace(member, data):
        return [(m, data if m == member else d) for m, d in good]

    npz("missing_metadata_json.npz", members=good[1:])
    npz("metadata_json_invalid.npz", members=replace("metadata.json", b"{format: kvscope}"))
    npz("npy_bad_magic.npz", members=replace("layers.0.key.npy", b"NOTNUMPY" + b"\0" * 80))
    npz("npy_f8.npz", members=replace("layers.0.value.npy",
                                      npy([KV_HEADS, N, D], values(0, 1, KV_HEADS), "<f8")))
    npz("npy_fortran.npz", members=replace("layers.1.key.npy",
                                           npy([KV_HEADS, N, D], values(1, 0, KV_HEADS),
                                               fortran=True)))
    npz("npy_size_mismatch.npz", members=replace("layers.1.query.npy",
                                                 npy([Q_HEADS, N, D], values(1, 2, Q_HEADS),
                                                     extra_bytes=4)))
    npz("npy_header_garbage.npz", members=replace(
        "layers.0.key.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4}  "))
    npz("npy_v2_header.npz", members=replace(
        "layers.0.key.npy", npy([KV_HEADS, N, D], values(0, 0, KV_HEADS), version=2)))
    npz("bad_crc.npz", compression=zipfile.ZIP_DEFLATED,
        flip=lambda b: b.index(b"layers.1.value.npy") + len("layers.1.value.npy") + 12)
    npz("corrupt_deflate.npz", compression=zipfile.ZIP_DEFLATED,
        flip=lambda b: b.index(b"layers.0.query.npy") + len("layers.0.query.npy") + 2)
    try:
        npz("unsupported_compression.npz", compression=zipfile.ZIP_BZIP2)
    except RuntimeError:
        pass  # no bz2 module: the test skips this file when it is absent


if __name__ == "__main__":
    main()

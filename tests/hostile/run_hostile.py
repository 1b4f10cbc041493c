#!/usr/bin/env python3
"""Hostile-input suite for kvscope-cli.

Generates every hostile file into a work folder (the repository stays small), runs kvscope-cli on
each with a memory limit (RLIMIT_AS, or ASan's hard_rss_limit_mb under sanitizers) and a generous
hang guard, and checks the exit status and a message pattern. Every class of the issue that
concerns the engine and the CLI is covered: crashes, hangs, runaway memory, data loss, non-finite
results, inputs that must be refused, and terminal escapes. Exit 0 when every case passes.

  run_hostile.py --cli build/kvscope-cli --work build/hostile [--sanitized] [--models DIR]
"""
import argparse
import array
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
import zlib

HANG_GUARD_S = 120  # generous: a case that takes this long is a hang, not a slow run
# Sanitized builds run the same work several times slower (the slowest case, 5M token strings,
# took 109 s under ASan on a loaded 2-core machine), so their guard is wider.
SANITIZED_HANG_GUARD_S = 480
# The guard counts the case's CPU seconds (RLIMIT_CPU: a spinning hang), not the wall's: on a
# machine whose cores are busy with other work a case gets a fraction of a core, and a 120 s
# wall guard once stopped a 3M-entry merge that was only waiting for the CPU. A case blocked
# without spinning (a FIFO opened for reading) uses no CPU: the wall guard, this many times
# the CPU guard, catches it.
WALL_GUARD_FACTOR = 5


# ---------------------------------------------------------------------------------------------
# file builders

def st_bytes(header_text, data=b""):
    """A safetensors file from raw header text (so duplicates and odd JSON can be written)."""
    raw = header_text.encode("utf-8", "surrogateescape")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def capture_tensors(layers=2, kv=2, q=4, n=64, d=8, fill=None, queries=True):
    """(entries, data, metadata) of a valid small capture; fill(layer, kind, i) -> float."""
    entries, chunks, offset = [], [], 0
    for L in range(layers):
        for kind, heads in (("key", kv), ("value", kv), ("query", q)):
            if kind == "query" and not queries:
                continue
            count = heads * n * d
            if fill is None:
                values = array.array("f", (((i * 7919 + L * 31 + len(kind)) % 997) / 997.0 - 0.5
                                           for i in range(count)))
            else:
                values = array.array("f", (fill(L, kind, i) for i in range(count)))
            blob = values.tobytes()
            entries.append((f"layers.{L}.{kind}", [heads, n, d], offset, offset + len(blob)))
            chunks.append(blob)
            offset += len(blob)
    meta = {"format": "kvscope/1", "model": "hostile-test", "num_layers": str(layers),
            "q_heads": str(q), "kv_heads": str(kv), "head_dim": str(d), "rope": "applied",
            "tokens": json.dumps([f"t{i}" for i in range(n)]), "prompt": "p",
            "source": "tests/hostile"}
    return entries, b"".join(chunks), meta


def header_text(entries, meta, extra_meta_text="", extra_entries_text=""):
    parts = []
    meta_text = ", ".join(json.dumps(k) + ": " + json.dumps(v) for k, v in meta.items())
    parts.append('"__metadata__": {' + meta_text + extra_meta_text + "}")
    for name, shape, b, e in entries:
        parts.append(json.dumps(name) + ": " + json.dumps(
            {"dtype": "F32", "shape": shape, "data_offsets": [b, e]}))
    return "{" + ", ".join(parts) + extra_entries_text + "}"


def write(path, blob):
    with open(path, "wb") as f:
        f.write(blob)


def npy(values_bytes, shape, descr="<f4"):
    shape_text = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    total = 10 + len(d) + 1
    d += " " * ((64 - total % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + values_bytes


def zip_bytes(members):
    """members: (name, payload, method, claimed_size or None). method 0 stored, 8 deflated; the
    directory may claim another uncompressed size than the payload really has."""
    out, central = bytearray(), bytearray()
    for name, payload, method, claimed in members:
        data = payload
        if method == 8:
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            data = c.compress(payload) + c.flush()
        size = len(payload) if claimed is None else claimed
        crc = zlib.crc32(payload) & 0xFFFFFFFF
        offset = len(out)
        nm = name.encode()
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data),
                           size, len(nm), 0) + nm + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, crc,
                               len(data), size, len(nm), 0, 0, 0, 0, 0, offset) + nm
    cd_offset = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central),
                       cd_offset, 0)
    return bytes(out)


def deflate_stream_of_zeros(total, chunk=1 << 20):
    """Raw deflate of `total` zero bytes, built chunk by chunk (never holds the inflated data)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    zero = bytes(chunk)
    parts, left = [], total
    while left > 0:
        take = min(left, chunk)
        parts.append(c.compress(zero[:take]))
        left -= take
    parts.append(c.flush())
    return b"".join(parts)


def zip_with_raw_member(name, raw_deflate, claimed_size, crc=0):
    out = bytearray()
    nm = name.encode()
    out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(raw_deflate),
                       claimed_size, len(nm), 0) + nm + raw_deflate
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21, crc,
                          len(raw_deflate), claimed_size, len(nm), 0, 0, 0, 0, 0, 0) + nm
    cd_offset = len(out)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), cd_offset, 0)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# running

class Runner:
    def __init__(self, cli, work, sanitized):
        self.cli, self.work, self.sanitized = cli, work, sanitized
        self.failures, self.passed = [], 0

    def run(self, args, mem_mb=3072, stdout_path=None, timeout=None):
        """Runs the CLI; returns (rc, output text, seconds)."""
        if timeout is None:
            timeout = SANITIZED_HANG_GUARD_S if self.sanitized else HANG_GUARD_S
        cpu_guard = timeout
        env = dict(os.environ)
        if self.sanitized:
            # ASan reserves terabytes of address space, so RLIMIT_AS cannot bound it; its own RSS
            # limit does (the process dies with a report when it is exceeded).
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + \
                f":hard_rss_limit_mb={mem_mb}:detect_leaks=0:allocator_may_return_null=1"
            env["UBSAN_OPTIONS"] = env.get("UBSAN_OPTIONS", "") + ":print_stacktrace=1:halt_on_error=1"

        def limit():
            if not self.sanitized:
                b = mem_mb << 20
                resource.setrlimit(resource.RLIMIT_AS, (b, b))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_guard, cpu_guard + 5))

        argv = [self.cli] + [a if isinstance(a, (bytes, str)) else str(a) for a in args]
        out_file = open(stdout_path, "wb") if stdout_path else subprocess.PIPE
        start = time.monotonic()
        try:
            p = subprocess.run(argv, stdout=out_file, stderr=subprocess.PIPE, cwd=self.work,
                               env=env, preexec_fn=limit, timeout=timeout * WALL_GUARD_FACTOR)
            rc, out = p.returncode, (p.stdout or b"") + p.stderr
            if rc in (-signal.SIGXCPU, -signal.SIGKILL) and \
                    time.monotonic() - start >= 0.9 * cpu_guard:
                rc = "timeout"  # ran out of its CPU guard: a spinning hang
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout", (e.stdout or b"") + (e.stderr or b"")
        finally:
            if stdout_path:
                out_file.close()
        return rc, out.decode("utf-8", "replace"), time.monotonic() - start

    def case(self, name, args, rc=1, pattern=None, mem_mb=3072, check=None, stdout_path=None):
        got_rc, out, seconds = self.run(args, mem_mb=mem_mb, stdout_path=stdout_path)
        problems = []
        expected = rc if isinstance(rc, (set, tuple, list)) else {rc}
        if got_rc not in expected:
            problems.append(f"exit {got_rc}, expected {sorted(expected)}")
        if pattern and not re.search(pattern, out, re.S):
            problems.append(f"output does not match /{pattern}/")
        if "internal error" in out:
            problems.append("'internal error' in the output")
        for marker in ("AddressSanitizer", "runtime error:", "LeakSanitizer", "Segmentation fault"):
            if marker in out:
                problems.append(f"sanitizer/crash report ({marker})")
        if check:
            try:
                msg = check(out)
                if msg:
                    problems.append(msg)
            except Exception as e:  # a broken check is a failure, not a pass
                problems.append(f"check raised {e!r}")
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {name:44s} exit {got_rc!s:>7} {seconds:6.2f}s", flush=True)
        if problems:
            tail = out[-1500:]
            print("     " + "; ".join(problems) + "\n     output: " + tail.replace("\n", "\n     "))
            self.failures.append(name)
        else:
            self.passed += 1


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------------------------------------
# kvscope-cli generate: every flag out of range, hostile prompts, model/tokenizer/continuation
# files that are missing, garbage, truncated, absurd or not regular files, and outputs that
# would overwrite an input, a link's target, a FIFO or a device.

LLAMA2C_HEADER = struct.Struct("<7i")  # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len


def generate_cases(case, r, models):
    model = os.path.join(models, "stories260K.bin")
    tok = os.path.join(models, "tok512.bin")
    tok1024 = os.path.join(models, "tok1024.bin")
    prompt = "Once upon a time there was a little girl"
    base = ["generate", "--model", model, "--tokenizer", tok, "--methods", "uniform", "--steps", "4",
            "--quiet"]
    gen = base + ["--prompt", prompt]
    case("generate: valid run", gen, rc=0, pattern=r"uniform\s+0\.2500")

    # every numeric flag out of range, with its limits in the message
    for flags, pat in (
            (["--steps", "0"], r"--steps 0: must be between 1 and 1048576"),
            (["--steps", "-1"], r"--steps -1: must be between 1 and 1048576"),
            (["--steps", "99999999999"], r"--steps 99999999999: must be between 1 and 1048576"),
            (["--compress-at", "-1"], r"--compress-at -1: must be between 0 and 1048576"),
            (["--compress-at", "5000"], r"--compress-at: 5000 \+ 4 steps = 5004 positions exceed "
                                        r"the model's context seq_len 512"),
            (["--compress-at", "3"], r"--compress-at: 3 is inside the prompt"),
            (["--recompress-every", "-1"], r"--recompress-every -1: must be between 0 and 1048576"),
            (["--sink", "-5"], r"--sink -5: must be between -1 and 1048576"),
            (["--sink", "400"], r"--sink/--window: s \+ W = 400 \+ \d+ exceeds the \d+ positions cached"),
            (["--window", "0"], r"--window: 0 must be at least 1"),
            (["--window", "-2"], r"--window -2: must be between -1 and 1048576"),
            (["--window", "400"], r"--sink/--window: s \+ W = \d+ \+ 400 exceeds"),
            (["--sink", "6", "--window", "6", "--compress-at", "12"], r"no middle left to compress"),
            (["--threads", "-1"], r"--threads -1: must be between 0 and 4096"),
            (["--threads", "100000"], r"--threads 100000: must be between 0 and 4096"),
            (["--seed", "-1"], r"--seed '-1': must be an integer between 0 and 18446744073709551615"),
            (["--seed", "18446744073709551616"], r"--seed '18446744073709551616': must be an integer"),
            (["--seed", "1e3"], r"--seed '1e3': must be an integer"),
            (["--ratios", "nan"], r"--ratios: keep ratio nan is not in \(0, 1\]"),
            (["--ratios", "1/0"], r"--ratios: keep ratio inf is not in \(0, 1\]"),
            (["--ratios", "0"], r"--ratios: keep ratio 0 is not in \(0, 1\]"),
            (["--ratios", "-0.5"], r"--ratios: keep ratio -0.5 is not in \(0, 1\]"),
            (["--ratios", "2"], r"--ratios: keep ratio 2 is not in \(0, 1\]"),
            (["--ratios", "0.5,1/2"], r"--ratios: 1/2 given twice"),
            (["--ratios", "abc"], r"--ratios: 'abc' is not a number"),
            (["--methods", "balancekv", "--param", "balancekv.gamma=nan"], r"balancekv.gamma.*finite"),
            (["--methods", "balancekv", "--param", "balancekv.gamma=1e400"], r"beyond the range of a double"),
            (["--methods", "balancekv", "--param", "balancekv.block=-5"], r"balancekv.block: -5 is outside \[2, 4096\]"),
            (["--param", "uniform.x=1"], r"--param uniform.x: unknown parameter"),
            (["--param", "x"], r"--param x: expected method.name=value"),
            (["--methods", "bogus"], r"--methods: unknown method 'bogus'")):
        g = list(gen)
        for flag in ("--methods", "--steps"):  # given again in `flags`
            if flag in flags:
                i = g.index(flag)
                del g[i:i + 2]
        case("generate " + " ".join(flags), g + flags, pattern=pat)
    case("generate --steps beyond a 64-bit integer", base[:-3] + ["--quiet", "--prompt", prompt, "--steps",
         "99999999999999999999999"],
         rc={1}, pattern=r"--steps")

    # prompts: too short for a window, longer than the context (no hang: the BPE merges were
    # O(n^2)), not UTF-8, terminal escapes
    case("generate: 2-token prompt (default window 0)", base + ["--prompt", "Once"],
         pattern=r"--compress-at: the default window W = floor\(N/8\) is 0 positions at N = 2")
    case("generate: 120 KB prompt (no hang)", base + ["--prompt", "ab " * 40000],
         pattern=r"--prompt: \d+ tokens with BOS .* positions exceed the model's context seq_len 512")
    case("generate: non-UTF-8 prompt and --json path", base + ["--prompt", b"Once upon a \xff\xfe time there was",
         "--json", b"gen\xff.json"], rc=0,
         check=lambda out: None if json.load(open(b"gen\xff.json"))["format"] == "kvscope-generate/1"
         else "no report")
    case("generate: escape sequences in the prompt", base + ["--prompt", "Once \x1b[2J upon a time there was"],
         rc=0, check=lambda out: "raw ESC printed" if "\x1b" in out else None)

    # --continuation files
    if not os.path.exists("gen.fifo"):
        os.mkfifo("gen.fifo")
    os.makedirs("gen_dir", exist_ok=True)
    for label, path, pat in (("FIFO (no hang)", "gen.fifo", r"--continuation gen.fifo: is a FIFO"),
                             ("directory", "gen_dir", r"--continuation gen_dir: is a directory"),
                             ("device", "/dev/zero", r"--continuation /dev/zero: is a device"),
                             ("missing", "no_such.txt", r"--continuation no_such.txt: cannot open")):
        case(f"generate --continuation {label}", gen + ["--continuation", path], pattern=pat)
    write("cont_2mb.txt", b"a" * (2 << 20))
    case("generate --continuation of 2 MiB", gen + ["--continuation", "cont_2mb.txt"],
         pattern=r"2097152 bytes, more than the 1 MiB limit")
    write("cont_1mb.txt", b" and then they played together." * 33000)
    case("generate --continuation of 1 MiB (truncated, no hang)", gen + ["--continuation", "cont_1mb.txt"],
         rc=0, pattern=r"note: the continuation is truncated to the model's context of 512 positions")
    write("cont_bad_utf8.txt", b" she \xff\xfe saw a \xc3 dog")
    case("generate --continuation not UTF-8", gen + ["--continuation", "cont_bad_utf8.txt"], rc=0,
         pattern=r"continuation: \d+ tokens scored")

    # --model: missing, not a regular file, garbage, truncated, absurd sizes, NaN weights
    ok_model = open(model, "rb").read()
    header = list(LLAMA2C_HEADER.unpack_from(ok_model))
    write("m_garbage.bin", bytes((i * 7919 + 13) % 251 for i in range(1000)))
    write("m_trunc.bin", ok_model[:100000])
    write("m_trunc20.bin", ok_model[:20])
    write("m_trailing.bin", ok_model + b"\0\0\0\0")
    write("m_ak42.bin", struct.pack("<I", 0x616B3432) + ok_model[4:])
    write("m_absurd.bin", LLAMA2C_HEADER.pack(65536, 262144, 1024, 32768, 32768, 4194304, 1048576) + bytes(64))
    write("m_neg_vocab.bin", LLAMA2C_HEADER.pack(*header[:5], -header[5], header[6]) + ok_model[28:])
    write("m_zero_heads.bin", LLAMA2C_HEADER.pack(header[0], header[1], header[2], 0, 0, header[5], header[6]) + ok_model[28:])
    nan_model = bytearray(ok_model)
    nan_model[28 + 4 * 1000:28 + 4 * 1001] = struct.pack("<f", float("nan"))
    write("m_nan.bin", bytes(nan_model))
    for label, path, pat in (
            ("missing", "no_such.bin", r"no_such.bin: cannot open llama2.c checkpoint: no such file"),
            ("FIFO (no hang)", "gen.fifo", r"gen.fifo: cannot open llama2.c checkpoint: not a regular file"),
            ("directory", "gen_dir", r"gen_dir: cannot open llama2.c checkpoint: not a regular file"),
            ("device", "/dev/zero", r"/dev/zero: cannot open llama2.c checkpoint: not a regular file"),
            ("garbage", "m_garbage.bin", r"m_garbage.bin: bad llama2.c Config header"),
            ("truncated", "m_trunc.bin", r"m_trunc.bin: truncated or config mismatch: the file has 100000 bytes"),
            ("truncated in the header", "m_trunc20.bin", r"20 bytes, shorter than the 28-byte Config header"),
            ("trailing bytes", "m_trailing.bin", r"trailing bytes or config mismatch"),
            ("version 1/2 export", "m_ak42.bin", r"version 1/2 export"),
            ("absurd sizes", "m_absurd.bin", r"m_absurd.bin: truncated or config mismatch: the file has 92 bytes"),
            ("unshared classifier claimed", "m_neg_vocab.bin", r"truncated or config mismatch"),
            ("zero heads", "m_zero_heads.bin", r"n_heads must be in \[1, dim\]"),
            ("NaN weight", "m_nan.bin", r"m_nan.bin: checkpoint weights contain NaN or Inf")):
        g = list(gen)
        g[g.index("--model") + 1] = path
        case(f"generate --model {label}", g, pattern=pat, mem_mb=1024)

    # --tokenizer: missing, FIFO, another model's, truncated, bad header, NaN score
    ok_tok = open(tok, "rb").read()
    write("t_trunc.bin", ok_tok[:3000])
    write("t_bad_max.bin", struct.pack("<i", -7) + ok_tok[4:])
    nan_tok = bytearray(ok_tok)
    nan_tok[4:8] = struct.pack("<f", float("nan"))
    write("t_nan.bin", bytes(nan_tok))
    for label, path, pat in (
            ("missing", "no_such_tok.bin", r"no_such_tok.bin: cannot open llama2.c tokenizer: no such file"),
            ("FIFO (no hang)", "gen.fifo", r"gen.fifo: cannot open llama2.c tokenizer: not a regular file"),
            ("of another vocabulary", tok1024, r"bytes left after 512 tokens: the tokenizer does not match"),
            ("truncated", "t_trunc.bin", r"t_trunc.bin: token \d+ of 512 .*truncated"),
            ("bad max_token_length", "t_bad_max.bin", r"bad tokenizer header: max_token_length -7"),
            ("NaN score", "t_nan.bin", r"t_nan.bin: token 0 of 512 .*score is NaN or Inf")):
        if not os.path.exists(path) and path == tok1024:
            continue
        g = list(gen)
        g[g.index("--tokenizer") + 1] = path
        case(f"generate --tokenizer {label}", g, pattern=pat)

    # --json: never over an input, a link's target, a FIFO, a device or a directory
    shutil.copy(model, "g_model.bin")
    shutil.copy(tok, "g_tok.bin")
    write("g_cont.txt", b" and they played.")
    before = {p: sha(p) for p in ("g_model.bin", "g_tok.bin", "g_cont.txt")}
    unchanged = lambda out: None if all(sha(p) == h for p, h in before.items()) else "an input was modified"
    local = ["generate", "--model", "g_model.bin", "--tokenizer", "g_tok.bin", "--methods", "uniform",
             "--steps", "4", "--quiet", "--prompt", prompt, "--continuation", "g_cont.txt"]
    for label, path in (("--model", "g_model.bin"), ("--tokenizer", "g_tok.bin"),
                        ("--continuation", "g_cont.txt"), ("--model via ./", "./g_model.bin")):
        case(f"generate --json over its {label}", local + ["--json", path], pattern=r"is the input file",
             check=unchanged)
    os.link("g_model.bin", "g_model_hardlink.json")
    case("generate --json over a hard link of --model", local + ["--json", "g_model_hardlink.json"],
         pattern=r"is the input file", check=unchanged)
    write("g_target.json", b"keep me\n")
    os.symlink("g_target.json", "g_link.json")
    case("generate --json over a symlink", local + ["--json", "g_link.json"], pattern=r"symbolic link",
         check=lambda out: None if (os.path.islink("g_link.json") and open("g_target.json").read() == "keep me\n")
         else "the link or its target changed")
    os.symlink("g_model.bin", "g_model_link.json")
    case("generate --json over a symlink to --model", local + ["--json", "g_model_link.json"],
         pattern=r"symbolic link|is the input file", check=unchanged)
    case("generate --json FIFO (no hang)", local + ["--json", "gen.fifo"], pattern=r"FIFO",
         check=lambda out: None if stat.S_ISFIFO(os.lstat("gen.fifo").st_mode) else "the FIFO was replaced")
    case("generate --json /dev/null", local + ["--json", "/dev/null"], pattern=r"device",
         check=lambda out: None if stat.S_ISCHR(os.stat("/dev/null").st_mode) else "/dev/null replaced")
    case("generate --json a directory", local + ["--json", "gen_dir"], pattern=r"directory")
    write("g_report.json", b"previous report\n")
    case("generate: failed run leaves the old --json intact", ["generate", "--model", "m_trunc.bin",
         "--tokenizer", tok, "--prompt", prompt, "--json", "g_report.json"], pattern=r"truncated",
         check=lambda out: None if open("g_report.json").read() == "previous report\n" else "g_report.json changed")
    if os.path.exists("/dev/full"):
        case("generate > /dev/full", gen, stdout_path="/dev/full", pattern=r"writing to standard output failed")
        case("generate --json - > /dev/full", gen + ["--json", "-"], stdout_path="/dev/full",
             pattern=r"standard output failed")



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sanitized", action="store_true")
    ap.add_argument("--models", default="", help="folder with stories260K.bin and tok512.bin")
    ap.add_argument("--only", default="", help="regex: run only matching cases")
    a = ap.parse_args()
    cli = os.path.abspath(a.cli)
    models_dir = os.path.abspath(a.models) if a.models else ""
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.chdir(work)
    r = Runner(cli, work, a.sanitized)
    only = re.compile(a.only) if a.only else None
    case = r.case
    if only:
        def case(name, *args, **kw):  # noqa: E306
            if only.search(name):
                r.case(name, *args, **kw)

    # ---- valid inputs the hostile ones are made from
    entries, data, meta = capture_tensors()
    write("ok.safetensors", st_bytes(header_text(entries, meta), data))
    case("valid capture opens", ["info", "ok.safetensors"], rc=0, pattern=r"layers\s+2")

    # ---- 1. crashes: deep JSON, tiny captures
    deep = 100000
    write("deep_header.safetensors", st_bytes('{"a": ' + "[" * deep + "]" * deep + "}"))
    case("deep JSON in safetensors header", ["info", "deep_header.safetensors"],
         pattern=r"nesting deeper than 16 levels \(limit\)")
    write("deep_metadata.npz", zip_bytes([("metadata.json", ("[" * deep + "]" * deep).encode(), 8, None)]))
    case("deep JSON in npz metadata.json", ["info", "deep_metadata.npz"],
         pattern=r"metadata.json: nesting deeper than 16 levels \(limit\)")
    deep_tokens = dict(meta, tokens="[" * deep + "]" * deep)
    write("deep_tokens.safetensors", st_bytes(header_text(entries, deep_tokens), data))
    case("deep JSON in the tokens entry", ["info", "deep_tokens.safetensors"],
         pattern=r"tokens")
    e4, d4, m4 = capture_tensors(n=4)
    write("tiny.safetensors", st_bytes(header_text(e4, m4), d4))
    case("4-token capture: info", ["info", "tiny.safetensors"], rc=0, pattern=r"tokens\s+4")
    case("4-token capture: eval with defaults is refused", ["eval", "tiny.safetensors",
         "--methods", "uniform", "--seeds", "1"], pattern=r"--eval: .*E = floor\(n/8\) = 0")
    case("4-token capture: eval --eval 1 runs", ["eval", "tiny.safetensors", "--methods",
         "uniform,exact", "--seeds", "1", "--eval", "1"], rc=0, pattern=r"uniform")
    case("--sink beyond a short capture", ["eval", "tiny.safetensors", "--sink", "200"],
         pattern=r"--sink/--eval|E = floor\(n/8\) = 0")

    # ---- 2. files and hangs: FIFO, directory, device, shrinking files
    os.mkfifo("fifo.safetensors")
    case("FIFO as the capture (no hang)", ["info", "fifo.safetensors"], pattern=r"FIFO")
    case("FIFO as a merge report (no hang)", ["merge", "fifo.safetensors"], pattern=r"not a regular file")
    os.mkdir("dir.safetensors")
    case("directory as the capture", ["info", "dir.safetensors"], pattern=r"directory")
    case("device as the capture", ["info", "/dev/zero"], pattern=r"device")
    case("bench --n 900000000 is refused", ["bench", "--backend", "cpu", "--n", "900000000"],
         pattern=r"--n 900000000: must be between 2 and 16777216")
    case("bench beyond memory: the estimate", ["bench", "--backend", "cpu", "--n", "16777216",
         "--d", "65536"], pattern=r"needs about [0-9.]+ GiB of memory", mem_mb=1024)
    case("synth beyond memory: the estimate", ["synth", "--tokens", "4194304", "--out",
         "big.safetensors", "--quiet"], pattern=r"needs about [0-9.]+ GiB of memory", mem_mb=1024,
         check=lambda out: "big.safetensors was created" if os.path.exists("big.safetensors") else None)
    case("synth --tokens beyond the reader's limit", ["synth", "--tokens", "20000000", "--out",
         "x.safetensors"], pattern=r"--tokens 20000000: must be between 2 and 4194304")

    # A capture truncated while kvscope-cli reads it: exit 0 (read before) or 1 with the message,
    # never a signal. (The deterministic version is in tests/test_capture_io.cpp.)
    rc, out, _ = r.run(["synth", "--shape", "small", "--tokens", "150000", "--dtype", "f32",
                        "--out", "shrinking.safetensors", "--quiet"])
    if rc == 0:
        import threading
        for delay in (0.02, 0.08, 0.2):
            shutil.copy("shrinking.safetensors", "shrink_now.safetensors")
            timer = threading.Timer(delay, lambda: os.truncate("shrink_now.safetensors", 4096))
            timer.start()
            case(f"capture truncated after {delay}s while read", ["info", "--check", "shrink_now.safetensors"],
                 rc={0, 1}, check=lambda out: None if ("error" not in out or re.search(
                     r"shrank or was rewritten|exceeds the file|out of range|truncated", out)) else "unclear error")
            timer.join()
    else:
        r.failures.append("making shrinking.safetensors: " + out[-300:])

    # ---- 3. runaway memory: bombs, huge headers, huge counts and ranges
    bomb = deflate_stream_of_zeros(256 << 20)
    write("bomb.npz", zip_with_raw_member("layers.0.key.npy", bomb, 256 << 20))
    case("deflate bomb (256 MiB from %d KiB)" % (len(bomb) >> 10), ["info", "bomb.npz"],
         pattern=r"ratio beyond the limit of 100:1", mem_mb=512)
    write("claims_4g.npz", zip_with_raw_member("layers.0.key.npy", bomb, 0xFFFFFFF0))
    case("member claiming 4 GiB", ["info", "claims_4g.npz"], pattern=r"limit", mem_mb=512)
    meta_blob = b'{"model": "' + b"A" * (120 << 20) + b'"}'
    write("big_metadata.npz", zip_bytes([("metadata.json", meta_blob, 8, None)]))
    del meta_blob
    case("120 MiB metadata.json", ["info", "big_metadata.npz"], pattern=r"limit", mem_mb=768)
    big_array = "[" + "0," * (8 << 20) + "0]"
    write("big_header.safetensors", st_bytes('{"a": ' + big_array + "}"))
    del big_array
    case("16 MB JSON array header", ["info", "big_header.safetensors"],
         pattern=r"more than \d+ values \(limit\)", mem_mb=1024)
    for key, value in (("num_layers", "5000000"), ("kv_heads", "2000000"), ("q_heads", "99999999999999999999"),
                       ("head_dim", "1000000")):
        m = dict(meta, **{key: value})
        write(f"huge_{key}.safetensors", st_bytes(header_text(entries, m), data))
        case(f"metadata {key} = {value}", ["info", f"huge_{key}.safetensors"],
             pattern=re.escape(f'"{key}"') + r" = \d+ exceeds the limit of \d+", mem_mb=1024)
    many = ", ".join(f'"x{i}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'
                     for i in range(100000))
    write("many_tensors.safetensors", st_bytes('{"__metadata__": {}, ' + many + "}"))
    case("100k tensor names", ["info", "many_tensors.safetensors"],
         pattern=r"100000 tensors, more than the limit of 65536", mem_mb=1024)
    m = dict(meta, tokens=json.dumps([""] * 5000000))
    write("many_tokens.safetensors", st_bytes(header_text(entries, m), data))
    case("5M token strings", ["info", "many_tokens.safetensors"], pattern=r"limit", mem_mb=1024)
    case("--layers 0-2147483647", ["eval", "ok.safetensors", "--layers", "0-2147483647"],
         pattern=r"--layers: layer 2 out of range: the capture has layers 0..1", mem_mb=1024)
    case("--heads 0-100000000", ["eval", "ok.safetensors", "--heads", "0-100000000"],
         pattern=r"--heads: kv head 2 out of range: the capture has kv heads 0..1", mem_mb=1024)
    case("--layers 0,0 (duplicate)", ["eval", "ok.safetensors", "--layers", "0,0"],
         pattern=r"given twice")

    # shard reports for merge (made by the CLI itself)
    base = ["eval", "ok.safetensors", "--methods", "uniform", "--seeds", "1", "--ratios", "0.5"]
    for i in range(2):
        rc, out, _ = r.run(base + ["--shard", f"{i}/2", "--json", f"s{i}.json"])
        if rc != 0:
            print(out)
            r.failures.append(f"making shard report {i}/2")
    if os.path.exists("s0.json"):
        s0 = json.load(open("s0.json"))
        case("merge of two valid shards", ["merge", "s0.json", "s1.json", "--quiet", "--json", "merged.json"], rc=0)

        def variant(name, fn):
            j = json.loads(json.dumps(s0))
            fn(j)
            json.dump(j, open(name, "w"))
        variant("s_claims_2e9.json", lambda j: j["spec"].update(shard_count=2000000000))
        case("merge: report claiming 2e9 shards", ["merge", "s_claims_2e9.json"],
             pattern=r'"spec.shard_count": 2000000000 is outside \[1, 100000\]', mem_mb=1024)
        variant("s_neg.json", lambda j: j["spec"].update(shard_count=-2))
        case("merge: negative shard count", ["merge", "s_neg.json"],
             pattern=r'"spec.shard_count": -2 is outside \[1, 100000\]')
        variant("s5.json", lambda j: j["spec"].update(shard_index=5))
        case("merge: shards 0/2, 1/2 and 5/2", ["merge", "s0.json", "s1.json", "s5.json"],
             pattern=r'"spec.shard_index": 5 is outside \[0, 1\]')
        variant("s_huge_list.json", lambda j: j["spec"].update(layers=[0] * 3000000))
        case("merge: report with a 3M-entry list", ["merge", "s_huge_list.json"],
             pattern=r"more layers or heads than the capture has", mem_mb=1536)
        variant("s_many_results.json", lambda j: j.update(results=j["results"] * 1000))
        case("merge: more results than work items", ["merge", "s_many_results.json"],
             pattern=r"more than the spec's \d+ work items", mem_mb=1536)
        with open("s_deep.json", "w") as f:
            f.write("[" * deep + "]" * deep)
        case("merge: deeply nested report", ["merge", "s_deep.json"], pattern=r"nesting deeper")
        with open("s_dup.json", "w") as f:
            f.write('{"format": "kvscope-eval/1", "format": "x"}')
        case("merge: duplicate keys in a report", ["merge", "s_dup.json"], pattern=r'duplicate key "format"')

    # ---- 4. data loss: outputs over inputs, links, FIFOs, devices; full disks
    before = sha("ok.safetensors")
    case("eval FILE --json FILE", ["eval", "ok.safetensors", "--methods", "uniform", "--seeds", "1",
         "--json", "ok.safetensors"], pattern=r"is the input file",
         check=lambda out: None if sha("ok.safetensors") == before else "the capture was modified")
    os.link("ok.safetensors", "hardlink.safetensors")
    case("eval --csv over a hard link of the input", ["eval", "ok.safetensors", "--methods", "uniform",
         "--seeds", "1", "--csv", "hardlink.safetensors"], pattern=r"is the input file",
         check=lambda out: None if sha("ok.safetensors") == before else "the capture was modified")
    write("target.json", b"keep me\n")
    os.symlink("target.json", "link.json")
    case("--json over a symlink", ["eval", "ok.safetensors", "--methods", "uniform", "--seeds", "1",
         "--json", "link.json"], pattern=r"symbolic link",
         check=lambda out: None if (os.path.islink("link.json") and open("target.json").read() == "keep me\n")
         else "the link or its target changed")
    os.mkfifo("out.fifo")
    case("embed --out FIFO (no hang)", ["embed", "ok.safetensors", "--layer", "0", "--head", "0",
         "--method", "pca", "--out", "out.fifo"], pattern=r"FIFO",
         check=lambda out: None if stat.S_ISFIFO(os.lstat("out.fifo").st_mode) else "the FIFO was replaced")
    case("--json /dev/null (a device)", ["eval", "ok.safetensors", "--methods", "uniform", "--seeds",
         "1", "--json", "/dev/null"], pattern=r"device",
         check=lambda out: None if stat.S_ISCHR(os.stat("/dev/null").st_mode) else "/dev/null replaced")
    os.symlink("ok.safetensors", "link.safetensors")
    case("synth --out over a symlink", ["synth", "--shape", "small", "--tokens", "64", "--out",
         "link.safetensors", "--quiet"], pattern=r"symbolic link",
         check=lambda out: None if sha("ok.safetensors") == before else "the link target was modified")
    write("report.json", b"previous report\n")
    write("truncated.safetensors", open("ok.safetensors", "rb").read()[:300])
    case("failed run leaves the old --json intact", ["eval", "truncated.safetensors", "--json",
         "report.json"], pattern=r"truncated|exceeds the file",
         check=lambda out: None if open("report.json").read() == "previous report\n" else "report.json changed")
    bad_name = b"\xff\xfebad.safetensors"
    shutil.copy("ok.safetensors", bad_name)
    case("non-UTF-8 capture path and --json path", ["eval", bad_name, "--methods", "uniform",
         "--seeds", "1", "--json", b"\xffreport.json"], rc=0,
         check=lambda out: None if json.load(open(b"\xffreport.json"))["capture"]["path"] else "no path")
    case("non-UTF-8 capture path: info", ["info", bad_name], rc=0, pattern=r"\\xff\\xfebad")
    if os.path.exists("/dev/full"):
        case("info > /dev/full", ["info", "ok.safetensors"], stdout_path="/dev/full",
             pattern=r"writing to standard output failed")
        case("eval --json - > /dev/full", ["eval", "ok.safetensors", "--methods", "uniform", "--seeds",
             "1", "--json", "-"], stdout_path="/dev/full", pattern=r"standard output failed")
    models = models_dir
    if models and os.path.exists(os.path.join(models, "stories260K.bin")):
        case("capture with a non-UTF-8 prompt", ["capture", "--model", os.path.join(models, "stories260K.bin"),
             "--tokenizer", os.path.join(models, "tok512.bin"), "--prompt", b"Once \xff\xfe upon",
             "--steps", "24", "--quiet", "--out", "prompt.safetensors"], rc=0)
        case("capture with a non-UTF-8 prompt: info", ["info", "prompt.safetensors"], rc=0,
             pattern=r"tokens\s+24")
        case("capture --steps 4 then eval --eval 1", ["capture", "--model",
             os.path.join(models, "stories260K.bin"), "--tokenizer", os.path.join(models, "tok512.bin"),
             "--steps", "4", "--quiet", "--out", "steps4.safetensors"], rc=0)
        case("4-token capture from the model: eval --eval 1", ["eval", "steps4.safetensors", "--methods",
             "uniform,exact", "--seeds", "1", "--eval", "1"], rc=0, pattern=r"n=4 s=0 E=1")
        shutil.copy(os.path.join(models, "stories260K.bin"), "model.safetensors")
        model_sha = sha("model.safetensors")
        case("capture --out over its own --model", ["capture", "--model", "model.safetensors",
             "--tokenizer", os.path.join(models, "tok512.bin"), "--steps", "4", "--out",
             "model.safetensors"], pattern=r"is the input file",
             check=lambda out: None if sha("model.safetensors") == model_sha else "the model was modified")
        generate_cases(case, r, models)
    else:
        print("skip capture and generate cases: no stories260K.bin/tok512.bin under --models")

    # ---- 5. numbers: huge values, flag ranges
    for label, big in (("1e20", 1e20), ("FLT_MAX", 3.4028234663852886e38)):
        fill = (lambda big_: (lambda L, kind, i: big_ if (kind == "key" and L == 0 and i == 5) else
                              ((i * 7919) % 997) / 997.0 - 0.5))(big)
        e5, d5, m5 = capture_tensors(fill=fill)
        name = f"big_{label}.safetensors"
        write(name, st_bytes(header_text(e5, m5), d5))
        case(f"keys of magnitude {label}: eval", ["eval", name, "--methods", "uniform,exact",
             "--seeds", "1"], rc={0, 1, 2}, pattern=r"magnitude [0-9.e+]+ at token 0, channel 5",
             check=lambda out: "inf/nan printed as a figure" if re.search(r"\b(inf|nan)\b", out) else None)
        case(f"keys of magnitude {label}: info --check", ["info", "--check", name],
             pattern=r"kv head 0 has magnitude")
        case(f"keys of magnitude {label}: embed", ["embed", name, "--layer", "0", "--head", "0",
             "--method", "pca", "--out", "e.csv"], pattern=r"refused|magnitude",
             check=lambda out: "e.csv written" if os.path.exists("e.csv") else None)
    for flags, pat in ((["--sink", "-5"], r"--sink -5: must be between 0 and 4194304"),
                       (["--eval", "0"], r"--eval 0: must be between 1 and 4194304"),
                       (["--sink", "60", "--eval", "10"], r"--sink/--eval: s \+ E = 60 \+ 10 exceeds"),
                       (["--seeds", "0"], r"--seeds 0: must be between 1 and 100000"),
                       (["--seeds", "1000000000"], r"--seeds 1000000000: must be between 1 and 100000"),
                       (["--threads", "-1"], r"--threads -1: must be between 0 and 1024"),
                       (["--base-seed", "-1"], r"--base-seed: '-1' must be an integer between 0 and 18446744073709551615"),
                       (["--ratios", "nan"], r"--ratios: 'nan' is not a number"),
                       (["--ratios", "2"], r"--ratios: keep ratio 2 is not in \(0, 1\]"),
                       (["--shard", "-1/2"], r"-1/2"),
                       (["--shard", "2/2"], r"--shard '2/2': expected i/N with 0 <= i < N <= 100000"),
                       (["--shard", "0/0"], r"--shard '0/0': expected i/N"),
                       (["--shard", "0/99999999999"], r"--shard '0/99999999999': expected i/N"),
                       (["--shard", "1"], r"--shard '1': expected i/N")):
        case("eval " + " ".join(flags), ["eval", "ok.safetensors", "--methods", "uniform"] + flags,
             rc={1}, pattern=pat)
    for flags, pat in ((["--repeat", "0"], r"--repeat 0: must be between 1 and 10000"),
                       (["--d", "0"], r"--d 0: must be between 1 and 65536"),
                       (["--heads", "-3"], r"--heads -3: must be between 1 and 4096"),
                       (["--block", "1"], r"--block 1: must be between 2 and 4096")):
        case("bench " + " ".join(flags), ["bench", "--backend", "cpu"] + flags, pattern=pat)
    case("embed --iterations -1", ["embed", "ok.safetensors", "--layer", "0", "--head", "0",
         "--out", "e2.csv", "--iterations", "-1"], pattern=r"--iterations -1: must be between 0")
    case("embed --perplexity nan", ["embed", "ok.safetensors", "--layer", "0", "--head", "0",
         "--out", "e2.csv", "--perplexity", "nan"], rc={1}, pattern=r"perplexity")
    case("synth --layers -1", ["synth", "--tokens", "64", "--layers", "-1", "--out", "s.safetensors"],
         pattern=r"--layers -1: must be between 1 and 4096")

    # ---- 6. refused: duplicate keys
    dup_tensor = header_text(entries, meta, extra_entries_text=', "layers.0.key": ' + json.dumps(
        {"dtype": "F32", "shape": entries[0][1], "data_offsets": [entries[0][2], entries[0][3]]}))
    write("dup_tensor.safetensors", st_bytes(dup_tensor, data))
    case("duplicate tensor names", ["info", "dup_tensor.safetensors"],
         pattern=r'duplicate key "layers.0.key"')
    dup_meta = header_text(entries, meta, extra_meta_text=', "num_layers": "1"')
    write("dup_meta.safetensors", st_bytes(dup_meta, data))
    case("duplicate __metadata__ keys", ["info", "dup_meta.safetensors"],
         pattern=r'duplicate key "num_layers"')
    npz_meta = json.dumps(meta)[:-1] + ', "model": "other"}'
    members = [("metadata.json", npz_meta.encode(), 0, None)]
    write("dup_meta.npz", zip_bytes(members))
    case("duplicate keys in npz metadata.json", ["info", "dup_meta.npz"], pattern=r'duplicate key "model"')

    # ---- 7. messages: terminal escapes, limits named
    m = dict(meta, model="\x1b[31mRED\x1b]0;title\x07", source="a\rb\x9bc")
    write("escape.safetensors", st_bytes(header_text(entries, m), data))
    case("escape sequences in metadata: info", ["info", "escape.safetensors"], rc=0,
         pattern=r"\\x1b\[31mRED",
         check=lambda out: "raw control character printed" if re.search(r"[\x1b\x07\r\x9b]", out) else None)
    m = dict(meta, format="\x1b[2Jkvscope/2")
    write("escape_error.safetensors", st_bytes(header_text(entries, m), data))
    case("escape sequences in an error message", ["info", "escape_error.safetensors"],
         pattern=r"\\x1b\[2J", check=lambda out: "raw ESC printed" if "\x1b" in out else None)
    huge_dim = '{"__metadata__": {}, "t": {"dtype": "F32", "shape": [4294967296, 4294967296, 4], "data_offsets": [0, 16]}}'
    write("huge_dims.safetensors", st_bytes(huge_dim, bytes(16)))
    case("shape of 2^66 elements", ["info", "huge_dims.safetensors"], pattern=r"limit")

    print(f"\n{r.passed} passed, {len(r.failures)} failed")
    if r.failures:
        print("failed: " + ", ".join(r.failures))
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())

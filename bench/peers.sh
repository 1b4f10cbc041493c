#!/usr/bin/env bash
# KVScope against its peers, in one command and one run, interleaved (A B A B ...) so that load
# from other processes hits both sides alike. Reports CPU time (user + system of the process, from
# /usr/bin/time or the peer's own process clock), which a shared machine disturbs far less than
# wall time; wall time is printed alongside. Figures go to docs/performance.md.
#
#   1. evaluation: bench/peer_eval.py (the same exact attention and scoring in torch float32)
#      vs `kvscope-cli eval` on one synthetic Llama-3-8B layer (8192 tokens, uniform, ratios
#      0.5/0.25/0.125, 3 seeds), plus `kvscope-cli eval --methods all` on a sample capture;
#   2. t-SNE: scikit-learn's TSNE (Barnes-Hut, OMP_WAIT_POLICY=passive) vs `kvscope-cli embed`
#      on 32768 synthetic keys (d = 128), 1000 iterations, with trustworthiness and peak memory;
#   3. the walk: bench/torch_walk.py (the authors' walk in torch, CPU, one thread) vs
#      `kvscope-cli bench` (n = 8192, 2 rounds; per-walk CPU times).
#
# Needs (Debian, not in CI): python3-torch, libopenblas0-pthread, python3-sklearn, and a built
# kvscope-cli (KVSCOPE_CLI, default build/kvscope-cli). Usage:
#   bench/peers.sh [--reps 3] [--threads 2] [--only eval|tsne|walk] [--tsne-points 32768]
set -euo pipefail
cd "$(dirname "$0")/.."

CLI=${KVSCOPE_CLI:-build/kvscope-cli}
PY=${PYTHON:-/usr/bin/python3}  # Debian's python, where python3-torch and python3-sklearn live
REPS=3
THREADS=2
ONLY=""
TSNE_POINTS=32768
while (($#)); do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --tsne-points) TSNE_POINTS=$2; shift 2 ;;
    *) echo "peers.sh: unknown argument '$1' (see the header)" >&2; exit 2 ;;
  esac
done
[ -x "$CLI" ] || { echo "peers.sh: $CLI not built (cmake --build build --target kvscope-cli)" >&2; exit 1; }
"$PY" -c "import torch" 2>/dev/null || { echo "peers.sh: $PY has no torch (apt install python3-torch libopenblas0-pthread)" >&2; exit 1; }

WORK=${PEERS_WORK:-$(mktemp -d /tmp/kvscope_peers.XXXXXX)}
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
echo "peers: $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "peers: load average $(cut -d' ' -f1-3 /proc/loadavg); kvscope SIMD: ${KVSCOPE_SIMD:-auto}; work dir $WORK"

# CPU seconds (user + sys), wall seconds and peak RSS (MiB) of a command; its stdout to $2.
timed() {
  local label=$1 out=$2
  shift 2
  /usr/bin/time -f "%U %S %e %M" -o "$WORK/time.txt" "$@" >"$out" 2>"$WORK/stderr.txt" || {
    echo "peers.sh: $label failed:" >&2
    cat "$WORK/stderr.txt" >&2
    exit 1
  }
  read -r user sys wall rss <"$WORK/time.txt"
  # awk, not bc: bare machines (the GPU hosts) have no bc.
  awk -v l="$label" -v u="$user" -v s="$sys" -v w="$wall" -v m="$rss" \
    'BEGIN { printf "%-34s cpu %7.2f s  wall %7.2f s  peak %6.0f MiB\n", l, u + s, w, m / 1024 }'
}

if [ -z "$ONLY" ] || [ "$ONLY" = eval ]; then
  echo
  echo "== 1. evaluation: one Llama-3-8B layer (synthetic), 8192 tokens, uniform, 3 ratios x 3 seeds"
  LAYER=$WORK/llama3_8192.safetensors
  [ -f "$LAYER" ] || "$CLI" synth --shape llama3-8b --tokens 8192 --layers 1 --dtype f32 --quiet --out "$LAYER" >/dev/null
  for r in $(seq "$REPS"); do
    timed "torch float32 (peer_eval.py) #$r" "$WORK/peer_eval.json" \
      "$PY" bench/peer_eval.py "$LAYER" --layer 0 --ratios 0.5,0.25,0.125 --seeds 3 --threads "$THREADS"
    echo "    $(cat "$WORK/peer_eval.json")"
    timed "kvscope-cli eval #$r" "$WORK/kvscope_eval.txt" \
      "$CLI" eval "$LAYER" --methods uniform --ratios 0.5,0.25,0.125 --seeds 3 --threads "$THREADS" \
      --json "$WORK/kvscope_eval.json"
    echo "    kvscope mean relative: $("$PY" -c "import json,sys; j=json.load(open('$WORK/kvscope_eval.json')); print({str(s['ratio']): round(s['mean'],6) for s in j['summary']})")"
  done
  echo
  echo "== 1b. kvscope-cli eval --methods all on a sample capture (ratios 0.5/0.25/0.125, 10 seeds)"
  for r in $(seq "$REPS"); do
    timed "kvscope-cli eval all methods #$r" "$WORK/all.txt" \
      "$CLI" eval sample_data/stories260K_lily.safetensors --methods all --ratios 0.5,0.25,0.125 \
      --seeds 10 --threads "$THREADS"
  done
fi

if [ -z "$ONLY" ] || [ "$ONLY" = tsne ]; then
  echo
  echo "== 2. t-SNE: $TSNE_POINTS synthetic keys (one kv head, d = 128), perplexity 30, 1000 iterations"
  KEYS=$WORK/keys_$TSNE_POINTS.safetensors
  [ -f "$KEYS" ] || "$CLI" synth --shape llama3-8b --tokens "$TSNE_POINTS" --layers 1 --dtype f32 --quiet --out "$KEYS" >/dev/null
  for r in $(seq "$REPS"); do
    timed "scikit-learn TSNE (Barnes-Hut) #$r" "$WORK/sk.txt" \
      "$PY" bench/peer_tsne.py "$KEYS" --layer 0 --head 0 --threads "$THREADS" --out "$WORK/sk.csv"
    timed "kvscope-cli embed (automatic) #$r" "$WORK/kv.txt" \
      "$CLI" embed "$KEYS" --layer 0 --head 0 --out "$WORK/kv.csv"
    grep -h "tsne:" "$WORK/kv.txt" | sed 's/^/    /'
    timed "kvscope-cli embed (Barnes-Hut 0.5) #$r" "$WORK/kvbh.txt" \
      "$CLI" embed "$KEYS" --layer 0 --head 0 --theta 0.5 --out "$WORK/kvbh.csv"
  done
  echo "    trustworthiness (k = 10, on a fixed random subsample of 5000 points):"
  "$PY" bench/peer_tsne.py "$KEYS" --layer 0 --head 0 --trust "$WORK/sk.csv" "$WORK/kv.csv" "$WORK/kvbh.csv"
fi

if [ -z "$ONLY" ] || [ "$ONLY" = walk ]; then
  echo
  # One core for both sides (the walk target is per core): torch with one intra-op thread, and
  # the per-walk CPU times each side reports (torch_walk_cpu_ms, "thread CPU time median").
  echo "== 3. the walk: one head, n = 8192, d = 128, B = 128, 2 rounds, one thread, on the CPU"
  for r in $(seq "$REPS"); do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timed "torch walk (torch_walk.py) #$r" "$WORK/tw.json" \
      "$PY" bench/torch_walk.py --device cpu --heads 1 --tokens 8192 --rounds 2 --reps 5 --warmup 1
    echo "    $(tail -1 "$WORK/tw.json")"
    timed "kvscope-cli bench #$r" "$WORK/kb.txt" \
      "$CLI" bench --backend cpu --n 8192 --heads 1 --rounds 2 --repeat 9
    grep -A1 "authors' walk" "$WORK/kb.txt" | tail -1 | sed 's/^/    /'
  done
fi

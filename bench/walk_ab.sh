#!/usr/bin/env bash
# Compares two kvscope-cli builds on the CPU walk (n = 8192, d = 128, B = 128, 2 rounds, one
# thread), in the two ways that survive a machine whose speed drifts (shared VMs drift by up to
# 30% within minutes):
#   alternating: A, B, A, B, ... on one core;
#   concurrent:  A and B at once, each on its own core, cores swapped every pair.
# Prints every pair's medians (thread CPU time), the ratio B/A, and the geometric mean of the
# ratios with how many pairs B won.
#   bench/walk_ab.sh OLD_CLI NEW_CLI [PAIRS=6] [CORE_A=2] [CORE_B=3] [extra bench flags...]
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bench/walk_ab.sh OLD_CLI NEW_CLI [PAIRS] [CORE_A] [CORE_B] [bench flags...]" >&2
  exit 2
fi
A=$1 B=$2 PAIRS=${3:-6} CA=${4:-2} CB=${5:-3}
shift $(($# < 5 ? $# : 5))
for exe in "$A" "$B"; do
  [ -x "$exe" ] || { echo "walk_ab.sh: $exe is not an executable kvscope-cli" >&2; exit 2; }
done
case "$PAIRS" in '' | *[!0-9]*) echo "walk_ab.sh: PAIRS must be a positive integer, not '$PAIRS'" >&2; exit 2 ;; esac
for core in "$CA" "$CB"; do
  taskset -c "$core" true 2>/dev/null || { echo "walk_ab.sh: cannot pin to core '$core' (nproc: $(nproc))" >&2; exit 2; }
done
run() {  # core, binary, extra flags -> median thread CPU ms
  taskset -c "$1" "$2" bench --backend cpu --n 8192 --heads 1 --rounds 2 --repeat 30 "${@:3}" |
    sed -n 3p | sed 's/.*thread CPU time median *\([0-9.]*\) ms.*/\1/'
}
summary() {
  awk '{ print; s += log($3); n++; if ($3 < 1) w++ }
       END { if (n) printf "%s: geometric mean B/A %.3f, B faster in %d of %d pairs\n", mode, exp(s / n), w, n }' mode="$1"
}
echo "A = $A, B = $B; alternating on core $CA (A ms, B ms, B/A):"
for i in $(seq "$PAIRS"); do
  a=$(run "$CA" "$A" "$@")
  b=$(run "$CA" "$B" "$@")
  echo "$a $b $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')"
done | summary alternating
echo "concurrent on cores $CA and $CB (A ms, B ms, B/A):"
for i in $(seq "$PAIRS"); do
  if [ $((i % 2)) = 1 ]; then ca=$CA cb=$CB; else ca=$CB cb=$CA; fi
  run "$ca" "$A" "$@" >/tmp/walk_ab.$$.a &
  run "$cb" "$B" "$@" >/tmp/walk_ab.$$.b
  wait
  a=$(cat /tmp/walk_ab.$$.a) b=$(cat /tmp/walk_ab.$$.b)
  echo "$a $b $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')"
done | summary concurrent
rm -f /tmp/walk_ab.$$.a /tmp/walk_ab.$$.b

#!/usr/bin/env bash
# A capture set's evaluation against separate runs, and a Slurm array against one process
# (docs/performance.md, "Capture sets"). Not a test: it prints times and their ratios.
#
#   bench/set_eval.sh [BUILD] [PROMPTS]     (defaults: build, 16)
#
# 1. PROMPTS captures of kjv3M (KVSCOPE_BENCH_STEPS tokens each, default 512) with
#    `kvscope-cli capture --prompts`; eval flags KVSCOPE_BENCH_FLAGS (default --methods all
#    --ratios 0.5,0.25 --seeds 3); 2. the CPU time (user + system) of `eval SET` against the
#    sum over PROMPTS separate `eval FILE` runs, interleaved and repeated 3 times, each with an
#    empty reference cache; 3. with Slurm's daemons (root, Debian's slurm packages), the wall time
#    of 4 shards on the single-node cluster (tools/slurm/single_node.sh) against one process.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
prompts=${2:-16}
cli=$here/$build/kvscope-cli
models=$here/../shared/models
work=$(mktemp -d "${TMPDIR:-/tmp}/kvscope-setbench.XXXXXX")
trap '"$here/tools/slurm/single_node.sh" stop "$work/cluster" >/dev/null 2>&1; rm -rf "$work"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
steps=${KVSCOPE_BENCH_STEPS:-512}
read -r -a flags <<<"${KVSCOPE_BENCH_FLAGS:---methods all --ratios 0.5,0.25 --seeds 3}"

for ((i = 0; i < prompts; ++i)); do
  echo "{\"prompt\": \"And the LORD said unto Moses, verse $i\", \"label\": \"p$i\"}"
done >"$work/prompts.jsonl"
"$cli" capture --model "$models/kjv3M.bin" --tokenizer "$models/tok1024.bin" --steps "$steps" --quiet \
  --prompts "$work/prompts.jsonl" --out-dir "$work/set" >/dev/null 2>&1
echo "set: $prompts captures of kjv3M, $steps tokens each; eval ${flags[*]}"

cpu_of() {  # CPU seconds (user + system) of a command, its output discarded
  /usr/bin/time -f "%U %S" "$@" 2>&1 >/dev/null | tail -1 | awk '{print $1 + $2}'
}
for rep in 1 2 3; do
  export KVSCOPE_CACHE_DIR=$work/cache-set-$rep
  set_cpu=$(cpu_of "$cli" eval "$work/set" "${flags[@]}")
  sep_cpu=0
  for f in "$work"/set/*.safetensors; do
    export KVSCOPE_CACHE_DIR=$work/cache-sep-$rep
    c=$(cpu_of "$cli" eval "$f" "${flags[@]}")
    sep_cpu=$(python3 -c "print($sep_cpu + $c)")
  done
  python3 -c "print('run $rep: eval SET %.2f s CPU, $prompts separate evals %.2f s CPU, ratio %.2f' % ($set_cpu, $sep_cpu, $sep_cpu / $set_cpu))"
done
unset KVSCOPE_CACHE_DIR

if "$here/tools/slurm/single_node.sh" start "$work/cluster" >/dev/null 2>&1; then
  export SLURM_CONF=$work/cluster/slurm.conf
  for rep in 1 2; do
    export KVSCOPE_CACHE_DIR=$work/cache-slurm-one-$rep
    t0=$(date +%s.%N)
    "$cli" eval "$work/set" "${flags[@]}" --json "$work/one-$rep.json" >/dev/null
    t1=$(date +%s.%N)
    export KVSCOPE_CACHE_DIR=$work/cache-slurm-shards-$rep  # the shards inherit it (sbatch)
    "$here/tools/slurm/launch.sh" --set "$work/set" --shards 4 --out "$work/slurm-$rep" \
      --cpus-per-task 1 --mem 1G --cli "$cli" --wait -- "${flags[@]}" >/dev/null
    t2=$(date +%s.%N)
    python3 -c "print('run $rep: one process %.1f s wall, 4 Slurm shards + merge %.1f s wall, ratio %.2f' % ($t1 - $t0, $t2 - $t1, ($t2 - $t1) / ($t1 - $t0)))"
    cmp <(python3 -m json.tool "$work/one-$rep.json") <(python3 -m json.tool "$work/slurm-$rep/report.json") >/dev/null &&
      echo "run $rep: the merged Slurm report equals the single process's"
  done
else
  echo "slurm: not run (needs root and Debian's slurmctld, slurmd, slurm-client, munge)"
fi

#!/usr/bin/env bash
# A capture set evaluated as a Slurm array on a real single-node Slurm (tools/slurm/single_node.sh:
# munge, slurmctld and slurmd in a temporary folder, stopped afterwards): the array of shards and
# the merge job that tools/slurm/launch.sh submits give a report equal to one process's
# `kvscope-cli eval SET`. Exit 77 (skipped) without Slurm's packages or root.
#
#   tests/slurm/test_slurm_set.sh PATH/TO/kvscope-cli
set -uo pipefail
cli=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvscope-slurm.XXXXXX")
cleanup() {
  "$here/tools/slurm/single_node.sh" stop "$work/cluster" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM  # a CTest timeout: the daemons are stopped all the same
trap 'exit 130' INT

"$here/tools/slurm/single_node.sh" start "$work/cluster"
rc=$?
if ((rc == 77)); then
  echo "SKIP: no single-node Slurm here (Debian's slurmctld, slurmd, slurm-client, munge; root)"
  exit 77
fi
((rc == 0)) || { echo "FAIL: single-node Slurm did not start"; exit 1; }
export SLURM_CONF=$work/cluster/slurm.conf

# A set of three captures of one synthetic model, of different lengths.
mkdir -p "$work/set"
for i in 0 1 2; do
  "$cli" synth --shape small --tokens $((96 + 16 * i)) --seed $((i + 1)) --dtype f32 --quiet \
    --out "$work/set/prompt$i.safetensors" >/dev/null || { echo "FAIL: synth"; exit 1; }
done
flags=(--methods uniform,snapkv,balancekv --ratios 0.5,0.25 --seeds 2)

"$cli" eval "$work/set" "${flags[@]}" --json "$work/single.json" >"$work/single.log" 2>&1 ||
  { echo "FAIL: eval SET in one process"; cat "$work/single.log"; exit 1; }

"$here/tools/slurm/launch.sh" --set "$work/set" --shards 3 --out "$work/run" --cpus-per-task 1 \
  --mem 500M --time 10:00 --cli "$cli" --wait -- "${flags[@]}"
rc=$?
if ((rc != 0)); then
  echo "FAIL: the Slurm run failed (exit $rc)"
  tail -20 "$work"/run/*.log "$work/cluster/slurmctld.log" 2>/dev/null
  exit 1
fi
for i in 0 1 2; do
  [[ -f $work/run/shard-$i.json ]] || { echo "FAIL: no shard-$i.json"; exit 1; }
done
python3 - "$work/single.json" "$work/run/report.json" <<'PY' || exit 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
if a != b:
    keys = [k for k in a if a.get(k) != b.get(k)]
    print("FAIL: the merged Slurm report differs from one process's in", keys)
    sys.exit(1)
print("the merged report of 3 shards on Slurm equals eval SET in one process (%d captures, %d rows)"
      % (len(a["captures"]), len(a["summary"])))
PY
for f in rows.csv summary.csv; do
  [[ -s $work/run/$f ]] || { echo "FAIL: no $f"; exit 1; }
done
echo "PASS"

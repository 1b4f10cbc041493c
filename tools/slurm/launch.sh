#!/usr/bin/env bash
# Evaluates a capture set on a Slurm cluster: an sbatch array of N shards (`kvscope-cli eval SET
# --shard auto`, one shard per array task) and a merge job that runs once every shard has
# succeeded (`--dependency=afterok`) and writes the report one process's `eval SET` would
# (docs/evaluation.md, "On a cluster").
#
#   tools/slurm/launch.sh --set SET --shards N --out DIR [options] [-- EVAL FLAGS...]
#
#   --set SET            a manifest .jsonl or a folder of captures, on storage every node sees
#   --shards N           array tasks (each runs work items i, i+N, ... of every capture)
#   --out DIR            shard reports, the merged report.json, rows.csv, summary.csv, the job
#                        scripts and their logs (on shared storage)
#   --cpus-per-task C    cores per shard (default 4; kvscope-cli eval --threads follows it)
#   --mem M              memory per shard, as sbatch takes it (default 8G)
#   --time T             time limit per shard (default 4:00:00)
#   --partition P, --account A, --qos Q    passed to sbatch when given
#   --cli PATH           kvscope-cli on the nodes (default: this build's, build/kvscope-cli)
#   --wait               return when the merge job has ended; exit status 0 only if it succeeded
#   --dry-run            write the job scripts and print the sbatch commands without submitting
#   -- EVAL FLAGS        passed to every shard's `kvscope-cli eval` (e.g. --methods, --ratios)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
set_path="" shards="" out="" cpus=4 mem=8G time_limit=4:00:00 partition="" account="" qos=""
cli="$here/build/kvscope-cli" wait=0 dry=0
eval_flags=()
die() {
  echo "launch.sh: $*" >&2
  exit 1
}
while (($#)); do
  case $1 in
    --set) set_path=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --cpus-per-task) cpus=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    --partition) partition=$2; shift 2 ;;
    --account) account=$2; shift 2 ;;
    --qos) qos=$2; shift 2 ;;
    --cli) cli=$2; shift 2 ;;
    --wait) wait=1; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; eval_flags=("$@"); break ;;
    *) die "unknown option $1 (see the comment at the top of tools/slurm/launch.sh)" ;;
  esac
done
[[ -n $set_path ]] || die "--set: give the capture set (manifest .jsonl or folder)"
[[ -e $set_path ]] || die "--set $set_path: no such manifest or folder"
[[ $shards =~ ^[0-9]+$ ]] && ((shards >= 1 && shards <= 100000)) ||
  die "--shards '$shards': expected a whole number from 1 to 100000"
[[ $cpus =~ ^[0-9]+$ ]] && ((cpus >= 1)) || die "--cpus-per-task '$cpus': expected a whole number >= 1"
[[ -n $out ]] || die "--out: give a folder for the reports"
[[ -x $cli ]] || die "--cli $cli: not an executable kvscope-cli (build first, or give --cli)"
for f in "${eval_flags[@]}"; do
  case $f in
    --shard | --json | --csv | --summary-csv | --threads)
      die "$f: the launcher sets it for every shard; leave it out of the eval flags" ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
set_path=$(cd "$(dirname "$set_path")" && pwd)/$(basename "$set_path")
[[ ! -e $out/report.json ]] || die "--out $out: already holds a report.json (choose a new folder)"

# Quoted once here so that the job scripts pass every flag through unchanged.
quoted_flags=""
((${#eval_flags[@]} == 0)) || quoted_flags=$(printf ' %q' "${eval_flags[@]}")
sbatch_opts=()
[[ -n $partition ]] && sbatch_opts+=(--partition="$partition")
[[ -n $account ]] && sbatch_opts+=(--account="$account")
[[ -n $qos ]] && sbatch_opts+=(--qos="$qos")

cat >"$out/shards.sbatch" <<SCRIPT
#!/usr/bin/env bash
#SBATCH --job-name=kvscope-eval
#SBATCH --array=0-$((shards - 1))
#SBATCH --cpus-per-task=$cpus
#SBATCH --mem=$mem
#SBATCH --time=$time_limit
#SBATCH --output=$out/shard-%a.log
# One shard of the set: --shard auto reads SLURM_ARRAY_TASK_ID / _MIN / _COUNT.
set -euo pipefail
exec $(printf '%q' "$cli") eval $(printf '%q' "$set_path")$quoted_flags --shard auto \\
  --threads $cpus --json $(printf '%q' "$out")/shard-\$SLURM_ARRAY_TASK_ID.json
SCRIPT

cat >"$out/merge.sbatch" <<SCRIPT
#!/usr/bin/env bash
#SBATCH --job-name=kvscope-merge
#SBATCH --cpus-per-task=1
#SBATCH --mem=$mem
#SBATCH --time=1:00:00
#SBATCH --output=$out/merge.log
# Every shard's report, merged exactly: the report one process's eval SET writes.
set -euo pipefail
shopt -s nullglob
parts=($(printf '%q' "$out")/shard-*.json)
if ((\${#parts[@]} != $shards)); then
  echo "merge: \${#parts[@]} of $shards shard reports found in $(printf '%q' "$out")" >&2
  exit 1
fi
exec $(printf '%q' "$cli") merge "\${parts[@]}" --json $(printf '%q' "$out")/report.json \\
  --csv $(printf '%q' "$out")/rows.csv --summary-csv $(printf '%q' "$out")/summary.csv
SCRIPT

if ((dry)); then
  echo "sbatch --parsable ${sbatch_opts[*]} $out/shards.sbatch"
  echo "sbatch --parsable ${sbatch_opts[*]} --dependency=afterok:<array job> $out/merge.sbatch"
  exit 0
fi
command -v sbatch >/dev/null || die "sbatch not found: run this on a Slurm login node"
array_job=$(sbatch --parsable "${sbatch_opts[@]}" "$out/shards.sbatch")
array_job=${array_job%%;*}
merge_job=$(sbatch --parsable "${sbatch_opts[@]}" --dependency=afterok:"$array_job" \
  --kill-on-invalid-dep=yes "$out/merge.sbatch")
merge_job=${merge_job%%;*}
echo "launch.sh: shards: job $array_job (array 0-$((shards - 1))); merge: job $merge_job"
echo "launch.sh: the report will be $out/report.json (logs: $out/shard-*.log, $out/merge.log)"
((wait)) || exit 0

# --wait: until the merge job leaves the queue, then its final state.
while squeue -h -j "$merge_job" 2>/dev/null | grep -q .; do sleep 2; done
state=$(scontrol show job "$merge_job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1)
if [[ -f $out/report.json && ${state:-COMPLETED} == COMPLETED ]]; then
  echo "launch.sh: merged: $out/report.json"
  exit 0
fi
echo "launch.sh: the merge job ended ${state:-without a state} and wrote no report; see" \
  "$out/merge.log and $out/shard-*.log" >&2
exit 1

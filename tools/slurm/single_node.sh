#!/usr/bin/env bash
# A single-node Slurm cluster (munge + slurmctld + slurmd) in a folder of its own, for testing
# tools/slurm/launch.sh on one machine: nothing outside the folder is read or written, the
# daemons listen on free local ports, and `stop` ends them. Needs Debian's slurmctld, slurmd,
# slurm-client and munge (tools/bootstrap.sh installs them) and root (slurmd runs jobs as their
# user).
#
#   tools/slurm/single_node.sh start DIR   # then: export SLURM_CONF=DIR/slurm.conf
#   tools/slurm/single_node.sh stop DIR
set -euo pipefail
cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir ]]; then
  echo "usage: tools/slurm/single_node.sh start|stop DIR" >&2
  exit 2
fi

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    if [[ -s $pidfile ]]; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
    fi
  done
  # Wait for them to go so that the folder can be removed.
  for _ in $(seq 1 50); do
    local alive=0
    for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
      if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then alive=1; fi
    done
    ((alive == 0)) && return 0
    sleep 0.1
  done
}

if [[ $cmd == stop ]]; then
  stop
  exit 0
fi
[[ $cmd == start ]] || { echo "single_node.sh: unknown command $cmd" >&2; exit 2; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin
  command -v "$tool" >/dev/null || {
    echo "single_node.sh: $tool not found (Debian packages slurmctld slurmd slurm-client munge)" >&2
    exit 77
  }
done
if [[ $(id -u) != 0 ]]; then
  echo "single_node.sh: slurmd needs root to run jobs" >&2
  exit 77
fi

mkdir -p "$dir"/{state,spool,munge}
dir=$(cd "$dir" && pwd)
chmod 700 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed" \
  --force

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
host=$(hostname -s)
cpus=$(nproc)
mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2))
cat >"$dir/slurm.conf" <<CONF
ClusterName=kvscope-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MaxArraySize=1001
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=kvscope Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$host"
# Ready when the node takes jobs.
for _ in $(seq 1 150); do
  state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
  if [[ $state == idle* || $state == mix* ]]; then
    echo "single_node.sh: Slurm is up (SLURM_CONF=$SLURM_CONF, node $host, $cpus CPUs)"
    exit 0
  fi
  sleep 0.2
done
echo "single_node.sh: the node did not come up (state '${state:-none}'); logs in $dir" >&2
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1

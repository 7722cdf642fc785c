#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the test suite and for trying the launcher presets.
#
#   scripts/slurm-cluster.sh start    # install the packages when missing (as root, or through sudo), start munged,
#                                     # MariaDB + slurmdbd (accounting: sacct), slurmctld and slurmd; prints the env
#   eval "$(scripts/slurm-cluster.sh env)"   # SLURM_CONF for sbatch/squeue/scancel (and the sweep's submitit)
#   scripts/slurm-cluster.sh status   # sinfo of the cluster
#   scripts/slurm-cluster.sh stop     # cancel its jobs, stop its daemons (and munged if started here)
#
# Everything lives under REPLACEME_SLURM_DIR (default /tmp/replaceme-slurm): slurm.conf, state, spool, logs.
# The daemons listen on REPLACEME_SLURM_PORT and the next port (default 16817, 16818), not SLURM's defaults,
# so a real cluster's client configuration is left alone. Debian's packages: proctrack/linuxproc and
# task/none (no cgroups in containers), select/cons_tres with cores and memory as consumables. A job in the
# `cpu-urgent` partition preempts (requeues) `cpu` jobs, as a busy cluster does: first the job's --signal
# (USR2, which submitit answers by requeueing it), then SIGTERM after the 30 s grace time.
set -euo pipefail

dir="${REPLACEME_SLURM_DIR:-/tmp/replaceme-slurm}"
port="${REPLACEME_SLURM_PORT:-16817}"
conf="$dir/slurm.conf"
case "${1:-}" in  # the daemons run as root: start, stop and install ask for sudo when not root
  start|stop|install) if [ "$(id -u)" -ne 0 ]; then exec sudo --preserve-env=REPLACEME_SLURM_DIR,REPLACEME_SLURM_PORT "$0" "$@"; fi ;;
esac

install_packages() {
  local missing=0
  for program in slurmctld slurmd slurmdbd munged mariadbd; do command -v "$program" >/dev/null || missing=1; done
  [ "$missing" -eq 0 ] && return 0
  echo "slurm-cluster: installing slurm-wlm, slurmdbd, munge and mariadb-server" >&2
  env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurm-wlm slurmdbd munge mariadb-server >/dev/null
}

write_conf() {
  local node cpus mem
  node="$(hostname -s)"
  cpus="$(slurmd -C | sed -n 's/.* CPUs=\([0-9]*\).*/\1/p')"
  mem="$(slurmd -C | sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p')"
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat > "$conf" <<CONF
ClusterName=replaceme
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,preempt_send_user_signal
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((port + 2))
ReturnToService=2
KillWait=5
MinJobAge=300
RebootProgram=/bin/true
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=cpu Nodes=$node Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=cpu-urgent Nodes=$node MaxTime=INFINITE State=UP PriorityTier=2
CONF
}

write_dbd_conf() {
  cat > "$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$((port + 2))
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((port + 3))
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
  chmod 600 "$dir/slurmdbd.conf"
}

# The accounting database (sacct: what submitit asks a job's state with) in a MariaDB of its own.
start_database() {
  running "$dir/mariadb.pid" && return 0
  if [ ! -d "$dir/db/mysql" ]; then
    mariadb-install-db --no-defaults --user=root --datadir="$dir/db" --auth-root-authentication-method=socket \
      >>"$dir/log/mariadb.out" 2>&1
  fi
  rm -f "$dir/mysql.sock"  # a socket left by a killed server answers "connection refused" until the new one binds
  mariadbd --no-defaults --user=root --datadir="$dir/db" --socket="$dir/mysql.sock" --pid-file="$dir/mariadb.pid" \
    --bind-address=127.0.0.1 --port=$((port + 3)) --skip-name-resolve --log-error="$dir/log/mariadb.log" \
    </dev/null >>"$dir/log/mariadb.out" 2>&1 &
  local pid=$! client=(--no-defaults --socket="$dir/mysql.sock" -u root)
  for _ in $(seq 1 120); do
    mariadb-admin "${client[@]}" ping >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if ! mariadb-admin "${client[@]}" ping >/dev/null 2>&1; then
    echo "slurm-cluster: MariaDB did not answer in 60 s; the end of its logs ($dir/log):" >&2
    tail -n 20 "$dir/log/mariadb.out" "$dir/log/mariadb.log" >&2 2>/dev/null || true
    return 1
  fi
  mariadb "${client[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; CREATE DATABASE IF NOT EXISTS slurm_acct_db;"
}

start_dbd() {
  running "$dir/slurmdbd.pid" && return 0
  SLURM_CONF="$conf" slurmdbd
  for _ in $(seq 1 60); do SLURM_CONF="$conf" sacctmgr -n list cluster >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "slurm-cluster: slurmdbd did not answer (logs in $dir/log)" >&2
  return 1
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  install_packages
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged
    touch "$dir.munged-started-here" 2>/dev/null || true
  fi
  running "$dir/slurmctld.pid" && running "$dir/slurmd.pid" && { wait_idle; return 0; }
  write_conf
  write_dbd_conf
  start_database
  start_dbd
  slurmctld -f "$conf" -i
  slurmd -f "$conf"
  wait_idle
}

wait_idle() {
  local node state
  node="$(hostname -s)"
  for _ in $(seq 1 60); do
    state="$(SLURM_CONF="$conf" sinfo -h -n "$node" -o %T 2>/dev/null || true)"
    case "$state" in
      idle*|mixed*|allocated*) echo "slurm-cluster: node $node $state; export SLURM_CONF=$conf" >&2; return 0 ;;
      down*|drain*) SLURM_CONF="$conf" scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
  done
  echo "slurm-cluster: the node did not come up in 60 s (logs in $dir/log)" >&2
  return 1
}

stop() {
  if [ -f "$conf" ] && running "$dir/slurmctld.pid"; then  # its jobs first: their steps report to slurmctld
    SLURM_CONF="$conf" scancel --full --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 60); do [ -z "$(SLURM_CONF="$conf" squeue -h 2>/dev/null)" ] && break; sleep 0.5; done
  fi
  local pid
  for daemon in slurmd slurmctld slurmdbd mariadb; do  # each gone before the next stops (slurmctld saves state)
    running "$dir/$daemon.pid" || continue
    pid="$(cat "$dir/$daemon.pid")"
    kill "$pid"
    for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [ -f "$dir.munged-started-here" ]; then  # gone before stop returns: a start right after starts its own
    pkill -x munged || true
    for _ in $(seq 1 60); do pgrep -x munged >/dev/null || break; sleep 0.5; done
    rm -f "$dir.munged-started-here"
  fi
}

case "${1:-}" in
  install) install_packages ;;
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF="$conf" sinfo ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: $0 install|start|stop|status|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A two-node SLURM cluster on loopback for `make test-slurm`.
#
#   tests/slurm/cluster.sh start    # munged + slurmctld + slurmd n1 + slurmd n2, waits for idle
#   tests/slurm/cluster.sh status   # sinfo/squeue, or exit 1 when the cluster is down
#   tests/slurm/cluster.sh stop     # kills every daemon this script started (by pid file)
#   eval "$(tests/slurm/cluster.sh env)"   # SLURM_CONF for sbatch/squeue/scontrol
#
# Everything (config, munge key and socket, spool, logs, pid files) lives in $LORAC_SLURM_STATE
# (default /tmp/lorac-slurm), so a system-wide SLURM or munge on the machine is left untouched.
# Two slurmd daemons on this host act as nodes n1 and n2 (distinct ports, `slurmd -N`); the
# names resolve through an /etc/hosts line that `stop` removes again. Runs as root (CI does);
# installs Debian's slurm-wlm and munge when they are missing.
set -euo pipefail

STATE=${LORAC_SLURM_STATE:-/tmp/lorac-slurm}
CTLD_PORT=${LORAC_SLURM_PORT:-16817}
CPUS=${LORAC_SLURM_CPUS:-2} # per node; both "nodes" share this host's cores
HOSTS_TAG="# lorac-test-slurm"
CONF=$STATE/slurm.conf
HOST=$(hostname)

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return 0
    [ "$(id -u)" = 0 ] || die "slurm-wlm/munge are missing and installing them needs root"
    command -v apt-get >/dev/null || die "slurm-wlm/munge are missing and there is no apt-get"
    echo "cluster.sh: installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get install -y -q slurm-wlm munge || (apt-get update -q && apt-get install -y -q \
        slurm-wlm munge)) >"$STATE/apt.log" 2>&1 || die "apt-get failed, see $STATE/apt.log"
}

write_config() {
    mkdir -p "$STATE"/{ctld,spool/n1,spool/n2,munge,log}
    chmod 700 "$STATE/munge"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
        chmod 400 "$STATE/munge/munge.key"
    fi
    cat >"$CONF" <<EOF
# Written by tests/slurm/cluster.sh: two nodes on one host, no accounting, no cgroups.
ClusterName=lorac-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
EnforcePartLimits=ALL
KillWait=30
MinJobAge=3600
SlurmdTimeout=60
InactiveLimit=0
SchedulerParameters=bf_interval=2
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 1)) CPUs=$CPUS State=UNKNOWN
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((CTLD_PORT + 2)) CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
}

add_hosts() {
    grep -q "$HOSTS_TAG" /etc/hosts || echo "127.0.0.1 n1 n2 $HOSTS_TAG" >>/etc/hosts
}

remove_hosts() {
    if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
        # /etc/hosts may be a bind mount: rewrite it in place instead of replacing the file
        local kept
        kept=$(grep -v "$HOSTS_TAG" /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    [ "$(id -u)" = 0 ] || die "run as root (slurmd must start jobs as the submitting user)"
    mkdir -p "$STATE"
    install_packages
    if alive "$STATE/slurmctld.pid"; then
        echo "cluster.sh: already running (state in $STATE)"
        return 0
    fi
    stop >/dev/null # daemons a failed start may have left behind
    write_config
    add_hosts
    export SLURM_CONF=$CONF
    munged --force --socket="$STATE/munge/munge.socket" --key-file="$STATE/munge/munge.key" \
        --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" || die "munged failed, see $STATE/log/munged.log"
    slurmctld -f "$CONF" -c -i || die "slurmctld failed, see $STATE/log/slurmctld.log"
    slurmd -f "$CONF" -N n1 || die "slurmd n1 failed, see $STATE/log/slurmd-n1.log"
    slurmd -f "$CONF" -N n2 || die "slurmd n2 failed, see $STATE/log/slurmd-n2.log"
    for _ in $(seq 60); do
        if [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = 2 ]; then
            echo "cluster.sh: n1 and n2 idle; export SLURM_CONF=$CONF"
            return 0
        fi
        sleep 1
    done
    sinfo -N -l >&2 || true
    tail -n 20 "$STATE"/log/*.log >&2 || true
    die "nodes not idle after 60 s"
}

stop() {
    # Jobs first (their processes belong to slurmstepd, which outlives slurmd), then only the
    # daemons recorded in our pid files.
    export SLURM_CONF=$CONF
    if alive "$STATE/slurmctld.pid"; then
        scancel --quiet --full --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 45); do
            [ -z "$(squeue -h 2>/dev/null)" ] && break
            sleep 1
        done
    fi
    local f pid
    for f in slurmd-n1 slurmd-n2 slurmctld munged; do
        if alive "$STATE/$f.pid"; then
            pid=$(cat "$STATE/$f.pid")
            kill "$pid"
            for _ in $(seq 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.2
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$STATE/$f.pid"
    done
    remove_hosts
    echo "cluster.sh: stopped"
}

status() {
    export SLURM_CONF=$CONF
    [ -f "$CONF" ] && alive "$STATE/slurmctld.pid" || {
        echo "cluster.sh: not running (state dir $STATE)"
        return 1
    }
    sinfo -N
    squeue
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
env) echo "export SLURM_CONF=$CONF" ;;
*) die "usage: $0 start|stop|status|env" ;;
esac

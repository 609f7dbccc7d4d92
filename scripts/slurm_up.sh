#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the tests: munged (as user munge), slurmctld and slurmd from
# Debian's slurm-wlm and munge, installed when missing. Idempotent: a cluster that answers is left as it is.
# No accounting daemon: sacct has no data here, and opcollect status reads squeue and the shards on disk.
set -euo pipefail
if ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
if sinfo -h >/dev/null 2>&1 && sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'; then
  exit 0
fi
node=$(hostname -s)
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/log/munge /etc/munge
cat >/etc/slurm/slurm.conf <<EOF
ClusterName=opcollect-test
SlurmctldHost=${node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MaxArraySize=1001
KillWait=5
NodeName=${node} CPUs=${cpus} RealMemory=${memory} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP
EOF
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge
chmod 0700 /etc/munge /var/log/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
for _ in $(seq 1 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    exit 0
  fi
  scontrol update nodename="${node}" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "slurm_up.sh: the one-node cluster did not come up; see /var/log/slurm/" >&2
exit 1

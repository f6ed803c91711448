#!/usr/bin/env bash
# A real single-node SLURM (with job accounting) on this machine, without systemd.
#
#   slurm/local-cluster.sh up       install packages if missing, write configs, start daemons
#   slurm/local-cluster.sh down     cancel jobs, stop the daemons (state is kept)
#   slurm/local-cluster.sh reset    down, then wipe SLURM state and the accounting database
#   slurm/local-cluster.sh status   daemons, `scontrol ping`, node and queue
#
# Needs root and Debian 12 (Slurm 22.05). `up` is idempotent: daemons already running are
# left alone. Notes on why each setting is here: slurm/README.md and the CI reference.
set -eu

PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
CLUSTER=mxscale
CONF_DIR=/etc/slurm
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=mxscale-local-only
DAEMON_WAIT_S=30

log() { echo "[local-cluster] $*" >&2; }
die() { log "error: $*"; exit 1; }

# Poll a command until it succeeds or DAEMON_WAIT_S passes.
wait_for() {
    local what=$1
    shift
    for _ in $(seq $((DAEMON_WAIT_S * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "$what did not come up within ${DAEMON_WAIT_S}s (logs in $LOG_DIR)"
}

# True when the PID file names a live process.
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    local missing=()
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

make_dirs() {
    mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR" /run/munge /run/mysqld
    chown munge:munge /run/munge
    chown mysql:mysql /run/mysqld
}

# The node line comes from the hardware: a RealMemory above the real one drains the node.
node_line() {
    local probe
    # Written to a file first: `slurmd -C | head -1` can kill the writer early.
    probe=$(mktemp)
    slurmd -C >"$probe"
    sed -n '1s/^NodeName=[^ ]*/NodeName=localhost NodeAddr=127.0.0.1/p' "$probe"
    rm -f "$probe"
}

write_configs() {
    cat >"$CONF_DIR/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire (default 120 s) before it may start again.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MaxArraySize=1001
# Jobs that become eligible later (requeued ones) start within seconds, not at the 60 s tick.
SchedulerParameters=sched_interval=5,bf_interval=5
MinJobAge=300
KillWait=5
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
$(node_line)
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$CONF_DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
EOF
    chown root:root "$CONF_DIR/slurmdbd.conf"
    chmod 600 "$CONF_DIR/slurmdbd.conf"
}

start_munge() {
    pid_alive /run/munge/munged.pid && return 0
    [ -s /etc/munge/munge.key ] || mungekey --create
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged
    wait_for munged munge -n
}

start_mariadb() {
    if ! pid_alive /run/mysqld/mysqld.pid; then
        [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
        setsid mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
            --socket=/run/mysqld/mysqld.sock --innodb-lock-wait-timeout=900 \
            >>"$LOG_DIR/mariadb.log" 2>&1 </dev/null &
        wait_for mariadb mariadb-admin --socket=/run/mysqld/mysqld.sock ping
    fi
    mariadb --socket=/run/mysqld/mysqld.sock <<EOF
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
EOF
}

start_slurm() {
    if ! pid_alive "$RUN_DIR/slurmdbd.pid"; then
        slurmdbd
        wait_for slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/6819"
    fi
    if ! pid_alive "$RUN_DIR/slurmctld.pid"; then
        slurmctld
        # `scontrol ping | grep -q` under pipefail can fail at random; match the output instead.
        wait_for slurmctld bash -c '[[ "$(scontrol ping)" == *UP* ]]'
    fi
    pid_alive "$RUN_DIR/slurmd.pid" || slurmd -N localhost
    wait_for "node localhost" bash -c \
        '[[ "$(sinfo -h -n localhost -o %T)" =~ ^(idle|mixed|allocated) ]]'
}

smoke_test() {
    local job_id state
    job_id=$(sbatch --parsable --wrap=hostname --output=/dev/null)
    for _ in $(seq 100); do
        state=$(sacct -n -X -P -o State -j "$job_id" 2>/dev/null || true)
        [ "$state" = COMPLETED ] && { log "smoke job $job_id COMPLETED (sacct works)"; return 0; }
        sleep 0.3
    done
    die "smoke job $job_id did not reach COMPLETED in sacct (last state: '${state}')"
}

stop_pidfile() {
    local name=$1 pidfile=$2 pid
    pid_alive "$pidfile" || return 0
    pid=$(cat "$pidfile")
    log "stopping $name ($pid)"
    kill "$pid"
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
}

cmd_up() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"
    install_packages
    make_dirs
    # Rewriting slurm.conf under a running slurmctld would make the two disagree.
    pid_alive "$RUN_DIR/slurmctld.pid" || write_configs
    start_munge
    start_mariadb
    start_slurm
    smoke_test
    log "up: $(scontrol show config | grep -E '^MaxArraySize' | tr -s ' ')"
}

stop_slurm() {
    # Job processes outlive slurmd, so cancel them while the controller still runs.
    if [[ "$(scontrol ping 2>/dev/null || true)" == *UP* ]]; then
        scancel --full --state=PENDING,RUNNING,SUSPENDED --user=root 2>/dev/null || true
        sleep 1
    fi
    stop_pidfile slurmd "$RUN_DIR/slurmd.pid"
    stop_pidfile slurmctld "$RUN_DIR/slurmctld.pid"
    stop_pidfile slurmdbd "$RUN_DIR/slurmdbd.pid"
}

stop_base() {
    stop_pidfile mariadbd /run/mysqld/mysqld.pid
    stop_pidfile munged /run/munge/munged.pid
}

cmd_down() {
    stop_slurm
    stop_base
}

cmd_reset() {
    stop_slurm
    # Old job ids in the accounting database would confuse sacct after the state wipe.
    if pid_alive /run/mysqld/mysqld.pid; then
        mariadb --socket=/run/mysqld/mysqld.sock -e "DROP DATABASE IF EXISTS $DB_NAME"
    fi
    stop_base
    rm -rf "${STATE_DIR:?}"/* "${SPOOL_DIR:?}"/*
    log "state and accounting database wiped"
}

cmd_status() {
    local name pidfile rc=0
    for entry in munged:/run/munge/munged.pid mariadbd:/run/mysqld/mysqld.pid \
        slurmdbd:$RUN_DIR/slurmdbd.pid slurmctld:$RUN_DIR/slurmctld.pid \
        slurmd:$RUN_DIR/slurmd.pid; do
        name=${entry%%:*}
        pidfile=${entry#*:}
        if pid_alive "$pidfile"; then
            echo "$name: running ($(cat "$pidfile"))"
        else
            echo "$name: stopped"
            rc=1
        fi
    done
    [ $rc -eq 0 ] || return $rc
    scontrol ping
    sinfo
    squeue
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    reset) cmd_reset ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|reset|status" >&2; exit 2 ;;
esac

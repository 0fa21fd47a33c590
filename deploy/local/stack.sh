#!/usr/bin/env bash
# The local stack without Docker: Redis, a 3-master Redis Cluster, a Redis primary and
# replica watched by three Sentinels, PostgreSQL, a single-node Apache Kafka (KRaft) broker
# and a 3-node Kafka cluster, all on loopback, all state under .run/ (but for PostgreSQL as
# root: below).
#
#   stack.sh up           Redis :6379 (AOF on), PostgreSQL :5432 (db metergate), Kafka :9092
#   stack.sh up-cluster   also a 3-master Redis Cluster on :7000-7002
#   stack.sh up-sentinel  also a Redis primary :6380, its replica :6381 and three Sentinels
#                         :26380-26382 watching them as master "metergate"
#   stack.sh up-kafka-cluster  also a 3-node Kafka (KRaft) cluster on :9192-9194, each node
#                         broker and controller (controllers :9195-9197): replication 3,
#                         min.insync.replicas 2
#   stack.sh start-kafka-node N  starts the cluster's node N (1-3) again and waits until it
#                         serves (after a test killed it)
#   stack.sh down         stops, by pid, everything the four above started
#   stack.sh down-sentinel  stops only what up-sentinel started
#   stack.sh down-kafka-cluster  stops only what up-kafka-cluster started
#   stack.sh status       what is running
#   stack.sh fetch-axe    only fetches axe-core for the browser tests (up does it too)
#   stack.sh verify-down  fails if anything the stack started still runs
#   stack.sh purge        down, then delete this clone's state (.run/ and PostgreSQL's data)
#
# Installs what is missing (apt-get when root; the Kafka jars from Maven Central through
# `mvn dependency:copy-dependencies` into .cache/), reuses services that already run, waits
# until each answers, and writes .run/env to be sourced.
#
# Ports: REDIS_PORT, PG_PORT, KAFKA_PORT, KAFKA_CONTROLLER_PORT, REDIS_CLUSTER_PORTS (three,
# space-separated), REDIS_SENTINEL_DATA_PORTS (the primary, then its replicas: two or more),
# REDIS_SENTINEL_PORTS (three), KAFKA_CLUSTER_PORTS and KAFKA_CLUSTER_CONTROLLER_PORTS (three
# each), so that a second clone can run a stack of its own beside the first.
#
# As root, PostgreSQL runs as the system user postgres, which may not be able to reach the
# clone (a clone in root's 0700 home): its files then live in a directory of this clone's own
# under /var/lib/metergate (METERGATE_PG_STATE_DIR), linked from .run/postgres/home
# (docs/deploy.md, "The local stack's state").
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RUN=${METERGATE_RUN_DIR:-$ROOT/.run}
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac # absolute: PostgreSQL's home names it
CACHE=${METERGATE_CACHE_DIR:-$ROOT/.cache}
KAFKA_VERSION=${KAFKA_VERSION:-4.4.0}
REDIS_PORT=${REDIS_PORT:-6379}
PG_PORT=${PG_PORT:-5432}
KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-9093}
read -r -a CLUSTER_PORTS <<<"${REDIS_CLUSTER_PORTS:-7000 7001 7002}"
[ ${#CLUSTER_PORTS[@]} -eq 3 ] || { echo "[stack] error: REDIS_CLUSTER_PORTS must name 3 ports" >&2; exit 2; }
# Two replicas: admit's ADMIT_REDIS_WAIT_REPLICAS=1 still finds one after a failover.
read -r -a SENTINEL_DATA_PORTS <<<"${REDIS_SENTINEL_DATA_PORTS:-6380 6381 6382}"
[ ${#SENTINEL_DATA_PORTS[@]} -ge 2 ] || { echo "[stack] error: REDIS_SENTINEL_DATA_PORTS must name at least 2 ports" >&2; exit 2; }
read -r -a SENTINEL_PORTS <<<"${REDIS_SENTINEL_PORTS:-26380 26381 26382}"
[ ${#SENTINEL_PORTS[@]} -eq 3 ] || { echo "[stack] error: REDIS_SENTINEL_PORTS must name 3 ports" >&2; exit 2; }
read -r -a KAFKA_CLUSTER_PORTS <<<"${KAFKA_CLUSTER_PORTS:-9192 9193 9194}"
[ ${#KAFKA_CLUSTER_PORTS[@]} -eq 3 ] || { echo "[stack] error: KAFKA_CLUSTER_PORTS must name 3 ports" >&2; exit 2; }
read -r -a KAFKA_CLUSTER_CONTROLLER_PORTS <<<"${KAFKA_CLUSTER_CONTROLLER_PORTS:-9195 9196 9197}"
[ ${#KAFKA_CLUSTER_CONTROLLER_PORTS[@]} -eq 3 ] || { echo "[stack] error: KAFKA_CLUSTER_CONTROLLER_PORTS must name 3 ports" >&2; exit 2; }
SENTINEL_MASTER=metergate
PG_STATE_BASE=${METERGATE_PG_STATE_DIR:-/var/lib/metergate}
PG_USER=metergate         # owns the database and its tables, applies the migrations
PG_APP_USER=metergate_app # the services' login: owns nothing (docs/deploy.md#database-roles)
PG_DB=metergate
WAIT_S=${STACK_WAIT_S:-120}

log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }

# alive PIDFILE: the process named in PIDFILE runs.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for DESCRIPTION COMMAND...: polls COMMAND until it succeeds or WAIT_S passes.
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + WAIT_S))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what did not come up within ${WAIT_S}s"
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------------------
# Installation

apt_updated=
apt_install() {
  is_root || die "missing $*: install it (Debian: apt-get install $*) or run as root"
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    apt_updated=1
  fi
  # Keep the packages' own init scripts from starting system-wide services on our ports.
  local policy=/usr/sbin/policy-rc.d created=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; created=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
  [ -z "$created" ] || rm -f "$policy"
}

pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && { echo "$d"; return 0; }
  done
  return 1
}

install_missing() {
  local pkgs=()
  command -v redis-server >/dev/null || pkgs+=(redis-server)
  command -v redis-sentinel >/dev/null || pkgs+=(redis-sentinel)
  command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || pkgs+=(redis-tools) # redis-benchmark: make bench
  pg_bindir >/dev/null || pkgs+=(postgresql)
  command -v psql >/dev/null || pkgs+=(postgresql-client)
  command -v java >/dev/null || pkgs+=(default-jre-headless)
  command -v mvn >/dev/null || pkgs+=(maven)
  command -v nginx >/dev/null || pkgs+=(nginx) # the forward-auth tests (deploy/gateways)
  command -v caddy >/dev/null || pkgs+=(caddy)
  command -v pdftotext >/dev/null || pkgs+=(poppler-utils) # the PDF tests (internal/document)
  command -v chromium >/dev/null || pkgs+=(chromium) # the console's browser tests (internal/console)
  [ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"
}

kafka_libs() { echo "$CACHE/kafka-$KAFKA_VERSION/libs"; }

fetch_kafka() {
  local libs; libs=$(kafka_libs)
  if [ -f "$libs/kafka_2.13-$KAFKA_VERSION.jar" ] && [ -f "$libs/.complete" ]; then
    return 0
  fi
  log "fetching Apache Kafka $KAFKA_VERSION from Maven Central into $libs"
  rm -rf "$libs"; mkdir -p "$libs"
  mvn -q -B -Dstyle.color=never -f "$ROOT/deploy/local/kafka-pom.xml" dependency:copy-dependencies \
    -Dkafka.version="$KAFKA_VERSION" -DincludeScope=runtime -DoutputDirectory="$libs" >&2 ||
    die "mvn could not fetch org.apache.kafka:kafka_2.13:$KAFKA_VERSION"
  [ -f "$libs/kafka_2.13-$KAFKA_VERSION.jar" ] || die "kafka_2.13-$KAFKA_VERSION.jar missing after fetch"
  touch "$libs/.complete"
}

# axe-core, the accessibility engine that the browser tests inject into the page
# (internal/testenv, Axe): its tarball from the npm registry, checked against the pinned
# sha512 (`npm view axe-core@$AXE_VERSION dist.integrity`), and axe.min.js taken out of it.
AXE_VERSION=4.14.1
AXE_INTEGRITY=sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ==
axe_js() { echo "$CACHE/axe-core-$AXE_VERSION/axe.min.js"; }

fetch_axe() {
  local js dir tmp got want; js=$(axe_js); dir=$(dirname "$js")
  [ ! -f "$js" ] || return 0
  command -v npm >/dev/null || apt_install npm
  log "fetching axe-core $AXE_VERSION from the npm registry into $dir"
  tmp=$(mktemp -d)
  npm pack "axe-core@$AXE_VERSION" --pack-destination "$tmp" --silent >/dev/null ||
    { rm -rf "$tmp"; die "npm could not fetch axe-core@$AXE_VERSION"; }
  got=$(sha512sum "$tmp/axe-core-$AXE_VERSION.tgz" | cut -d' ' -f1)
  want=$(base64 -d <<<"${AXE_INTEGRITY#sha512-}" | od -An -v -tx1 | tr -d ' \n')
  [ "$got" = "$want" ] || { rm -rf "$tmp"; die "axe-core-$AXE_VERSION.tgz: sha512 $got, want $want ($AXE_INTEGRITY)"; }
  tar -xzf "$tmp/axe-core-$AXE_VERSION.tgz" -C "$tmp" package/axe.min.js
  mkdir -p "$dir"
  mv "$tmp/package/axe.min.js" "$js.tmp" && mv "$js.tmp" "$js" # whole or absent
  rm -rf "$tmp"
}

# The Python SDK's test environment (sdk/python, run by sdk/sdk_test.go): a virtualenv
# with the pinned requirements of its tests, from PyPI, remade when they change.
python_venv() { echo "$CACHE/sdk-python-venv"; }

make_python_venv() {
  local venv req stamp; venv=$(python_venv); req="$ROOT/sdk/python/requirements-test.txt"
  stamp="$venv/.requirements"
  [ -f "$req" ] || return 0
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then return 0; fi
  command -v python3 >/dev/null || apt_install python3 python3-venv
  log "making the Python SDK's virtualenv in $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv $venv failed (package python3-venv?)"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" || die "pip could not install $req"
  cp "$req" "$stamp"
}

# The TypeScript SDK's and the examples' packages (sdk/typescript, examples/*, run by
# sdk/sdk_test.go and examples/examples_test.go): `npm ci` from the npm registry, into each
# directory's node_modules, again when its package-lock.json changes.
make_node_modules() {
  local dir lock stamp
  for dir in "$ROOT/sdk/typescript" "$ROOT"/examples/*/; do
    dir=${dir%/}; lock="$dir/package-lock.json"; stamp="$dir/node_modules/.metergate-lock"
    [ -f "$lock" ] || continue
    if [ -d "$dir/node_modules" ] && cmp -s "$lock" "$stamp"; then continue; fi
    command -v npm >/dev/null || apt_install nodejs npm
    log "installing the npm packages of ${dir#"$ROOT"/}"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed in $dir"
    cp "$lock" "$stamp"
  done
}

# ---------------------------------------------------------------------------------------
# Redis

redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

# start_redis NAME PORT [extra redis-server args...]
start_redis() {
  local name=$1 port=$2; shift 2
  local dir="$RUN/$name" pidfile="$RUN/$name/redis.pid"
  mkdir -p "$dir"
  if alive "$pidfile" && redis_ping "$port"; then
    log "$name already running on :$port (pid $(cat "$pidfile"))"; return 0
  fi
  if port_open "$port"; then
    redis_ping "$port" || die "port $port is taken by something that is not Redis"
    log "$name: reusing a Redis on :$port that this stack did not start"; return 0
  fi
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --daemonize yes \
    --pidfile "$pidfile" --logfile "$dir/redis.log" --save "" \
    --appendonly yes --appendfsync everysec "$@" >/dev/null
  wait_for "$name on :$port" redis_ping "$port"
  log "$name up on :$port"
}

cluster_ok() { redis-cli -p "${CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

cluster_has_three_masters() {
  [ "$(redis-cli -p "${CLUSTER_PORTS[0]}" cluster nodes 2>/dev/null | grep -c master)" = 3 ]
}

up_cluster_nodes() {
  local port
  for port in "${CLUSTER_PORTS[@]}"; do
    start_redis "redis-cluster/$port" "$port" --cluster-enabled yes \
      --cluster-config-file "$RUN/redis-cluster/$port/nodes.conf" --cluster-node-timeout 5000
  done
  if ! cluster_has_three_masters; then
    log "creating the Redis Cluster (3 masters)"
    local addrs=()
    for port in "${CLUSTER_PORTS[@]}"; do addrs+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$RUN/redis-cluster/create.log" 2>&1 ||
      die "redis-cli --cluster create failed: $(tail -5 "$RUN/redis-cluster/create.log")"
  fi
  wait_for "Redis Cluster state ok" cluster_ok
  log "Redis Cluster up on :${CLUSTER_PORTS[*]}"
}

# Sentinel: the primary and the replica are plain Redis servers (AOF on, as above). After a
# failover their roles stay swapped: up-sentinel starts a stopped server as a replica of the
# primary the sentinels name, and the sentinels turn a returning old primary into a replica.

# sentinel_master_addr: the primary's "host port" as the first sentinel that answers names it.
sentinel_master_addr() {
  local port addr
  for port in "${SENTINEL_PORTS[@]}"; do
    addr=$(redis-cli -p "$port" sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null | paste -sd' ') || continue
    [ -n "$addr" ] && { echo "$addr"; return 0; }
  done
  return 1
}

# sentinel_conf_master: the primary's port in the first sentinel's file, which the sentinel
# rewrites after a failover: where the primary was when the sentinels stopped.
sentinel_conf_master() {
  local conf="$RUN/redis-sentinel/${SENTINEL_PORTS[0]}/sentinel.conf"
  [ -f "$conf" ] && awk -v m="$SENTINEL_MASTER" '$1 == "sentinel" && $2 == "monitor" && $3 == m { print $5; f = 1; exit } END { exit !f }' "$conf"
}

# sentinel_ok: every sentinel knows the master, sees every replica and the two other
# sentinels, and the server they name is a primary indeed.
sentinel_ok() {
  local port info addr
  for port in "${SENTINEL_PORTS[@]}"; do
    info=$(redis-cli -p "$port" info sentinel 2>/dev/null) || return 1
    grep -q "name=$SENTINEL_MASTER,status=ok,.*slaves=$((${#SENTINEL_DATA_PORTS[@]} - 1)),sentinels=3" <<<"$info" || return 1
  done
  addr=$(sentinel_master_addr) || return 1
  [ "$(redis-cli -p "${addr#* }" role 2>/dev/null | head -1)" = master ]
}

start_sentinel() {
  local port=$1 dir="$RUN/redis-sentinel/$1"
  local pidfile="$dir/sentinel.pid" conf="$dir/sentinel.conf"
  mkdir -p "$dir"
  if alive "$pidfile" && redis_ping "$port"; then
    log "sentinel already running on :$port (pid $(cat "$pidfile"))"; return 0
  fi
  ! port_open "$port" || die "port $port is taken by something this stack did not start"
  # The sentinel rewrites its file with what it learns (the current primary, its peers):
  # written once, kept across restarts.
  [ -f "$conf" ] || printf '%s
' "bind 127.0.0.1" "port $port" "dir $dir"     "sentinel monitor $SENTINEL_MASTER 127.0.0.1 ${SENTINEL_DATA_PORTS[0]} 2"     "sentinel down-after-milliseconds $SENTINEL_MASTER 1000"     "sentinel failover-timeout $SENTINEL_MASTER 10000"     "sentinel parallel-syncs $SENTINEL_MASTER 1" >"$conf"
  redis-sentinel "$conf" --daemonize yes --pidfile "$pidfile" --logfile "$dir/sentinel.log" >/dev/null
  wait_for "sentinel on :$port" redis_ping "$port"
  log "sentinel up on :$port"
}

up_sentinel() {
  local primary=${SENTINEL_DATA_PORTS[0]} current port addr
  current=$primary
  if addr=$(sentinel_master_addr); then
    current=${addr#* }
  elif port=$(sentinel_conf_master); then
    current=$port # the sentinels are down: where they last saw the primary
  fi
  # The primary first, so that the replica finds it.
  start_redis "redis-sentinel/$current" "$current"
  for port in "${SENTINEL_DATA_PORTS[@]}"; do
    [ "$port" = "$current" ] || start_redis "redis-sentinel/$port" "$port" --replicaof 127.0.0.1 "$current"
  done
  for port in "${SENTINEL_PORTS[@]}"; do start_sentinel "$port"; done
  wait_for "Sentinel: master $SENTINEL_MASTER with $((${#SENTINEL_DATA_PORTS[@]} - 1)) replicas and 3 sentinels" sentinel_ok
  log "Sentinel up: master $SENTINEL_MASTER at $(sentinel_master_addr | tr ' ' :), sentinels :${SENTINEL_PORTS[*]}"
}

down_sentinel() {
  local port
  for port in "${SENTINEL_PORTS[@]}"; do stop_pid "redis-sentinel/$port" "$RUN/redis-sentinel/$port/sentinel.pid"; done
  for port in "${SENTINEL_DATA_PORTS[@]}"; do stop_pid "redis-sentinel/$port" "$RUN/redis-sentinel/$port/redis.pid"; done
}

# ---------------------------------------------------------------------------------------
# PostgreSQL (refuses to run as root: as root it runs as the system user postgres)
#
# The server's own files (data/, postgres.log) live in its "home": .run/postgres when the
# server's user can reach it (always when it is you; as root, when postgres can traverse the
# clone's path), else a directory of this clone alone, mktemp'd under $PG_STATE_BASE (not
# /tmp: a cleaner there would delete a data directory that sat unused for some days), linked
# from .run/postgres/home and naming its clone's .run in its file `owner`. The decision is
# recorded once (the link, or a data directory in place) and kept. The server has no unix
# socket (clients use 127.0.0.1): a socket path in a deep clone can pass the 107-byte limit,
# and the packages' /var/run/postgresql is not writable by a normal user.

# pg_home: the directory holding this stack's data/ and postgres.log; empty when
# .run/postgres/home links to a directory that another clone owns (a copy of a clone with
# its .run: `up` gives this one its own).
pg_home() {
  local link="$RUN/postgres/home" home
  if [ ! -L "$link" ]; then
    echo "$RUN/postgres"
  else
    home=$(readlink "$link")
    if [ "$(cat "$home/owner" 2>/dev/null || echo "$RUN")" = "$RUN" ]; then echo "$home"; fi
  fi
}

PGDATA_DIR() { local home; home=$(pg_home); if [ -n "$home" ]; then echo "$home/data"; fi; }

# as_pg COMMAND...: runs COMMAND as the server's user, from / (as postgres, the caller's
# working directory may be out of reach, and initdb and postgres complain about that).
as_pg() {
  if is_root; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

pg_ready() { "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }

# gc_pg_homes: deletes the server homes under $PG_STATE_BASE whose clone is gone (its .run
# no longer exists, e.g. the clone was deleted without `stack.sh purge`) and whose server
# does not run.
gc_pg_homes() {
  local home owner pid
  for home in "$PG_STATE_BASE"/*; do
    [ -f "$home/owner" ] || continue
    owner=$(cat "$home/owner")
    [ ! -d "$owner" ] || continue
    pid=$(head -1 "$home/data/postmaster.pid" 2>/dev/null || true)
    [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null || continue
    log "deleting $home: PostgreSQL files of $owner, which no longer exists"
    rm -rf -- "$home"
  done
}

# settle_pg_home (root only): makes sure the server's home exists and the user postgres can
# reach and write it, out of the clone when postgres cannot reach the clone.
settle_pg_home() {
  local link="$RUN/postgres/home" home owner
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/false postgres
  if [ -L "$link" ]; then
    home=$(readlink "$link")
    owner=$(cat "$home/owner" 2>/dev/null || echo "$RUN")
    if [ "$owner" = "$RUN" ] || [ ! -d "$owner" ]; then
      # ours (or the clone was moved here): keep it, recreate it if it was deleted
      mkdir -p "$home"; echo "$RUN" >"$home/owner"; chown postgres "$home"; chmod 700 "$home"
      return 0
    fi
    log "$home belongs to the stack of $owner (this clone is a copy of it): a new one for this clone"
    rm -f "$link"
  else
    chown postgres "$RUN/postgres"
    if runuser -u postgres -- test -x "$RUN/postgres" -a -w "$RUN/postgres" 2>/dev/null; then return 0; fi
    [ ! -s "$RUN/postgres/data/PG_VERSION" ] ||
      die "the user postgres can no longer reach $RUN/postgres/data (was the clone moved?): move it back, or delete the stack's state with: $0 purge"
    chown root "$RUN/postgres"
  fi
  mkdir -p "$PG_STATE_BASE"; chmod 755 "$PG_STATE_BASE"
  home=$(mktemp -d "$PG_STATE_BASE/$(basename "$ROOT" | tr -c 'A-Za-z0-9._\n-' _).XXXXXXXX")
  echo "$RUN" >"$home/owner"
  chown postgres "$home"; chmod 700 "$home"
  ln -s "$home" "$link"
  log "the user postgres cannot reach $RUN: PostgreSQL's files go to $home (linked from $link)"
}

up_postgres() {
  local bin home data
  bin=$(pg_bindir) || die "no PostgreSQL server binaries found under /usr/lib/postgresql"
  mkdir -p "$RUN/postgres"
  if is_root; then
    settle_pg_home
    [ ! -d "$PG_STATE_BASE" ] || gc_pg_homes # after settle_pg_home: a moved clone keeps its data
  fi
  home=$(pg_home); data="$home/data"
  if [ -s "$data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    log "PostgreSQL already running on :$PG_PORT"
  elif port_open "$PG_PORT"; then
    pg_ready || die "port $PG_PORT is taken by something that is not PostgreSQL"
    log "reusing a PostgreSQL on :$PG_PORT that this stack did not start"
    return 0
  else
    if [ ! -s "$data/PG_VERSION" ]; then
      log "initdb $data"
      as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$RUN/postgres/initdb.log" 2>&1 ||
        as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$RUN/postgres/initdb.log" 2>&1 ||
        die "initdb failed: $(tail -5 "$RUN/postgres/initdb.log")"
    fi
    as_pg "$bin/pg_ctl" -D "$data" -l "$home/postgres.log" -w -t "$WAIT_S" start \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -c unix_socket_directories= -c fsync=on -c max_connections=200" >/dev/null ||
      die "PostgreSQL did not start: $(tail -5 "$home/postgres.log" 2>&1)"
  fi
  wait_for "PostgreSQL on :$PG_PORT" pg_ready
  local psql=(psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt)
  if [ "$("${psql[@]}" -c "select 1 from pg_roles where rolname='$PG_USER'")" != 1 ]; then
    "${psql[@]}" -c "create role $PG_USER login password '$PG_USER'"
  fi
  if [ "$("${psql[@]}" -c "select 1 from pg_database where datname='$PG_DB'")" != 1 ]; then
    "${psql[@]}" -c "create database $PG_DB owner $PG_USER"
  fi
  # The services' login. The migrations grant the group of this name what the services need
  # (migrations/00019_sealed_books.sql); the owner may not create roles, so it is made here.
  if [ "$("${psql[@]}" -c "select 1 from pg_roles where rolname='$PG_APP_USER'")" != 1 ]; then
    "${psql[@]}" -c "create role $PG_APP_USER login password '$PG_APP_USER'"
  fi
  log "PostgreSQL $("${psql[@]}" -c 'show server_version') up on :$PG_PORT, database $PG_DB"
}

# ---------------------------------------------------------------------------------------
# Apache Kafka on the machine's JDK: one KRaft node (broker + controller) on :9092, and a
# 3-node cluster (each node broker + controller) that `up-kafka-cluster` starts beside it.

# kafka_started DIR PORT: the node of DIR serves on PORT (its log says it started).
kafka_started() { port_open "$2" && grep -q 'Kafka Server started' "$1/kafka.log"; }

# kafka_node_props DIR NODE_ID PORT CONTROLLER_PORT VOTERS REPLICATION MIN_ISR: writes DIR's
# server.properties and log4j2.properties for one node of a layout: the single broker
# (VOTERS its own controller, REPLICATION 1) or a node of the cluster (three voters,
# REPLICATION 3, MIN_ISR 2: an acks=all write needs two replicas).
kafka_node_props() {
  local dir=$1 id=$2 port=$3 cport=$4 voters=$5 rf=$6 isr=$7
  mkdir -p "$dir/data"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
unclean.leader.election.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=1
EOF
  cat >"$dir/log4j2.properties" <<'EOF'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.clients.name = org.apache.kafka
logger.clients.level = WARN
EOF
}

# kafka_java DIR HEAP: sets JAVA_CMD to the java command line of DIR's node.
kafka_java() {
  JAVA_CMD=(java -Xms256m "-Xmx$2" -XX:+UseG1GC "-Dlog4j2.configurationFile=$1/log4j2.properties" -cp "$(kafka_libs)/*")
}

# kafka_format DIR HEAP CLUSTER_ID_FILE: formats DIR's storage once, with the cluster id in
# CLUSTER_ID_FILE (made when missing; the nodes of one cluster share it).
kafka_format() {
  local dir=$1 heap=$2 idfile=$3
  kafka_java "$dir" "$heap"
  [ ! -s "$dir/data/meta.properties" ] || return 0
  [ -s "$idfile" ] || "${JAVA_CMD[@]}" kafka.tools.StorageTool random-uuid >"$idfile"
  log "formatting Kafka storage of $dir (cluster id $(cat "$idfile"))"
  "${JAVA_CMD[@]}" kafka.tools.StorageTool format -t "$(cat "$idfile")" \
    -c "$dir/server.properties" >"$dir/format.log" 2>&1 || die "kafka storage format failed: $(tail -5 "$dir/format.log")"
}

# kafka_launch DIR HEAP: starts DIR's node from its properties, without waiting (the nodes
# of the cluster wait for each other's votes). The previous log is kept as kafka.log.1.
kafka_launch() {
  local dir=$1 heap=$2
  kafka_java "$dir" "$heap"
  [ ! -s "$dir/kafka.log" ] || mv "$dir/kafka.log" "$dir/kafka.log.1"
  : >"$dir/kafka.log"
  # A session of its own: killing the process group of whatever ran `make up` (a terminal's
  # job, a CI step) must not take the broker with it. setsid execs in place here (a
  # background job is no group leader), so $! is the broker's pid.
  setsid nohup "${JAVA_CMD[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 </dev/null &
  echo $! >"$dir/kafka.pid"
}

up_kafka() {
  local dir="$RUN/kafka"
  if alive "$dir/kafka.pid" && port_open "$KAFKA_PORT"; then
    log "Kafka already running on :$KAFKA_PORT (pid $(cat "$dir/kafka.pid"))"; return 0
  fi
  if port_open "$KAFKA_PORT"; then
    log "reusing a Kafka broker on :$KAFKA_PORT that this stack did not start"; return 0
  fi
  fetch_kafka
  kafka_node_props "$dir" 1 "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "1@127.0.0.1:$KAFKA_CONTROLLER_PORT" 1 1
  kafka_format "$dir" 1g "$dir/cluster-id"
  kafka_launch "$dir" 1g
  wait_for "Kafka $KAFKA_VERSION on :$KAFKA_PORT (log: $dir/kafka.log)" kafka_started "$dir" "$KAFKA_PORT"
  log "Kafka $KAFKA_VERSION up on :$KAFKA_PORT (pid $(cat "$dir/kafka.pid"))"
}

# The cluster: node N (1-3) in $RUN/kafka-cluster/N, on the N-th of KAFKA_CLUSTER_PORTS and
# KAFKA_CLUSTER_CONTROLLER_PORTS.
kafka_cluster_dir() { echo "$RUN/kafka-cluster/$1"; }

kafka_cluster_voters() {
  local i voters=()
  for i in 1 2 3; do voters+=("$i@127.0.0.1:${KAFKA_CLUSTER_CONTROLLER_PORTS[i - 1]}"); done
  (IFS=,; echo "${voters[*]}")
}

# kafka_cluster_node_up N: node N runs and serves.
kafka_cluster_node_up() {
  alive "$(kafka_cluster_dir "$1")/kafka.pid" && port_open "${KAFKA_CLUSTER_PORTS[$1 - 1]}"
}

kafka_cluster_ok() {
  local n
  for n in 1 2 3; do kafka_cluster_node_up "$n" || return 1; done
}

# start_kafka_node N: starts the cluster's node N unless it runs (writing its properties and
# formatting its storage the first time), without waiting for it.
start_kafka_node() {
  local n=$1 dir port
  case $n in 1|2|3) ;; *) die "no Kafka cluster node $n (1-3)" ;; esac
  dir=$(kafka_cluster_dir "$n"); port=${KAFKA_CLUSTER_PORTS[n - 1]}
  if kafka_cluster_node_up "$n"; then
    log "Kafka cluster node $n already running on :$port (pid $(cat "$dir/kafka.pid"))"; return 0
  fi
  ! port_open "$port" || die "port $port is taken by something this stack did not start"
  ! port_open "${KAFKA_CLUSTER_CONTROLLER_PORTS[n - 1]}" || die "port ${KAFKA_CLUSTER_CONTROLLER_PORTS[n - 1]} is taken by something this stack did not start"
  fetch_kafka
  kafka_node_props "$dir" "$n" "$port" "${KAFKA_CLUSTER_CONTROLLER_PORTS[n - 1]}" "$(kafka_cluster_voters)" 3 2
  kafka_format "$dir" 512m "$RUN/kafka-cluster/cluster-id"
  kafka_launch "$dir" 512m
}

wait_kafka_node() {
  local dir; dir=$(kafka_cluster_dir "$1")
  wait_for "Kafka cluster node $1 on :${KAFKA_CLUSTER_PORTS[$1 - 1]} (log: $dir/kafka.log)" kafka_started "$dir" "${KAFKA_CLUSTER_PORTS[$1 - 1]}"
  log "Kafka cluster node $1 up on :${KAFKA_CLUSTER_PORTS[$1 - 1]} (pid $(cat "$dir/kafka.pid"))"
}

up_kafka_cluster() {
  local n
  mkdir -p "$RUN/kafka-cluster"
  for n in 1 2 3; do start_kafka_node "$n"; done # all three before waiting: a node needs the votes of another
  for n in 1 2 3; do wait_kafka_node "$n"; done
}

# down_kafka_cluster: SIGTERM to the three nodes at once, then waits for each. One by one,
# the last node's controlled shutdown waited for a controller quorum that was gone, until
# stop_pid's SIGKILL 60 s later.
down_kafka_cluster() {
  local n pidfile
  for n in 1 2 3; do
    pidfile="$(kafka_cluster_dir "$n")/kafka.pid"
    ! alive "$pidfile" || kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
  done
  for n in 1 2 3; do stop_pid "kafka-cluster/$n" "$(kafka_cluster_dir "$n")/kafka.pid"; done
}

# ---------------------------------------------------------------------------------------

write_env() {
  mkdir -p "$RUN"
  {
    echo "# written by deploy/local/stack.sh; source it: . .run/env"
    echo "export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
    # The services connect as the app role; migrations (make migrate, -migrate) as the owner.
    echo "export DATABASE_URL=postgres://$PG_APP_USER:$PG_APP_USER@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
    echo "export DATABASE_MIGRATE_URL=postgres://$PG_USER:$PG_USER@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
    echo "export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT"
    # The broker's jars, for tests that run a private broker they can stop and start.
    [ ! -f "$(kafka_libs)/.complete" ] || echo "export KAFKA_LIBS=$(kafka_libs)"
    # axe-core for the browser tests' accessibility check (internal/testenv).
    [ ! -f "$(axe_js)" ] || echo "export METERGATE_AXE=$(axe_js)"
    # The Python SDK's virtualenv for its tests against admit (sdk/sdk_test.go).
    [ ! -x "$(python_venv)/bin/python" ] || echo "export METERGATE_PYTHON=$(python_venv)/bin/python"
    # The Cluster and Sentinel setups under the tests' own names (internal/testenv): the
    # binaries refuse REDIS_URL beside REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS, so a
    # shell that sourced this file starts them against the one Redis of REDIS_URL.
    if cluster_ok; then
      local addrs=() port
      for port in "${CLUSTER_PORTS[@]}"; do addrs+=("127.0.0.1:$port"); done
      echo "export METERGATE_TEST_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]}")"
    fi
    if sentinel_ok; then
      local saddrs=()
      for port in "${SENTINEL_PORTS[@]}"; do saddrs+=("127.0.0.1:$port"); done
      echo "export METERGATE_TEST_SENTINEL_ADDRS=$(IFS=,; echo "${saddrs[*]}")"
      echo "export METERGATE_TEST_SENTINEL_MASTER=$SENTINEL_MASTER"
    fi
    if kafka_cluster_ok; then
      local kaddrs=()
      for port in "${KAFKA_CLUSTER_PORTS[@]}"; do kaddrs+=("127.0.0.1:$port"); done
      echo "export KAFKA_CLUSTER_BROKERS=$(IFS=,; echo "${kaddrs[*]}")"
    fi
  } >"$RUN/env.tmp"
  mv "$RUN/env.tmp" "$RUN/env"
}

# stop_pid NAME PIDFILE: SIGTERM, wait up to 60 s, then SIGKILL.
stop_pid() {
  local name=$1 pidfile=$2 pid
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$name (pid $pid) ignored SIGTERM for 60s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
  log "$name stopped"
}

down() {
  stop_pid kafka "$RUN/kafka/kafka.pid"
  down_kafka_cluster
  local port
  for port in "${CLUSTER_PORTS[@]}"; do stop_pid "redis-cluster/$port" "$RUN/redis-cluster/$port/redis.pid"; done
  down_sentinel
  stop_pid redis "$RUN/redis/redis.pid"
  local data; data=$(PGDATA_DIR)
  if [ -n "$data" ] && [ -s "$data/postmaster.pid" ]; then
    local bin; bin=$(pg_bindir)
    as_pg "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    # pg_ctl only stops a server whose pid file is current; make sure by pid as well.
    if [ -s "$data/postmaster.pid" ]; then
      head -1 "$data/postmaster.pid" >"$RUN/postgres/postmaster.pid"
      stop_pid postgres "$RUN/postgres/postmaster.pid"
    fi
    log "postgres stopped"
  fi
}

status() {
  local port
  alive "$RUN/redis/redis.pid" && echo "redis        pid $(cat "$RUN/redis/redis.pid") :$REDIS_PORT" || echo "redis        down"
  for port in "${CLUSTER_PORTS[@]}"; do
    alive "$RUN/redis-cluster/$port/redis.pid" && echo "redis-$port   pid $(cat "$RUN/redis-cluster/$port/redis.pid")" || echo "redis-$port   down"
  done
  for port in "${SENTINEL_DATA_PORTS[@]}"; do
    alive "$RUN/redis-sentinel/$port/redis.pid" &&
      echo "redis-$port   pid $(cat "$RUN/redis-sentinel/$port/redis.pid") $(redis-cli -p "$port" role 2>/dev/null | head -1)" || echo "redis-$port   down"
  done
  for port in "${SENTINEL_PORTS[@]}"; do
    alive "$RUN/redis-sentinel/$port/sentinel.pid" && echo "sentinel-$port pid $(cat "$RUN/redis-sentinel/$port/sentinel.pid")" || echo "sentinel-$port down"
  done
  local data; data=$(PGDATA_DIR)
  [ -n "$data" ] && [ -s "$data/postmaster.pid" ] && echo "postgres     pid $(head -1 "$data/postmaster.pid") :$PG_PORT ($data)" || echo "postgres     down"
  alive "$RUN/kafka/kafka.pid" && echo "kafka        pid $(cat "$RUN/kafka/kafka.pid") :$KAFKA_PORT" || echo "kafka        down"
  local n
  for n in 1 2 3; do
    alive "$(kafka_cluster_dir "$n")/kafka.pid" && echo "kafka-$n      pid $(cat "$(kafka_cluster_dir "$n")/kafka.pid") :${KAFKA_CLUSTER_PORTS[n - 1]}" ||
      echo "kafka-$n      down"
  done
}

# verify_down: fails if any process started by this stack still runs (by recorded pid, or
# by a command line that names the state folder or PostgreSQL's home).
verify_down() {
  local left home; home=$(pg_home)
  left=$( (pgrep -af -- "$RUN"; [ -z "$home" ] || pgrep -af -- "$home") | sort -u | grep -v -e "stack.sh" -e pgrep || true)
  [ -z "$left" ] || die "still running after down:
$left"
  local port
  for port in "$REDIS_PORT" "${CLUSTER_PORTS[@]}" "${SENTINEL_DATA_PORTS[@]}" "${SENTINEL_PORTS[@]}" "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" \
    "${KAFKA_CLUSTER_PORTS[@]}" "${KAFKA_CLUSTER_CONTROLLER_PORTS[@]}"; do
    ! port_open "$port" || die "port $port still answers after down"
  done
  log "nothing started by the stack is running"
}

# purge: down, then deletes this clone's state: .run/ and PostgreSQL's home when it is
# elsewhere (the next `up` starts from empty databases; .cache/, the Kafka jars, stays).
purge() {
  down
  local home; home=$(pg_home)
  if [ -n "$home" ] && [ "$home" != "$RUN/postgres" ]; then
    log "deleting $home"; rm -rf -- "$home"
  fi
  log "deleting $RUN"; rm -rf -- "$RUN"
}

case "${1:-}" in
  up)
    install_missing
    start_redis redis "$REDIS_PORT"
    up_postgres
    up_kafka
    fetch_axe
    make_python_venv
    make_node_modules
    write_env
    ;;
  up-cluster)
    install_missing
    up_cluster_nodes
    write_env
    ;;
  up-sentinel)
    install_missing
    up_sentinel
    write_env
    ;;
  up-kafka-cluster)
    install_missing
    up_kafka_cluster
    write_env
    ;;
  start-kafka-node)
    [ $# -eq 2 ] || { echo "usage: $0 start-kafka-node 1|2|3" >&2; exit 2; }
    start_kafka_node "$2"
    wait_kafka_node "$2"
    ;;
  down) down ;;
  down-sentinel) down_sentinel; write_env ;;
  down-kafka-cluster) down_kafka_cluster; write_env ;;
  verify-down) verify_down ;;
  status) status ;;
  purge) purge ;;
  env) write_env; cat "$RUN/env" ;;
  fetch-axe) fetch_axe; write_env ;;
  *) echo "usage: $0 up|up-cluster|up-sentinel|up-kafka-cluster|start-kafka-node N|down|down-sentinel|down-kafka-cluster|verify-down|status|purge|env|fetch-axe" >&2; exit 2 ;;
esac

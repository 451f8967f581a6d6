#!/usr/bin/env bash
# idle.sh measures what idle tunnel clients cost their server in CPU over a whole minute, for tether
# beside stock frp and chisel, with the shared peers benchmark's adapters. The peers benchmark's own
# idle figure covers 10 s, less than one keepalive period of frpc (30 s) or of a tether client at
# frpc's ping rate: its window may hold none of their pings.
#
#   bench/idle.sh [-c CLIENTS] [-s SECONDS] [-r REPS] [-o OUTDIR]
#
#   -c CLIENTS  idle clients per server (default 100)
#   -s SECONDS  the measured window, a multiple of every ping period (default 60)
#   -r REPS     repetitions, the variants interleaved (default 1)
#   -o OUTDIR   where idle.jsonl and the processes' logs go (default results/idle-<time>)
#
# Variants: frp in TCP and HTTP-vhost mode, chisel, tether as it ships (two sessions a client, a
# ping every 10 s on each), tether pinging every 30 s as frpc does (--heartbeat-timeout=45s: as
# many pings as frp's, whose client and server both ping every 30 s) and that on one session, as
# frpc has. Each starts fresh; the window opens 5 s after its last client connected. One line per
# variant and repetition goes to OUTDIR/idle.jsonl; bench/compare.sh runs this and bench/report.py
# puts it into BENCHMARKS.md.
#
# Needs bin/tether (make build) and the peers benchmark installed, as bench/compare.sh does.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "bench/idle.sh: $*" >&2; exit 1; }
usage() { sed -n "7,12s/^# \{0,1\}//p" "$0"; }

CLIENTS=100 SECONDS_IDLE=60 REPS=1 OUT=""
while getopts "c:s:r:o:h" o; do
  case $o in
    c) CLIENTS=$OPTARG ;; s) SECONDS_IDLE=$OPTARG ;; r) REPS=$OPTARG ;; o) OUT=$OPTARG ;;
    h) usage; exit 0 ;; *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || die "unexpected argument '$1' (options: -c CLIENTS, -s SECONDS, -r REPS, -o OUTDIR)"
for v in CLIENTS SECONDS_IDLE REPS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "-${v:0:1} wants a positive whole number, not '${!v}'"
done

# shellcheck source=bench/locate.sh
source "$ROOT/bench/locate.sh"
[ -f "$BENCH_DIR/lib/common.sh" ] || die "no peers benchmark at $BENCH_DIR (set BENCH_DIR to the directory holding run.sh)"
BENCH_ROOT=$(cd "$BENCH_DIR" && pwd)
export TETHER_BIN=${TETHER_BIN:-$ROOT/bin/tether}
[ -x "$TETHER_BIN" ] || die "no $TETHER_BIN: run make build first"
for t in frps frpc chisel benchtool; do
  [ -x "$BENCH_ROOT/bin/$t" ] || die "peers not installed (no $t): run $BENCH_ROOT/install.sh once"
done

OUT=${OUT:-$ROOT/results/idle-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=$OUT/work; mkdir -p "$WORK"; : >"$WORK/pids"
# shellcheck source=/dev/null
source "$BENCH_ROOT/lib/common.sh"
trap kill_all_recorded EXIT
trap 'exit 130' INT TERM

# variant name, adapter, extra tether client flags
VARIANTS=(
  "frp-tcp frp-tcp -"
  "frp-http frp-http -"
  "chisel chisel -"
  "tether tether -"
  "tether-30s tether --heartbeat-timeout=45s"
  "tether-30s-1 tether --connections=1 --heartbeat-timeout=45s"
)

load_adapter() {
  unset -f a_setup a_server_start a_server_pid a_client_start a_client_pid a_server_stop a_server_kill9 \
           a_client_stop a_client_ready a_ready_count a_target a_versions
  source "$BENCH_ROOT/lib/adapter_defaults.sh"
  source "$BENCH_ROOT/adapters/$1.sh"
  AWORK=$WORK/$1; mkdir -p "$AWORK"
  if [ ! -f "$AWORK/.setup-done" ]; then a_setup && touch "$AWORK/.setup-done"; fi
}

# measure VARIANT REP: one server, CLIENTS idle clients, CPU over the window -> a line of idle.jsonl
measure() {
  local name=$1 rep=$2 i n ready=0 t0 s0 s1 c0=0 c1=0 pid ok=false url host
  log "rep $rep: $name: $CLIENTS clients, ${SECONDS_IDLE} s idle"
  a_server_start || { log "$name: server did not start; see $AWORK"; a_server_stop; return 1; }
  for i in $(seq 0 $((CLIENTS - 1))); do a_client_start "$i"; done
  t0=$(now_ns)
  for n in $(seq 1 600); do
    ready=$(a_ready_count "$CLIENTS")
    [ "$ready" -ge "$CLIENTS" ] && break
    [ $(( ($(now_ns) - t0) / 1000000000 )) -ge 120 ] && break
    sleep 0.2
  done
  sleep 5
  s0=$(cpu_ms "$(a_server_pid)")
  for i in $(seq 0 $((CLIENTS - 1))); do c0=$((c0 + $(cpu_ms "$(a_client_pid "$i")"))); done
  sleep "$SECONDS_IDLE"
  s1=$(cpu_ms "$(a_server_pid)")
  for i in $(seq 0 $((CLIENTS - 1))); do c1=$((c1 + $(cpu_ms "$(a_client_pid "$i")"))); done
  read -r url host <<<"$(a_target $((CLIENTS - 1)))"
  [ "$host" = - ] && host=""
  "$BIN/benchtool" waitok -url "$url/small" ${host:+-host "$host"} -timeout 10s -interval 5ms \
    >/dev/null && ok=true
  echo "{\"variant\":\"$name\",\"flags\":\"${TETHER_CLIENT_ARGS:-}\",\"rep\":$rep,\"clients\":$CLIENTS,\"ready\":$ready,\"seconds\":$SECONDS_IDLE,\"server_cpu_ms\":$((s1 - s0)),\"clients_cpu_ms\":$((c1 - c0)),\"traffic_ok\":$ok}" \
    >>"$OUT/idle.jsonl"
  for i in $(seq 0 $((CLIENTS - 1))); do pid=$(a_client_pid "$i"); [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; done
  sleep 1
  for i in $(seq 0 $((CLIENTS - 1))); do kill_pid "$(a_client_pid "$i")" TERM; done
  a_server_stop
}

wait_port_free "$BACKEND_PORT" 5 || die "port $BACKEND_PORT (the backend's) is busy: another benchmark is running"
spawn backend "$WORK/backend.log" "$BIN/benchtool" backend -addr "$BACKEND_ADDR"
wait_port "$BACKEND_PORT" 10 || die "the backend did not start; see $WORK/backend.log"
: >"$OUT/idle.jsonl"
for rep in $(seq 1 "$REPS"); do
  for v in "${VARIANTS[@]}"; do
    read -r name adapter args <<<"$v"
    [ "$args" = - ] && args=""
    TETHER_CLIENT_ARGS=$args load_adapter "$adapter"
    TETHER_CLIENT_ARGS=$args measure "$name" "$rep"
  done
done
echo "bench/idle.sh: wrote $OUT/idle.jsonl" >&2

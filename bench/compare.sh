#!/usr/bin/env bash
# compare.sh measures tether beside no tunnel, stock frp (HTTP vhost and TCP mode) and chisel in ONE
# run of the shared peers benchmark, then writes the result into BENCHMARKS.md. Slow streams run
# on their own right after it (OUTDIR/streams), each system freshly started: measured in the same
# processes after the bulk download, whose heap had already grown, every system's memory per
# stream comes out understated, and by different amounts. Idle server CPU is measured last, over a
# minute, by bench/idle.sh (OUTDIR/idle): the peers benchmark's own window of 10 s is shorter than
# frpc's keepalive period.
#
#   bench/compare.sh [-q] [-r REPS] [-m METRICS] [-o OUTDIR]
#
#   -q          quick mode (1 rep, short workloads; a smoke check, not figures to quote)
#   -r REPS     repetitions (default 3)
#   -m METRICS  comma list of rps,rate,bulk,streams,mem,setup,idle (default all)
#   -o OUTDIR   where the run's raw data, logs and summary go (default results/compare-<time>)
#
# Needs bin/tether (make build) and the peers benchmark, found at ../shared/bench beside the
# repository's main checkout or at $BENCH_DIR, installed once with its install.sh.
# `make bench-compare` builds and runs this.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CMDLINE="bench/compare.sh${*:+ $*}"
die() { echo "bench/compare.sh: $*" >&2; exit 1; }

# shellcheck source=bench/locate.sh
source "$ROOT/bench/locate.sh"
TETHER_BIN=$ROOT/bin/tether
PEERS=direct,frp-http,frp-tcp,chisel,tether

PASS=() IDLE_FLAGS=() OUT="" METRICS=rps,rate,bulk,streams,mem,setup,idle
while getopts "qr:m:o:h" o; do
  case $o in
    q) PASS+=(-q) IDLE_FLAGS=(-c 10 -s 30) ;; r) PASS+=(-r "$OPTARG") ;; m) METRICS=$OPTARG ;; o) OUT=$OPTARG ;;
    h) sed -n "5,10s/^# \{0,1\}//p" "$0"; exit 0 ;;
    *) sed -n "5,10s/^# \{0,1\}//p" "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || die "unexpected argument '$1' (options: -q, -r REPS, -m METRICS, -o OUTDIR)"
for m in ${METRICS//,/ }; do
  [[ ,rps,rate,bulk,streams,mem,setup,idle, == *,$m,* ]] || die "-m: no metric '$m' (rps,rate,bulk,streams,mem,setup,idle)"
done

[ -x "$BENCH_DIR/run.sh" ] || die "no peers benchmark at $BENCH_DIR (set BENCH_DIR to the directory holding run.sh)"
BENCH_DIR=$(cd "$BENCH_DIR" && pwd)
missing=""
for t in frps frpc chisel vegeta benchtool; do [ -x "$BENCH_DIR/bin/$t" ] || missing="$missing $t"; done
for t in wrk curl jq python3; do command -v "$t" >/dev/null || missing="$missing $t"; done
[ -z "$missing" ] || die "peers not installed (missing:$missing): run ../shared/bench/install.sh once ($BENCH_DIR/install.sh)"
[ -x "$TETHER_BIN" ] || die "no $TETHER_BIN: run make build first (or make bench-compare)"

OUT=${OUT:-$ROOT/results/compare-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# The peers benchmark's metrics other than slow streams in one run; the streams in a run of their
# own when there are others; idle CPU by bench/idle.sh.
PEERS_METRICS=$(tr , '\n' <<<"$METRICS" | grep -vx idle | paste -sd , -) || true
OTHERS=$(tr , '\n' <<<"$PEERS_METRICS" | grep -vx streams | paste -sd , -) || true
STREAMS_APART="" MAIN_METRICS=$PEERS_METRICS
if [[ ",$PEERS_METRICS," == *,streams,* && -n "$OTHERS" ]]; then
  STREAMS_APART=yes MAIN_METRICS=$OTHERS
fi
[ -n "$MAIN_METRICS" ] || die "-m idle alone: run bench/idle.sh, or add a metric of the peers benchmark"
RUN=("$BENCH_DIR/run.sh" -p "$PEERS" "${PASS[@]}" -m "$MAIN_METRICS" -o "$OUT")
STREAMS_RUN=("$BENCH_DIR/run.sh" -p "$PEERS" "${PASS[@]}" -m streams -o "$OUT/streams")
LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
run() {
  echo "bench/compare.sh: $*" >&2
  (cd "$ROOT" && TETHER_BIN=$TETHER_BIN "$@") || die "the benchmark run failed; logs of every process are in ${*: -1}/work"
  [ -s "${*: -1}/summary.json" ] || die "the run wrote no ${*: -1}/summary.json; see ${*: -1}/work"
}
run "${RUN[@]}"
RUN_CMD="TETHER_BIN=bin/tether ${RUN[*]}"
if [ -n "$STREAMS_APART" ]; then
  run "${STREAMS_RUN[@]}"
  RUN_CMD="$RUN_CMD, then ${STREAMS_RUN[*]}"
fi
if [[ ",$METRICS," == *,idle,* ]]; then
  IDLE_RUN=(bench/idle.sh "${IDLE_FLAGS[@]}" -o "$OUT/idle")
  echo "bench/compare.sh: ${IDLE_RUN[*]}" >&2
  (cd "$ROOT" && BENCH_DIR=$BENCH_DIR TETHER_BIN=$TETHER_BIN "${IDLE_RUN[@]}") ||
    die "the idle run failed; logs of every process are in $OUT/idle/work"
  RUN_CMD="$RUN_CMD, then ${IDLE_RUN[*]}"
fi

python3 "$ROOT/bench/report.py" "$OUT" "$ROOT/BENCHMARKS.md" "$CMDLINE" "$RUN_CMD" "$LOADAVG"
echo "bench/compare.sh: wrote BENCHMARKS.md from $OUT" >&2

# Sourced by bench/compare.sh and bench/idle.sh, with ROOT set to the repository's root: sets
# BENCH_DIR to the shared peers benchmark, which sits beside the repository's main checkout (not
# beside a worktree of it), unless BENCH_DIR is set already.
main_checkout() {
  local common
  common=$(git -C "$ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null) || { echo "$ROOT"; return; }
  dirname "$common"
}
BENCH_DIR=${BENCH_DIR:-$(main_checkout)/../shared/bench}

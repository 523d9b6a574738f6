#!/usr/bin/env bash
# The real-cluster stage (`make cluster-test`): bring the cluster up, build and import the images, run
# the cluster and e2e tests, then `make demo` and a cluster-down that must leave nothing (test_down).
#
# `--beside STAGE` (`make test`: integration) runs `make STAGE` at the same time as all of it. The
# cluster stage mostly waits (on pods, probes, helm) and the integration stage mostly computes: on
# two cores the two together take little longer than the cluster stage alone. STAGE's output goes to .run/STAGE.log and is printed when it ends; test_down
# runs only after it has ended, since it asserts that no service process is left on the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
beside=""
if [ "${1:-}" = "--beside" ]; then beside=${2:?--beside needs a stage}; shift 2; fi
[ $# -eq 0 ] || { echo "usage: $0 [--beside STAGE]" >&2; exit 2; }
BIN=.venv/bin

beside_pid=""
if [ -n "$beside" ]; then
  mkdir -p .run
  echo "[make test] $beside: running beside the cluster stage; its output follows when it ends (.run/$beside.log)"
  # as `make STAGE` alone would run: never pointed at the test cluster
  env -u KUBECONFIG STAGE_QUIET_FAILURE=1 tools/stage.sh "$beside" make --no-print-directory "$beside" \
    > ".run/$beside.log" 2>&1 &
  beside_pid=$!
fi
export KUBECONFIG=$PWD/.run/cluster/admin.kubeconfig
status=0
tests/cluster/up.sh && tests/cluster/images.sh --import || status=$?
if [ $status -eq 0 ]; then $BIN/pytest -q -m cluster tests/cluster || status=$?; fi
if [ $status -eq 0 ]; then $BIN/pytest -q -m e2e tests/e2e || status=$?; fi
if [ -n "$beside_pid" ]; then
  beside_status=0
  wait "$beside_pid" || beside_status=$?
  echo "[make test] --- $beside (ran beside the cluster stage) ---"
  cat ".run/$beside.log"
  echo "[make test] --- end of $beside ---"
  [ $beside_status -eq 0 ] || status=$beside_status
fi
if [ $status -eq 0 ]; then $BIN/pytest -q -m cluster_down tests/cluster/test_down.py || status=$?; fi
tests/cluster/down.sh || status=$?
exit $status

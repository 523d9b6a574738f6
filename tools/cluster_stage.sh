#!/usr/bin/env bash
# The real-cluster stage (`make cluster-test`): bring the cluster up, build and import the images, run
# the cluster and e2e tests, then the multi-node suites on the same cluster grown to four nodes, then
# `make demo` and, once the stages beside have ended, a cluster-down that must leave nothing (test_down).
#
# The e2e tests marked `isolated` (chart-testing's installs, the DRA module, the release) run on a second
# cluster, in network and mount namespaces of its own (tests/cluster/isolated.sh), at the same time as
# the cluster tests and the rest of the e2e suite on the first: both mostly wait on pods. That cluster
# goes down when its tests end; its output goes to .run/isolated.log and is printed after the demo,
# which runs as soon as the first cluster's suites end.
#
# `--beside "STAGE..."` (`make test`: integration-rest, integration-chart, unit) runs `make STAGE` for
# each, in that order, at the same time as all of it. The cluster stage mostly waits (on pods,
# probes, helm) and those stages mostly compute. One of them runs at a time while both clusters' e2e
# suites run, two once either cluster's have ended, all once both have
# (`.run/isolated.done`, `.run/e2e.done`); each also starts when the one before it ends. Integration
# first: the longest, in one process (its scheduling simulations and reduced benches run against
# deadlines). Unit last, on every core: begun only after all of integration, it
# once ended 135 s after the demo while the demo mostly waited and integration ran on one core (and
# unit first, integration ran on alone for its last five minutes with the cores 20 to 50 % idle).
# Unit at the same time as integration from the start, under SCHED_IDLE, was tried: the cores were 90 % busy
# (/proc/stat), unit got so little that it took 1,124 s and a test of its with a wall-clock wait
# failed, and the cluster stage took longer too.
# Why a slot rule of our own and not make's job server (`make -j N`) or its load limit (`make -l L`,
# GNU parallel's `--load`): the slots follow events (each cluster's suites ending), which neither
# can express, and a load-driven start is what the idle-cores rule measured (1c3b1a0, undone in
# ed305e7): with it make test took 871 s against 859 s without (docs/testing.md); a fixed -j starts
# every stage at once, which is the SCHED_IDLE arrangement measured above, or one at a time.
# Their output goes to .run/STAGE.log and is printed when they end; each runs even after a failed one,
# so that one failure does not hide another. test_down runs only after they have ended, since it
# asserts that no service process is left on the machine; when the cluster stage fails, the cluster
# goes down at once.
set -uo pipefail
cd "$(dirname "$0")/.."
beside=""
if [ "${1:-}" = "--beside" ]; then beside=${2:?--beside needs the stages}; shift 2; fi
[ $# -eq 0 ] || { echo "usage: $0 [--beside \"STAGE...\"]" >&2; exit 2; }
BIN=.venv/bin
# each step's time, printed when it ends: which chain is the long one, and where its time goes
began=$SECONDS
step_began=$SECONDS
step() { echo "[make test] step: $1: $((SECONDS - step_began)) s"; step_began=$SECONDS; }

# touched when the second cluster's e2e suites end, and when the first's do
ISOLATED_DONE=.run/isolated.done
E2E_DONE=.run/e2e.done
beside_slots() { echo $((1 + $([ -e "$ISOLATED_DONE" ] && echo 1 || echo 0) + $([ -e "$E2E_DONE" ] && echo 1 || echo 0))); }
run_beside() {
  local stage rc failed=0 pids=() running pid
  for stage in $beside; do
    while :; do  # a free slot: fewer stages running than beside_slots
      running=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=$((running + 1)); done
      [ "$running" -ge "$(beside_slots)" ] || break
      sleep 2
    done
    # as `make STAGE` alone would run: never pointed at the test cluster. At a lower CPU priority:
    # the cluster stage waits on the cluster's own processes (kubelet, API server, pods), which should
    # not queue behind these stages' test processes. make unit on every core, as alone.
    echo "[make test] $stage begins beside the cluster stage, at $((SECONDS - began)) s of it"
    nice -n 10 env -u KUBECONFIG STAGE_QUIET_FAILURE=1 tools/stage.sh "$stage" make --no-print-directory "$stage" \
      > ".run/$stage.log" 2>&1 &
    pids+=($!)
  done
  # each runs even after a failed one, so that one failure does not hide another
  for pid in "${pids[@]}"; do
    rc=0
    wait "$pid" || rc=$?
    [ $rc -eq 0 ] || [ $failed -ne 0 ] || failed=$rc
  done
  return $failed
}

rm -f "$ISOLATED_DONE" "$E2E_DONE"
beside_pid=""
if [ -n "$beside" ]; then
  mkdir -p .run
  for stage in $beside; do rm -f ".run/$stage.log"; done
  echo "[make test] $beside: running beside the cluster stage; the output follows when they end (.run/<stage>.log)"
  run_beside &
  beside_pid=$!
fi
export KUBECONFIG=$PWD/.run/cluster/admin.kubeconfig
ISOLATED_DIR=$PWD/.run/isolated-cluster
status=0
# The images build while the cluster comes up: up.sh mostly waits (on etcd, the API server, the
# kubelet, CoreDNS) and the build mostly computes; only the import needs the cluster. Its output
# follows up.sh's.
mkdir -p .run
tests/cluster/images.sh > .run/images-build.log 2>&1 &
images_pid=$!
tests/cluster/up.sh || status=$?
images_status=0
wait "$images_pid" || images_status=$?
cat .run/images-build.log
[ $status -ne 0 ] || status=$images_status
[ $status -ne 0 ] || tests/cluster/images.sh --import-only || status=$?
step "cluster up, images built beside it and imported"
isolated_pid=""
if [ $status -eq 0 ]; then
  echo "[make test] e2e -m isolated: on a second cluster beside the rest; the output follows when it ends (.run/isolated.log)"
  # setsid: its own process group, which a failure here stops at once
  setsid bash -c 'tests/cluster/isolated.sh up "$1" && tests/cluster/isolated.sh exec "$1" \
      .venv/bin/pytest -q -p no:cacheprovider -m "e2e and isolated" --durations=10 tests/e2e
    rc=$?
    # down at once, not when the first cluster'"'"'s suites end: an idle cluster still takes CPU
    tests/cluster/isolated.sh down "$1" || { [ $rc -ne 0 ] || rc=1; }
    touch "$2"
    exit $rc' _ "$ISOLATED_DIR" "$ISOLATED_DONE" > .run/isolated.log 2>&1 < /dev/null &
  isolated_pid=$!
fi
# --durations: where the stage's time goes, in every run's log, for whoever next makes it shorter
if [ $status -eq 0 ]; then $BIN/pytest -q -m cluster --durations=10 tests/cluster || status=$?; fi
step "cluster tests"
if [ $status -eq 0 ]; then $BIN/pytest -q -m "e2e and not isolated and not multinode" --durations=25 tests/e2e || status=$?; fi
step "e2e"
touch "$E2E_DONE"  # a stage beside still waiting may begin now, with the demo
[ $status -eq 0 ] || [ -z "$isolated_pid" ] || kill -TERM -- "-$isolated_pid" 2>/dev/null
# The suites whose subject is more than one node (-m multinode: the UltraServer group, scheduling between
# nodes, a mixed device-plugin/DRA cluster, a rolling upgrade, remediation) on the first cluster again,
# now as four real nodes of one simulated UltraServer (tests/cluster/nodes.sh): one layout that every
# one of them can use, brought up once, of today's driver (2.30.2: the firmware's verdict and heartbeat). Node 1 keeps its images; the other three import theirs. Then
# down again: the demo and test_down are about the single-node cluster `make cluster-up` gives (the
# demo brings it back up).
if [ $status -eq 0 ]; then
  tests/cluster/down.sh > .run/multinode-up.log 2>&1 \
    && ULTRASERVER=trn2u NODES=4 DRIVER_VERSION=2.30.2.0 tests/cluster/up.sh >> .run/multinode-up.log 2>&1 \
    && tests/cluster/images.sh --import-only >> .run/multinode-up.log 2>&1 || { status=$?; cat .run/multinode-up.log; }
  step "the cluster again, as four nodes of one UltraServer"
  if [ $status -eq 0 ]; then $BIN/pytest -q -m multinode --durations=10 tests/e2e || status=$?; fi
  step "e2e -m multinode"
  if [ $status -eq 0 ]; then tests/cluster/down.sh > .run/multinode-down.log 2>&1 || { status=$?; cat .run/multinode-down.log; }; fi
  step "the four nodes down"
fi
# test_down's `make demo` now, while the second cluster's suites and the stages beside may still run:
# only test_down's check that nothing is left must wait for them (their tests run the services too).
if [ $status -eq 0 ]; then
  echo "[make test] make demo (tools/demo.sh; its output: .run/demo.log)"
  if tools/demo.sh > .run/demo.log 2>&1; then
    export NEURON_DEMO_RAN=1
  else
    status=$?
    tail -60 .run/demo.log
    echo "[make test] make demo failed (exit $status); whole output: .run/demo.log"
  fi
  step "make demo"
fi
if [ -n "$isolated_pid" ]; then
  isolated_status=0
  wait "$isolated_pid" || isolated_status=$?
  step "waiting for e2e -m isolated"
  echo "[make test] --- e2e -m isolated (ran on the second cluster) ---"
  cat .run/isolated.log
  echo "[make test] --- end of e2e -m isolated ---"
  tests/cluster/isolated.sh down "$ISOLATED_DIR" || isolated_status=$?
  [ $status -ne 0 ] || status=$isolated_status
fi
touch "$ISOLATED_DONE"  # every stage beside still waiting begins now
downed=0
if [ $status -ne 0 ]; then  # test_down will not run: stop the cluster now, not after the stages beside
  tests/cluster/down.sh || true
  downed=1
fi
if [ -n "$beside_pid" ]; then
  beside_status=0
  wait "$beside_pid" || beside_status=$?
  step "waiting for $beside"
  for stage in $beside; do
    [ -f ".run/$stage.log" ] || { echo "[make test] $stage: did not run"; continue; }
    echo "[make test] --- $stage (ran beside the cluster stage) ---"
    cat ".run/$stage.log"
    echo "[make test] --- end of $stage ---"
  done
  [ $beside_status -eq 0 ] || status=$beside_status
fi
if [ $status -eq 0 ]; then $BIN/pytest -q -m cluster_down tests/cluster/test_down.py || status=$?; fi
[ $downed = 1 ] || tests/cluster/down.sh || status=$?
exit $status

#!/usr/bin/env bash
# Runs the same pytest selection N times in a row and stops at the first failure: the evidence that a
# test which trains is deterministic, not lucky. Usage: scripts/repeat_tests.sh N [pytest args...]
set -u
n="$1"; shift
for i in $(seq 1 "$n"); do
    if ! pytest -q -p no:cacheprovider "$@" > "/tmp/repeat_tests.$i.log" 2>&1; then
        echo "run $i of $n: FAILED (log /tmp/repeat_tests.$i.log)"; tail -30 "/tmp/repeat_tests.$i.log"; exit 1
    fi
    echo "run $i of $n: $(tail -1 "/tmp/repeat_tests.$i.log")"
done
echo "all $n runs passed"

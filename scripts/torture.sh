#!/usr/bin/env bash
# Long crash-torture run for release checks:
#   bash scripts/torture.sh --cycles 300 [--seed S] [--wal-buffer] [--pg N]
# Builds and installs like scripts/test.sh, then runs t/011_crash_torture.pl
# with that many crash cycles (--wal-buffer: with the persistent WAL buffer
# on /dev/shm; --pg: the PostgreSQL major version, default 15). The seed is
# printed so a failure can be replayed.
set -euo pipefail
cycles=300 seed= pg=15
while [ $# -gt 0 ]; do
    case "$1" in
        --cycles) cycles=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --wal-buffer) export TORTURE_WAL_BUFFER=1; shift ;;
        --pg) pg=$2; shift 2 ;;
        *) echo "usage: $0 [--cycles N] [--seed S] [--wal-buffer] [--pg N]" >&2; exit 2 ;;
    esac
done
export TORTURE_CYCLES=$cycles
[ -n "$seed" ] && export TORTURE_SEED=$seed
exec bash "$(dirname "$0")/test.sh" --pg "$pg" --tap t/011_crash_torture.pl

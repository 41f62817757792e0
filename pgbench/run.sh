#!/usr/bin/env bash
# The main job: installs what it needs, builds and installs the extension,
# then runs the experiments on a throwaway local cluster and writes
# pgbench/report/report.md with one PNG chart per experiment.
#   bash pgbench/run.sh                 quick scale (about 5 minutes once built)
#   bash pgbench/run.sh --scale full    the articles' sizes (--only 1,2,3,4,5,6: under half an hour; experiment 7 adds over an hour)
#   bash pgbench/run.sh --only 1,2      some experiments
#   bash pgbench/run.sh --pg 18         on another major version (15, 16, 17, 18;
#                                       installed by scripts/build_pg.sh the first time);
#                                       the report goes to pgbench/report/pg18
set -euo pipefail
source "$(dirname "$0")/../scripts/common.sh"
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --pg) select_pg "${2:?--pg needs a version}"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
if [ "$PG_MAJOR" != "$DEBIAN_PG_MAJOR" ]; then
    case " ${args[*]-} " in *" --out "*|*" --out="*) ;; *) args+=(--out "$REPO_ROOT/pgbench/report/pg$PG_MAJOR") ;; esac
fi
install_dependencies
build_and_install
# Debian's python3 has python3-matplotlib for the charts; harness.py takes
# the server's binaries from PGBIN.
export PGBIN
exec /usr/bin/python3 "$REPO_ROOT/pgbench/run.py" ${args[@]+"${args[@]}"}

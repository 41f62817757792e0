#!/usr/bin/env bash
# The main job: installs what it needs, builds and installs the extension,
# then runs the experiments on a throwaway local cluster and writes
# pgbench/report/report.md with one PNG chart per experiment.
#   bash pgbench/run.sh                 quick scale (about 8 minutes once built)
#   bash pgbench/run.sh --scale full    the articles' sizes (hours)
#   bash pgbench/run.sh --only 1,2      some experiments
set -euo pipefail
source "$(dirname "$0")/../scripts/common.sh"
install_dependencies
build_and_install
# Debian's python3 has python3-matplotlib for the charts.
exec /usr/bin/python3 "$REPO_ROOT/pgbench/run.py" "$@"

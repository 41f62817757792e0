#!/usr/bin/env bash
# Failover soak under Patroni (scripts/ha_torture.py says what it checks).
# Run as root on Debian 12:
#   bash scripts/ha_torture.sh [--no-build] [--failovers N] [--clients N] [--seconds S] [--seed N] [--power-cut-every N]
# Installs Patroni and etcd from Debian (patroni, etcd-server,
# python3-psycopg2), builds and installs the extension for PostgreSQL 15
# (Debian's; --no-build takes the installed one), then runs three
# PostgreSQL nodes under Patroni and one etcd, all on 127.0.0.1 (etcd
# 2479/2480, PostgreSQL 5541-5543, Patroni's REST API 8201-8203), as the
# postgres user, in a scratch directory removed at the end unless something
# failed. Everything it started is killed when it ends, whatever happens.
# Ends with `ha_torture: N passed, M failed`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_root

build=1 args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --failovers|--clients|--seconds|--seed|--power-cut-every) args+=("$1" "${2:?$1 needs a value}"); shift ;;
        *) echo "usage: $0 [--no-build] [--failovers N] [--clients N] [--seconds S] [--seed N] [--power-cut-every N]" >&2; exit 2 ;;
    esac
    shift
done

select_pg "$DEBIAN_PG_MAJOR"
install_packages patroni etcd-server python3-psycopg2
# The packages may start their own services (Debian's etcd on 2379): the
# soak uses ports of its own and leaves them alone.
if [ $build = 1 ]; then
    install_dependencies
    build_and_install
fi
for bin in patroni etcd; do
    command -v $bin >/dev/null || { echo "$bin not found after installing it" >&2; exit 1; }
done
for port in 2479 2480 5541 5542 5543 8201 8202 8203; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "port $port is in use: stop what listens there first" >&2
        exit 1
    fi
done

work=$(postgres_workdir ha)
status=0
# Debian's python3: the one python3-psycopg2 and Patroni are installed for.
/usr/bin/python3 "$REPO_ROOT/scripts/ha_torture.py" --work "$work" --bindir "$PGBIN" "${args[@]}" || status=$?
if [ $status = 0 ]; then
    rm -rf "$work"
else
    echo "(logs and data in $work)"
fi
exit $status

#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds and installs the
# extension, runs the Rust unit tests (WAL buffer format), the pg_regress
# tests (sql/, expected/), the Perl TAP tests (t/*.pl) as the postgres user
# and PostgreSQL's own regression suite with the library preloaded. Run as
# root on Debian 12.
#   bash scripts/test.sh                 the CI matrix (below): everything on
#                                        15, most on 18, the version-sensitive
#                                        part on 17 and 16 (builds 17 and 18
#                                        from source the first time)
#   bash scripts/test.sh --pg N          everything on one version (15, 16, 17, 18;
#                                        on 16, what its server cannot run is
#                                        reported as skipped: see select_pg)
#   bash scripts/test.sh --pg all        everything on 15, 16, 17 and 18
# Parts (combinable; with none given, all of them; without --pg, on 15):
#   --unit  Rust unit tests    --regress  pg_regress    --core  PostgreSQL's
#   own suite with the library preloaded (scripts/core_regress.sh)
#   --package  the Debian package alone (scripts/test_package.sh)
#   --ha  a short failover soak under Patroni (scripts/ha_torture.sh, on 15)
#   --tap [t/NNN_x.pl ...]  TAP (all or the named files; must come last)
set -euo pipefail
source "$(dirname "$0")/common.sh"

# The CI matrix (bash scripts/test.sh with no argument):
#   15   everything: unit, pg_regress, every TAP file, PostgreSQL's own suite
#        with the library preloaded, the Debian package test, and a short
#        failover soak under Patroni (two failovers)
#   18   pg_regress, every TAP file but the one that runs the experiments
#        (t/010: the runner, not the server, is what it tests; 2.5 minutes),
#        the crash torture with fewer cycles, and the Debian package test
#   17   pg_regress and the TAP files that depend most on the server's own
#        code paths (WAL writes and syncs, crash recovery, commit and
#        sequence internals, error reports)
#   16   the same but t/019, whose sequence paths 16 shares with 15 and 17
#        (from the pgserver wheel, without amcheck: see select_pg), and
#        t/012: 16.2 alone reads the synchronous-standby state as the
#        boolean of releases before 2025 (src/c/sync_standby.c)
# The Rust unit tests (the WAL buffer's format, the record's layout) run on
# 15 only: they test Rust code alone, and their debug build would cost each
# other version minutes. Each version's duration is printed with its counts.
CI_SECOND_PG=18
CI_SECOND_TORTURE_CYCLES=10
VERSION_TAP="t/002_forced.pl t/013_hardening.pl t/014_wal_buffer.pl t/016_error_reports.pl
  t/017_wal_buffer_shared.pl t/019_sequence_new_in_transaction.pl t/021_loss_budget.pl t/022_lost_commits.pl
  t/025_failed_statements.pl t/029_loss_budget_torture.pl t/033_power_cut_model.pl"
SECOND_PG_SKIPPED_TAP="t/010_experiments_report.pl"
VERSION_TAP_16="t/002_forced.pl t/012_replication.pl t/013_hardening.pl t/016_error_reports.pl t/017_wal_buffer_shared.pl
  t/021_loss_budget.pl t/022_lost_commits.pl t/025_failed_statements.pl
  t/029_loss_budget_torture.pl t/033_power_cut_model.pl"

pg_arg=
if [ "${1:-}" = --pg ]; then pg_arg=${2:?--pg needs a version: 15, 16, 17, 18 or all}; shift 2; fi

# Several versions: each runs in its own invocation; the totals are summed.
run_matrix() {
    local total_passed=0 total_failed=0 total_skipped=0 lines=() failures=() v args out status started took line
    while [ $# -gt 0 ]; do
        v=$1; args=$2; shift 2
        out=$(mktemp)
        started=$SECONDS
        set +e
        # shellcheck disable=SC2086
        bash "$0" --pg "$v" $args 2>&1 | tee "$out"
        status=${PIPESTATUS[0]}
        set -e
        took=$((SECONDS - started))
        summary=$(grep -E '^results: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$out" | tail -n1 || true)
        while IFS= read -r line; do failures+=("PostgreSQL $v: ${line#failed part: }"); done \
            < <(grep -E '^failed part: ' "$out" || true)
        rm -f "$out"
        if [ -z "$summary" ]; then summary="results: 0 passed, 1 failed, 0 skipped"; fi
        read -r p f k < <(echo "$summary" | sed 's/results: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped/\1 \2 \3/')
        if [ "$status" != 0 ] && [ "$f" = 0 ]; then f=1; fi
        total_passed=$((total_passed + p)); total_failed=$((total_failed + f)); total_skipped=$((total_skipped + k))
        lines+=("PostgreSQL $v${args:+ ($args)}: $p passed, $f failed, $k skipped in $((took / 60))m$((took % 60))s")
    done
    echo
    printf '%s\n' "${lines[@]}"
    # What failed, repeated here: CI shows only the tail of the log.
    if [ ${#failures[@]} -gt 0 ]; then printf 'failed: %s\n' "${failures[@]}"; fi
    echo "results: $total_passed passed, $total_failed failed, $total_skipped skipped"
    [ "$total_failed" = 0 ]
}

case "$pg_arg" in
    "")
        # Parts without --pg: on Debian's 15.
        if [ $# -gt 0 ]; then select_pg "$DEBIAN_PG_MAJOR"
        else
            second_tap=$(cd "$REPO_ROOT" && ls t/*.pl | grep -vxF -f <(echo $SECOND_PG_SKIPPED_TAP | tr ' ' '\n') | tr '\n' ' ')
            run_matrix 15 "" \
                "$CI_SECOND_PG" "--regress --package --torture-cycles $CI_SECOND_TORTURE_CYCLES --tap $second_tap" \
                17 "--regress --tap $(echo $VERSION_TAP)" \
                16 "--regress --tap $(echo $VERSION_TAP_16)"
            exit $?
        fi ;;
    all)
        args="$*"
        run_matrix 15 "$args" 16 "$args" 17 "$args" 18 "$args"
        exit $? ;;
    *) select_pg "$pg_arg" ;;
esac

run_unit=0 run_regress=0 run_tap=0 run_core=0 run_package=0 run_ha=0 tap_files=()
# Everything, on 15 with PostgreSQL's own suite; the package test where the
# major's server can be installed beside it (see scripts/test_package.sh).
if [ $# -eq 0 ]; then run_unit=1 run_regress=1 run_tap=1 run_core=1 run_package=1 run_ha=1; fi
while [ $# -gt 0 ]; do
    case "$1" in
        --unit) run_unit=1 ;;
        --regress) run_regress=1 ;;
        --core) run_core=1 ;;
        --package) run_package=1 ;;
        --ha) run_ha=1 ;;
        --torture-cycles) TORTURE_CYCLES=${2:?--torture-cycles needs a number}; shift ;;
        --tap) run_tap=1; shift; tap_files=("$@"); break ;;
        --pg) echo "--pg comes first: $0 --pg N [parts]" >&2; exit 2 ;;
        *) echo "usage: $0 [--pg 15|16|17|18|all] [--unit] [--regress] [--core] [--package] [--ha] [--torture-cycles N] [--tap [t/file.pl ...]]" >&2; exit 2 ;;
    esac
    shift
done

install_dependencies
build_and_install

passed=0 failed=0 skipped=0 failed_parts=()
work=$(postgres_workdir test)
# Servers killed by the crash tests cannot remove their dynamic shared
# memory segments: whatever appears in /dev/shm during the run and no
# process maps any more is removed at the end.
shm_before=$(ls /dev/shm 2>/dev/null | sort)
clean_shm() {
    local f
    for f in $(comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | sort)); do
        case "$f" in PostgreSQL.*|dd_*) ;; *) continue ;; esac
        grep -qs "/dev/shm/$f" /proc/[0-9]*/maps || rm -f "/dev/shm/$f"
    done
}
trap clean_shm EXIT
for part in sql expected t pgbench README.md docs CHANGELOG.md; do
    if [ -e "$REPO_ROOT/$part" ]; then cp -r "$REPO_ROOT/$part" "$work/"; fi
done
chown -R postgres: "$work"

if [ $run_unit = 1 ]; then
    log "Rust unit tests (cargo test --lib)"
    set +e
    cargo_pg test --lib 2>&1 | tee "$work/unit.log"
    unit_status=${PIPESTATUS[0]}
    set -e
    ok=$(awk '/^test result:/ { n += $4 } END { print n + 0 }' "$work/unit.log")
    bad=$(awk '/^test result:/ { n += $6 } END { print n + 0 }' "$work/unit.log")
    passed=$((passed + ${ok:-0})); failed=$((failed + ${bad:-0}))
    if [ "$unit_status" != 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
    if [ "$unit_status" != 0 ]; then
        failed_parts+=("unit: $(grep -E '^test .* FAILED$' "$work/unit.log" | sed 's/^test \(.*\) \.\.\. FAILED$/\1/' | tr '\n' ' ')")
    fi
fi

if [ $run_regress = 1 ]; then
    log "pg_regress"
    # Every sql/*.sql is a test; mode runs first (it creates the extension).
    tests="mode $(cd "$REPO_ROOT/sql" && ls *.sql | sed 's/\.sql$//' | grep -vx mode | tr '\n' ' ')"
    count=$(echo $tests | wc -w)
    if (cd "$work" && as_postgres "$PGXS/src/test/regress/pg_regress" \
            --temp-instance="$work/regress_instance" --temp-config="$work/sql/regress.conf" \
            --bindir="$PGBIN" --port=54391 --inputdir="$work" --outputdir="$work" \
            $tests); then
        passed=$((passed + count))
    else
        f=$(grep -cE '^(not ok|test .* FAILED|.* \.\.\. FAILED)' "$work/regression.out" 2>/dev/null || true)
        [ "${f:-0}" -gt 0 ] || f=$count
        failed=$((failed + f)); passed=$((passed + count - f))
        failed_parts+=("pg_regress: $(grep -E '(not ok|FAILED)' "$work/regression.out" 2>/dev/null | tr -s ' ' | tr '\n' ';')")
        echo "--- regression.diffs ---"; cat "$work/regression.diffs" || true
    fi
fi

if [ $run_tap = 1 ]; then
    log "TAP tests (prove)"
    if [ ${#tap_files[@]} -eq 0 ]; then
        tap_files=($(cd "$REPO_ROOT" && ls t/*.pl))
    fi
    # Files this version's server cannot run (PG_TAP_UNAVAILABLE, set by
    # select_pg) are reported as skipped, named or not.
    if [ -n "$PG_TAP_UNAVAILABLE" ]; then
        kept=()
        for f in "${tap_files[@]}"; do
            case " $PG_TAP_UNAVAILABLE " in
                *" $f "*) echo "skipped on PostgreSQL $PG_MAJOR: $f ($PG_TAP_UNAVAILABLE_WHY)"; skipped=$((skipped + 1)) ;;
                *) kept+=("$f") ;;
            esac
        done
        tap_files=(${kept[@]+"${kept[@]}"})
    fi
fi
if [ $run_tap = 1 ] && [ ${#tap_files[@]} -gt 0 ]; then
    mkdir -p "$work/tap"; chown postgres: "$work/tap"
    set +e
    # Counted by TAP::Harness's aggregator (scripts/tap_run.pl): skipped
    # tests and files that skip everything are reported as skipped (a
    # failure on CI unless allowed in TAP_ALLOW_SKIP), a file that dies or
    # misses its plan is a failure even when another file failed too.
    cp "$REPO_ROOT/scripts/tap_run.pl" "$work/"
    (cd "$work" && as_postgres env PATH="$PGBIN:$PATH" PGBIN="$PGBIN" \
        PERL5LIB="$PGXS/src/test/perl:$work/t" \
        PG_REGRESS="$PGXS/src/test/regress/pg_regress" \
        TESTDIR="$work/tap" REPO_WORK="$work" ${CI:+CI=$CI} ${TAP_ALLOW_SKIP:+TAP_ALLOW_SKIP="$TAP_ALLOW_SKIP"} \
        ${TORTURE_CYCLES:+TORTURE_CYCLES=$TORTURE_CYCLES} ${TORTURE_SEED:+TORTURE_SEED=$TORTURE_SEED} \
        ${TORTURE_WAL_BUFFER:+TORTURE_WAL_BUFFER=$TORTURE_WAL_BUFFER} \
        perl tap_run.pl "${tap_files[@]}") 2>&1 | tee "$work/prove.log"
    tap_status=${PIPESTATUS[0]}
    set -e
    summary=$(grep -E '^tap: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$work/prove.log" | tail -n1 || true)
    ok=$(echo "$summary" | sed -n 's/^tap: \([0-9]*\) passed.*/\1/p')
    bad=$(echo "$summary" | sed -n 's/^tap: [0-9]* passed, \([0-9]*\) failed.*/\1/p')
    skipped=$((skipped + $(echo "$summary" | sed -n 's/.* failed, \([0-9]*\) skipped.*/\1/p' | grep . || echo 0)))
    passed=$((passed + ${ok:-0})); failed=$((failed + ${bad:-0}))
    if [ "$tap_status" != 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
    while IFS= read -r line; do failed_parts+=("tap ${line#tap failed: }"); done \
        < <(grep -E '^tap failed: ' "$work/prove.log" || true)
    if [ "$tap_status" != 0 ] && [ ${#failed_parts[@]} = 0 ]; then failed_parts+=("tap: exit status $tap_status"); fi
fi

if [ $run_core = 1 ] && [ -n "$PG_CORE_UNAVAILABLE_WHY" ]; then
    echo "skipped on PostgreSQL $PG_MAJOR: PostgreSQL's own regression suite ($PG_CORE_UNAVAILABLE_WHY)"
    skipped=$((skipped + 1))
elif [ $run_core = 1 ]; then
    log "PostgreSQL's regression suite with the library preloaded (scripts/core_regress.sh)"
    set +e
    DD_PG_MAJOR=$PG_MAJOR bash "$REPO_ROOT/scripts/core_regress.sh" --no-build 2>&1 | tee "$work/core_regress.log"
    core_status=${PIPESTATUS[0]}
    set -e
    ok=$(sed -n 's/^core_regress: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$work/core_regress.log")
    bad=$(sed -n 's/^core_regress: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$work/core_regress.log")
    passed=$((passed + ${ok:-0})); failed=$((failed + ${bad:-0}))
    if [ "$core_status" != 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
    if [ "$core_status" != 0 ]; then failed_parts+=("core regression suite: see $work/core_regress.log"); fi
fi

if [ $run_package = 1 ] && [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ]; then
    log "META.json against the PGXN spec (scripts/check_meta.sh)"
    set +e
    bash "$REPO_ROOT/scripts/check_meta.sh" 2>&1 | tee "$work/meta.log"
    meta_status=${PIPESTATUS[0]}
    set -e
    ok=$(sed -n 's/^check_meta: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$work/meta.log")
    bad=$(sed -n 's/^check_meta: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$work/meta.log")
    passed=$((passed + ${ok:-0})); failed=$((failed + ${bad:-0}))
    if [ "$meta_status" != 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
    if [ "$meta_status" != 0 ]; then failed_parts+=("check_meta: $(grep -E '^(FAIL|not ok)' "$work/meta.log" | tr '\n' ';')"); fi
fi
if [ $run_package = 1 ]; then
    log "the Debian package alone (scripts/test_package.sh)"
    set +e
    bash "$REPO_ROOT/scripts/test_package.sh" --pg "$PG_MAJOR" 2>&1 | tee "$work/package.log"
    package_status=${PIPESTATUS[0]}
    set -e
    summary=$(grep -E '^results: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$work/package.log" | tail -n1 || true)
    read -r ok bad skip < <(echo "${summary:-results: 0 passed, 1 failed, 0 skipped}" \
        | sed 's/results: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped/\1 \2 \3/')
    passed=$((passed + ok)); failed=$((failed + bad)); skipped=$((skipped + skip))
    if [ "$package_status" != 0 ] && [ "$bad" = 0 ]; then failed=$((failed + 1)); fi
    if [ "$package_status" != 0 ]; then failed_parts+=("package: $(grep -E '^FAIL ' "$work/package.log" | tr '\n' ';') exit status $package_status"); fi
fi

if [ $run_ha = 1 ] && [ "$PG_MAJOR" != "$DEBIAN_PG_MAJOR" ]; then
    echo "skipped on PostgreSQL $PG_MAJOR: the Patroni soak (Patroni runs Debian's PostgreSQL $DEBIAN_PG_MAJOR)"
    skipped=$((skipped + 1))
elif [ $run_ha = 1 ]; then
    log "a short failover soak under Patroni (scripts/ha_torture.sh)"
    set +e
    bash "$REPO_ROOT/scripts/ha_torture.sh" --no-build --failovers "${HA_FAILOVERS:-2}" 2>&1 | tee "$work/ha.log"
    ha_status=${PIPESTATUS[0]}
    set -e
    ok=$(sed -n 's/^ha_torture: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$work/ha.log")
    bad=$(sed -n 's/^ha_torture: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$work/ha.log")
    passed=$((passed + ${ok:-0})); failed=$((failed + ${bad:-0}))
    if [ "$ha_status" != 0 ] && [ "${bad:-0}" = 0 ]; then failed=$((failed + 1)); fi
    if [ "$ha_status" != 0 ]; then failed_parts+=("ha_torture: $(grep -iE '^(FAIL|not ok)' "$work/ha.log" | tr '\n' ';') exit status $ha_status"); fi
fi

echo
# Logs are kept only when something failed; the last line is the summary.
if [ "$failed" = 0 ]; then
    rm -rf "$work"
else
    echo "(logs in $work)"
fi
echo "PostgreSQL $PG_MAJOR ($("$PG_CONFIG" --version))"
# Repeated at the end (and by the matrix): CI shows only the tail of the log.
if [ ${#failed_parts[@]} -gt 0 ]; then printf 'failed part: %s\n' "${failed_parts[@]}"; fi
echo "results: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]

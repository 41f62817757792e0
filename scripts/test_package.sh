#!/usr/bin/env bash
# The package test: the Debian package alone is enough. Run as root on
# Debian 12:
#   bash scripts/test_package.sh [--pg N] [--no-build]
# For one major version N (default 15):
#   1. builds the package with scripts/package.sh (into target/packages;
#      --no-build takes the one already there) and checks its control
#      fields, its files, their md5sums and its Installed-Size;
#   2. removes the source build's install from the server's directories
#      (what build_and_install put there);
#   3. with a PATH that has no cargo and no rustc: installs the package.
#      On 15, with dpkg -i on this machine (Debian's postgresql-15 satisfies
#      Depends). On 16, 17 and 18, whose servers here are not Debian
#      packages, `Depends: postgresql-N` cannot be met: apt must refuse it
#      (the installed postgresql-15 does not satisfy it), and dpkg installs
#      it into a throwaway root (dpkg --root) whose database holds this
#      machine's status of the packages it depends on and of postgresql-15:
#      dpkg -i must refuse it for the missing postgresql-N alone, then
#      --force-depends installs it, and the server's own directories get
#      links to the installed files. Then: dpkg -L lists exactly the
#      expected files; a fresh cluster with the library preloaded (and
#      sql/regress.conf's settings) starts and loads the packaged library;
#      CREATE EXTENSION; the pg_regress suite against that cluster
#      (installcheck); CREATE EXTENSION ... VERSION '0.1.0' and ALTER
#      EXTENSION ... UPDATE to the current version; another major's library
#      (from its package in target/packages, if built) is refused with an
#      error, not a crash; dpkg -r removes every file it installed;
#   4. reinstalls the source build (build_and_install), so that the rest of
#      the suite finds it (also after a failure).
# Ends with `results: N passed, M failed, K skipped`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_root

pg=$DEBIAN_PG_MAJOR build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --pg) pg=${2:?--pg needs a version}; shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "usage: $0 [--pg 15|16|17|18] [--no-build]" >&2; exit 2 ;;
    esac
done
select_pg "$pg"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
arch=$(dpkg --print-architecture)
pkg=postgresql-$PG_MAJOR-delayed-durability
pkgdir=${PACKAGE_DIR:-$REPO_ROOT/target/packages}
deb=$pkgdir/${pkg}_${version}-1_${arch}.deb
libdir=/usr/lib/postgresql/$PG_MAJOR/lib
extdir=/usr/share/postgresql/$PG_MAJOR/extension
docdir=/usr/share/doc/$pkg
port=54395
clean_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

passed=0 failed=0 skipped=0
check() {   # check OK|FAIL description
    if [ "$1" = OK ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    printf '%-4s %s\n' "$1" "$2"
}
ok_if() {   # ok_if "description" command...: OK when the command succeeds
    local what=$1; shift
    if "$@"; then check OK "$what"; else check FAIL "$what"; fi
}
skip() { skipped=$((skipped + 1)); printf 'SKIP %s\n' "$1"; }

# State for the cleanup, which runs on every exit.
work='' root='' installed_host=0 links=() source_removed=0 reinstalled=0 saved_path='' data=''
cleanup() {
    local status=$?
    if [ -n "$saved_path" ]; then export PATH=$saved_path; fi
    if [ -n "$data" ] && [ -f "$data/postmaster.pid" ]; then
        as_postgres "$PGBIN/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ $installed_host = 1 ] && dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
        dpkg -r "$pkg" >/dev/null 2>&1 || true
    fi
    local l
    for l in ${links[@]+"${links[@]}"}; do if [ -L "$l" ]; then rm -f "$l"; fi; done
    if [ -n "$root" ]; then rm -rf "$root"; fi
    if [ $source_removed = 1 ] && [ $reinstalled = 0 ]; then
        echo "reinstalling the source build after an interrupted run" >&2
        build_and_install || echo "could not reinstall the source build: run bash scripts/test.sh --pg $PG_MAJOR --regress" >&2
    fi
    if [ -n "$work" ]; then
        if [ "$failed" = 0 ] && [ "$status" = 0 ]; then rm -rf "$work"; else echo "(logs in $work)" >&2; fi
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The files the package must install, and nothing else.
expected=$( {
    echo "$libdir/delayed_durability.so"
    echo "$extdir/delayed_durability.control"
    echo "$extdir/delayed_durability--$version.sql"
    for f in "$REPO_ROOT"/extension/delayed_durability--*.sql; do echo "$extdir/${f##*/}"; done
    echo "$docdir/README"
    echo "$docdir/copyright"
} | LC_ALL=C sort -u)
nexpected=$(echo "$expected" | wc -l)

# 1. The package.
install_dependencies   # cargo and cargo-pgrx (package.sh, and the reinstall at the end)
if [ $build = 1 ]; then
    log "building the package (scripts/package.sh --pg $PG_MAJOR)"
    if bash "$REPO_ROOT/scripts/package.sh" --pg "$PG_MAJOR" --out "$pkgdir"; then
        check OK "scripts/package.sh --pg $PG_MAJOR built ${deb##*/}"
    else
        check FAIL "scripts/package.sh --pg $PG_MAJOR"
    fi
fi
if [ ! -f "$deb" ]; then
    check FAIL "no package $deb"
    echo "results: $passed passed, $failed failed, $skipped skipped"
    exit 1
fi
work=$(postgres_workdir package)
log "inspecting ${deb##*/}"
dpkg-deb --info "$deb" | sed -n '/^ Package:/,$p'
field() { dpkg-deb -f "$deb" "$1"; }
ok_if "Package: $pkg" test "$(field Package)" = "$pkg"
ok_if "Version: $version-1 (Cargo.toml's version)" test "$(field Version)" = "$version-1"
ok_if "Architecture: $arch" test "$(field Architecture)" = "$arch"
ok_if "Section: database, Priority: optional" test "$(field Section)/$(field Priority)" = database/optional
ok_if "Maintainer: $(field Maintainer)" test -n "$(field Maintainer)"
says_origin() { field Description | grep -q "Built against PostgreSQL $PG_MAJOR\."; }
ok_if "the description says which server build it was compiled against" says_origin
depends=$(field Depends)
entries=$(echo "$depends" | tr ',' '\n' | sed 's/^ *//; s/ *$//')
depends_on_server() { grep -qx "postgresql-$PG_MAJOR" <<< "$entries" && [[ $depends != *"|"* ]]; }
ok_if "Depends names postgresql-$PG_MAJOR, without alternatives ($depends)" depends_on_server
ok_if "Depends names no other major's server" \
    test -z "$(echo "$depends" | grep -oE 'postgresql-[0-9]+' | grep -vx "postgresql-$PG_MAJOR" || true)"
depends_on_libs() { grep -q '^libpmem1\b' <<< "$entries" && grep -q '^libc6\b' <<< "$entries"; }
ok_if "Depends has the libraries the library links (libpmem1, libc6)" depends_on_libs
extract=$work/extract control=$work/control
dpkg-deb -x "$deb" "$extract"
dpkg-deb -e "$deb" "$control"
ok_if "Installed-Size $(field Installed-Size) KiB is du's size of its files" \
    test "$(field Installed-Size)" = "$(du -sk "$extract" | cut -f1)"
contents=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }' | LC_ALL=C sort)
if [ "$contents" = "$expected" ]; then
    check OK "dpkg -c: exactly the $nexpected expected files"
else
    check FAIL "dpkg -c: not the expected files"; diff <(echo "$expected") <(echo "$contents") || true
fi
ok_if "every entry is owned by root:root" \
    test -z "$(dpkg-deb -c "$deb" | awk '$2 != "root/root"')"
md5sums_ok() {
    (cd "$extract" && md5sum --quiet -c "$control/md5sums") \
        && [ "$(awk '{ print "/" $2 }' "$control/md5sums" | LC_ALL=C sort)" = "$expected" ]
}
ok_if "md5sums covers every file and matches" md5sums_ok
no_runpath() { ! readelf -d "$extract$libdir/delayed_durability.so" | grep -qE 'RPATH|RUNPATH'; }
ok_if "the library has no run path into the build machine" no_runpath

# 2. The source build's install goes.
pkglibdir=$("$PG_CONFIG" --pkglibdir) server_extdir=$("$PG_CONFIG" --sharedir)/extension
if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ] && dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
    log "removing $pkg, left installed by an earlier run"
    dpkg -r "$pkg"
fi
log "removing the source build's install from $pkglibdir and $server_extdir"
source_removed=1
rm -f "$pkglibdir/delayed_durability.so" "$server_extdir/delayed_durability.control" \
    "$server_extdir"/delayed_durability--*.sql
ok_if "no delayed_durability file left in the server's directories" \
    test -z "$(ls "$pkglibdir"/delayed_durability* "$server_extdir"/delayed_durability* 2>/dev/null)"

# 3. Install and run, without Rust.
saved_path=$PATH
export PATH=$clean_path
hash -r
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    check FAIL "cargo or rustc is on the PATH ($PATH): $(command -v cargo rustc | paste -sd' ')"
else
    check OK "no cargo and no rustc on the PATH from here on ($PATH)"
fi
apt_out=$(apt-get -s -o Debug::NoLocking=1 install "$deb" 2>&1) && apt_status=0 || apt_status=$?
if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ]; then
    echo "install: dpkg -i on this machine (Debian's postgresql-$PG_MAJOR satisfies Depends)"
    apt_would_install() { [ "$apt_status" = 0 ] && grep -q "^Inst $pkg " <<< "$apt_out"; }
    ok_if "apt would install it, its dependencies met (apt-get -s install ./${deb##*/})" apt_would_install
    installed_host=1
    ok_if "dpkg -i ${deb##*/}" dpkg -i "$deb"
    is_installed() { dpkg-query "$@" -W -f='${Status}' "$pkg" | grep -qx 'install ok installed'; }
    ok_if "dpkg: $pkg is installed" is_installed
    base='' dpkg_opts=()
else
    echo "install: into a throwaway root with dpkg --root, since the PostgreSQL $PG_MAJOR server here is not a Debian package (Depends: postgresql-$PG_MAJOR cannot be met); the server's directories link to the installed files"
    apt_refuses() { [ "$apt_status" != 0 ] && grep -q "Depends: postgresql-$PG_MAJOR" <<< "$apt_out"; }
    ok_if "apt refuses it here: postgresql-$PG_MAJOR is not installed, and the installed postgresql-$DEBIAN_PG_MAJOR does not satisfy it" \
        apt_refuses
    root=$(mktemp -d /tmp/delayed_durability.pkgroot.XXXXXX)
    chmod 755 "$root"
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
    : > "$root/var/lib/dpkg/available"
    : > "$root/var/lib/dpkg/status"
    # This machine's status of what the package depends on (but the server)
    # and of the Debian server of another major.
    for p in $(echo "$entries" | sed 's/ .*//' | grep -vx "postgresql-$PG_MAJOR") "postgresql-$DEBIAN_PG_MAJOR"; do
        dpkg-query -s "$p" >> "$root/var/lib/dpkg/status" 2>/dev/null && echo >> "$root/var/lib/dpkg/status"
        touch "$root/var/lib/dpkg/info/$p.list" "$root/var/lib/dpkg/info/$p:$arch.list"
    done
    dpkg_opts=(--root="$root" --log=/dev/null)
    base=$root
    refused=$(dpkg "${dpkg_opts[@]}" -i "$deb" 2>&1) && refused_status=0 || refused_status=$?
    unmet=$(sed -n "s/^ $pkg depends on \([^;]*\);.*/\1/p" <<< "$refused" | paste -sd' ')
    ok_if "dpkg -i refuses it for postgresql-$PG_MAJOR alone (unmet: ${unmet:-none}); postgresql-$DEBIAN_PG_MAJOR does not satisfy it, this machine's libraries do" \
        test "$refused_status/$unmet" = "1/postgresql-$PG_MAJOR"
    ok_if "dpkg --root --force-depends -i ${deb##*/}" dpkg "${dpkg_opts[@]}" --force-depends -i "$deb"
    is_installed() { dpkg-query "$@" -W -f='${Status}' "$pkg" | grep -qx 'install ok installed'; }
    ok_if "dpkg: $pkg is installed in the throwaway root" is_installed --root="$root"
    ln -s "$root$libdir/delayed_durability.so" "$pkglibdir/"
    links+=("$pkglibdir/delayed_durability.so")
    for f in "$root$extdir"/*; do ln -s "$f" "$server_extdir/"; links+=("$server_extdir/${f##*/}"); done
fi
listed=$(dpkg ${dpkg_opts[@]+"${dpkg_opts[@]}"} -L "$pkg" | while read -r f; do [ -d "$base$f" ] || echo "$f"; done | LC_ALL=C sort || true)
if [ "$listed" = "$expected" ]; then
    check OK "dpkg -L lists exactly the $nexpected expected files"
else
    check FAIL "dpkg -L does not list the expected files"; diff <(echo "$expected") <(echo "$listed") || true
fi
all_there() { local f; for f in $listed; do [ -f "$base$f" ] || return 1; done; }
ok_if "every listed file is there" all_there

# A fresh cluster, the library preloaded, sql/regress.conf's settings.
data=$work/data
psql_() { as_postgres "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$work" -p "$port" -At "$@"; }
as_postgres "$PGBIN/initdb" -D "$data" -A trust -N > "$work/initdb.log" 2>&1 \
    || { cat "$work/initdb.log"; check FAIL "initdb"; exit 1; }
{
    echo
    cat "$REPO_ROOT/sql/regress.conf"
    echo "port = $port"
    echo "unix_socket_directories = '$work'"
    echo "listen_addresses = ''"
} >> "$data/postgresql.conf"
if as_postgres "$PGBIN/pg_ctl" -D "$data" -l "$work/server.log" -w -t 120 start >/dev/null; then
    check OK "a fresh cluster starts with shared_preload_libraries = 'delayed_durability' (sql/regress.conf)"
else
    check FAIL "the cluster does not start"; tail -20 "$work/server.log"; exit 1
fi
pid=$(head -n1 "$data/postmaster.pid")
mapped=$(grep -o '/[^ ]*delayed_durability[^ ]*\.so' "/proc/$pid/maps" | sort -u | paste -sd' ' || true)
ok_if "the server runs the packaged library ($mapped)" test "$mapped" = "$base$libdir/delayed_durability.so"
psql_ -d postgres -c "CREATE DATABASE dd_package"
ok_if "CREATE EXTENSION delayed_durability" psql_ -d dd_package -c "CREATE EXTENSION delayed_durability"
ok_if "extversion is $version, the library is preloaded" test "$(psql_ -d dd_package -c \
    "SELECT e.extversion || ' ' || s.library_preloaded FROM pg_extension e, delayed_durability_settings s
      WHERE e.extname = 'delayed_durability' AND s.datname = current_database()")" = "$version true"
want_versions=$(cd "$REPO_ROOT/extension" && ls delayed_durability--*.sql | sed 's/^delayed_durability--//; s/\.sql$//' \
    | tr -s '-' '\n' | grep -v '^$' | { cat; echo "$version"; } | sort -uV | paste -sd' ')
got_versions=$(psql_ -d postgres -c "SELECT version FROM pg_available_extension_versions
    WHERE name = 'delayed_durability'" | sort -V | paste -sd' ')
ok_if "versions available: $got_versions" test "$got_versions" = "$want_versions"
# pg_regress gets the cluster as its own temporary instance would be.
psql_ -d postgres -c "DROP DATABASE dd_package"

# pg_regress against this cluster: the install check.
log "pg_regress against the packaged install (installcheck)"
rdir=$work/regress
mkdir -p "$rdir"
cp -r "$REPO_ROOT/sql" "$REPO_ROOT/expected" "$rdir/"
chown -R postgres: "$rdir"
tests="mode $(cd "$REPO_ROOT/sql" && ls *.sql | sed 's/\.sql$//' | grep -vx mode | tr '\n' ' ')"
count=$(echo $tests | wc -w)
if (cd "$rdir" && as_postgres "$PGXS/src/test/regress/pg_regress" --host="$work" --port="$port" \
        --bindir="$PGBIN" --inputdir="$rdir" --outputdir="$rdir" --dbname=regression $tests); then
    passed=$((passed + count))
    echo "OK   pg_regress: $count tests against the packaged install"
else
    f=$(grep -cE '^(not ok|test .* FAILED|.* \.\.\. FAILED)' "$rdir/regression.out" 2>/dev/null || true)
    [ "${f:-0}" -gt 0 ] || f=$count
    failed=$((failed + f)); passed=$((passed + count - f))
    echo "FAIL pg_regress: $f of $count tests"
    echo "--- regression.diffs ---"; cat "$rdir/regression.diffs" 2>/dev/null || true
fi

# The update path from the first version.
psql_ -d postgres -c "CREATE DATABASE dd_update"
ok_if "CREATE EXTENSION delayed_durability VERSION '0.1.0'" \
    psql_ -d dd_update -c "CREATE EXTENSION delayed_durability VERSION '0.1.0'"
updates() {
    psql_ -d dd_update -c "ALTER EXTENSION delayed_durability UPDATE" \
        && [ "$(psql_ -d dd_update -c "SELECT extversion FROM pg_extension WHERE extname = 'delayed_durability'")" = "$version" ] \
        && psql_ -d dd_update -c "SELECT count(*) FROM delayed_durability_stats" >/dev/null
}
ok_if "ALTER EXTENSION delayed_durability UPDATE: 0.1.0 to $version" updates

# Another major's library: PostgreSQL refuses it with an error, and the
# server does not crash.
other=
for m in $SUPPORTED_PG_MAJORS; do
    f=$pkgdir/postgresql-$m-delayed-durability_${version}-1_${arch}.deb
    if [ "$m" != "$PG_MAJOR" ] && [ -f "$f" ]; then other=$m; break; fi
done
if [ -n "$other" ]; then
    dpkg-deb -x "$f" "$work/other"
    chown -R postgres: "$work/other"
    so=$work/other/usr/lib/postgresql/$other/lib/delayed_durability.so
    started=$(psql_ -d postgres -c "SELECT pg_postmaster_start_time()")
    load_out=$(psql_ -d postgres -c "LOAD '$so'" 2>&1) && load_status=0 || load_status=$?
    echo "LOAD of the PostgreSQL $other library: $(echo "$load_out" | head -n2 | paste -sd' ')"
    refused_load() { [ "$load_status" != 0 ] && grep -qE 'incompatible library|could not load library' <<< "$load_out"; }
    ok_if "PostgreSQL $PG_MAJOR refuses the PostgreSQL $other library with an error" refused_load
    no_crash() {
        [ "$(psql_ -d postgres -c "SELECT pg_postmaster_start_time()")" = "$started" ] \
            && ! grep -q 'terminated by signal' "$work/server.log"
    }
    ok_if "and does not crash (same postmaster, no backend killed by a signal)" no_crash
else
    skip "another major's library: no other major's package in $pkgdir (bash scripts/package.sh --pg all builds them)"
fi

ok_if "the cluster stops" as_postgres "$PGBIN/pg_ctl" -D "$data" -m fast -w stop
data=''

# Removal.
ok_if "dpkg -r $pkg" dpkg ${dpkg_opts[@]+"${dpkg_opts[@]}"} -r "$pkg"
installed_host=0
left=$(for f in $listed; do if [ -e "$base$f" ] || [ -L "$base$f" ]; then echo "$f"; fi; done)
ok_if "dpkg -r removed every file it had installed${left:+ (left: $(echo $left))}" test -z "$left"
ok_if "and $docdir" test ! -e "$base$docdir"
for l in ${links[@]+"${links[@]}"}; do rm -f "$l"; done
links=()
export PATH=$saved_path
hash -r

# 4. The source build again, for the rest of the suite.
build_and_install
reinstalled=1
source_there() {
    [ -f "$pkglibdir/delayed_durability.so" ] && [ ! -L "$pkglibdir/delayed_durability.so" ] \
        && [ -f "$server_extdir/delayed_durability--$version.sql" ] && [ ! -L "$server_extdir/delayed_durability.control" ]
}
ok_if "the source build is reinstalled" source_there

echo
echo "PostgreSQL $PG_MAJOR ($("$PG_CONFIG" --version)), package ${deb##*/}"
echo "results: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]

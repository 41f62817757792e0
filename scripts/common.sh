# Shared by scripts/*.sh and pgbench/run.sh: dependencies, build, install.
# Every step is idempotent, so the scripts can run on a fresh Debian 12
# machine or again on one that has everything.

PGRX_VERSION=0.18.1
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# PostgreSQL 15 is Debian 12's; the other majors are installed by
# scripts/build_pg.sh into this cache (outside the checkout, readable by the
# postgres user), together with their cargo target directories: 17 and 18
# built from Debian's source packages, 16 taken from the binaries of PyPI's
# pgserver wheel (no Debian suite reachable here has a 16 source package).
PG_BUILD_CACHE=${PG_BUILD_CACHE:-/var/cache/delayed_durability}
DEBIAN_PG_MAJOR=15
SUPPORTED_PG_MAJORS="15 16 17 18"
APT_PACKAGES="postgresql-$DEBIAN_PG_MAJOR postgresql-server-dev-$DEBIAN_PG_MAJOR libpq-dev postgresql-contrib libclang-dev clang
  libpmem-dev libipc-run-perl pkg-config build-essential procps python3 python3-matplotlib python3-yaml strace"

# Sets PG_MAJOR, PGBIN, PG_CONFIG and PGXS (the directory holding
# src/test/regress/pg_regress and src/test/perl) for one major version, and
# what of the suite that version's server cannot run, with the reason
# (scripts/test.sh reports those parts as skipped):
#   PG_TAP_UNAVAILABLE       t/ files       PG_TAP_UNAVAILABLE_WHY
#   PG_CORE_UNAVAILABLE_WHY  set when PostgreSQL's own suite cannot run
select_pg() {
    case "$1" in
        15|16|17|18) PG_MAJOR=$1 ;;
        *) echo "unsupported PostgreSQL major version: $1 (supported: $SUPPORTED_PG_MAJORS)" >&2; exit 2 ;;
    esac
    PG_TAP_UNAVAILABLE='' PG_TAP_UNAVAILABLE_WHY='' PG_CORE_UNAVAILABLE_WHY=''
    if [ "$PG_MAJOR" = 16 ]; then
        # The pgserver wheel has no contrib modules and PostgreSQL 16's
        # source is not reachable here (17's amcheck does not compile
        # against 16's headers): the tests that check relations with amcheck
        # cannot run, nor can PostgreSQL's own suite (its tests, regress.c
        # and contrib/spi come from the server's source tree).
        PG_TAP_UNAVAILABLE="t/011_crash_torture.pl t/014_wal_buffer.pl t/015_crash_torture_wal_buffer.pl t/027_wal_buffer_lifecycle.pl"
        PG_TAP_UNAVAILABLE_WHY="they check relations with amcheck, which the pgserver wheel of 16 lacks"
        PG_CORE_UNAVAILABLE_WHY="PostgreSQL 16's source tree (its regression tests, regress.c, contrib/spi) is not reachable here; the server comes from the pgserver wheel"
    fi
    if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ]; then
        PGBIN=/usr/lib/postgresql/$PG_MAJOR/bin
        PGXS=/usr/lib/postgresql/$PG_MAJOR/lib/pgxs
    else
        PGBIN=$PG_BUILD_CACHE/pg$PG_MAJOR/bin
        PGXS=$PG_BUILD_CACHE/pg$PG_MAJOR/lib/postgresql/pgxs
    fi
    PG_CONFIG=$PGBIN/pg_config
    # Not exported: PostgreSQL's own makefiles (build_pg.sh) take an
    # exported PGXS for an extension build.
}
# DD_PG_MAJOR passes the choice to a child script (PG_MAJOR itself is often
# set by container images for their own server).
select_pg "${DD_PG_MAJOR:-$DEBIAN_PG_MAJOR}"

# cargo arguments for the selected version. 15 builds into the checkout's
# target/ with the default feature; the others each get a target directory
# of their own in the cache, so switching versions never rebuilds another's.
cargo_pg() {
    local sub=$1; shift
    if [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ]; then
        (cd "$REPO_ROOT" && cargo $sub "$@")
    else
        (cd "$REPO_ROOT" && CARGO_TARGET_DIR="$PG_BUILD_CACHE/target-pg$PG_MAJOR" \
            cargo $sub "$@" --no-default-features --features "pg$PG_MAJOR")
    fi
}

# Servers refuse to run as root and a backtrace-enabled Rust runtime would
# append backtraces to error details: run them clean.
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

log() { printf '\n==> %s\n' "$*" >&2; }

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "run this as root: it installs packages and runs servers as the postgres user" >&2
        exit 1
    fi
}

# Installs the Debian packages given that are not installed yet.
install_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

install_dependencies() {
    need_root
    install_packages $APT_PACKAGES
    # Debian starts a default cluster on 5432; the scripts use their own.
    if [ -d /root/.cargo/bin ]; then export PATH="/root/.cargo/bin:$PATH"; fi
    if ! command -v cargo >/dev/null; then
        echo "cargo not found: install Rust (rustup) first" >&2
        exit 1
    fi
    if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx $PGRX_VERSION" ]; then
        log "installing cargo-pgrx $PGRX_VERSION (a few minutes)"
        cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    fi
    if [ "$PG_MAJOR" != "$DEBIAN_PG_MAJOR" ]; then
        bash "$REPO_ROOT/scripts/build_pg.sh" "$PG_MAJOR"
    fi
    # pgrx keeps one pg_config per major in its config; init rewrites the
    # file, so it is given every version present.
    if ! grep -qs "^pg$PG_MAJOR *=" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
        local args=(--pg$DEBIAN_PG_MAJOR /usr/lib/postgresql/$DEBIAN_PG_MAJOR/bin/pg_config) v
        for v in $SUPPORTED_PG_MAJORS; do
            [ "$v" != "$DEBIAN_PG_MAJOR" ] && [ -f "$PG_BUILD_CACHE/pg$v/.complete" ] \
                && args+=(--pg$v "$PG_BUILD_CACHE/pg$v/bin/pg_config")
        done
        log "registering PostgreSQL with pgrx: ${args[*]}"
        cargo pgrx init "${args[@]}" >/dev/null
    fi
}

build_and_install() {
    log "building and installing delayed_durability (release) for PostgreSQL $PG_MAJOR"
    # Unlink instead of overwriting: a running server keeps its mapping of
    # the old library (overwritten in place, it could crash). Scripts of
    # other versions are removed so that only shipped ones remain.
    rm -f "$("$PG_CONFIG" --pkglibdir)/delayed_durability.so" \
        "$("$PG_CONFIG" --sharedir)"/extension/delayed_durability--*.sql
    cargo_pg pgrx install --release --pg-config "$PG_CONFIG" >&2
    # The update scripts and the full scripts of earlier versions live in
    # extension/ (sql/ holds only pg_regress tests); cargo pgrx installs the
    # current version's full script only.
    install -m 644 "$REPO_ROOT"/extension/*.sql "$("$PG_CONFIG" --sharedir)/extension/"
}

# A scratch directory the postgres user owns.
postgres_workdir() {
    local dir
    dir=$(mktemp -d "/tmp/delayed_durability.$1.XXXXXX")
    chmod 755 "$dir"
    chown postgres: "$dir"
    echo "$dir"
}

as_postgres() { runuser -u postgres -- env -u RUST_BACKTRACE "$@"; }

# Shared by scripts/*.sh and pgbench/run.sh: dependencies, build, install.
# Every step is idempotent, so the scripts can run on a fresh Debian 12
# machine or again on one that has everything.

PG_MAJOR=15
PGBIN=/usr/lib/postgresql/$PG_MAJOR/bin
PG_CONFIG=$PGBIN/pg_config
PGXS=/usr/lib/postgresql/$PG_MAJOR/lib/pgxs
PGRX_VERSION=0.18.1
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
APT_PACKAGES="postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR postgresql-contrib libclang-dev clang
  libpmem-dev libipc-run-perl pkg-config build-essential procps python3 python3-matplotlib strace"

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
    if ! grep -qs "pg$PG_MAJOR" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
        cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG" >/dev/null
    fi
}

build_and_install() {
    log "building and installing delayed_durability (release)"
    # Unlink instead of overwriting: a running server keeps its mapping of
    # the old library (overwritten in place, it could crash). Scripts of
    # other versions are removed so that only shipped ones remain.
    rm -f "$("$PG_CONFIG" --pkglibdir)/delayed_durability.so" \
        "$("$PG_CONFIG" --sharedir)"/extension/delayed_durability--*.sql
    (cd "$REPO_ROOT" && cargo pgrx install --release --pg-config "$PG_CONFIG") >&2
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

#!/usr/bin/env bash
# Installs a PostgreSQL major version that Debian 12 does not ship into a
# prefix under the cache:
#   bash scripts/build_pg.sh 18          ->  $CACHE/pg18/bin/pg_config
# 17 and 18 are built from Debian's own source package. The source comes
# through a private apt source list (trixie for 17, sid for 18): the
# machine's apt configuration is untouched and no binary package of another
# suite is installed (they would pull a newer libc). Each step leaves a
# stamp, so the script is idempotent and resumes where it stopped. The
# server is built with PostgreSQL's own flags (no Debian hardening: no
# -z now, lazy binding), TAP tests enabled, io_uring for 18, and amcheck
# installed.
# 16 has no source package in any Debian suite reachable here, and
# PostgreSQL's own download site is not reachable: its server, headers, PGXS
# and pg_regress are the binaries of PyPI's pgserver wheel (PostgreSQL 16.2,
# built by the pgserver project for manylinux2014 x86-64), checked against a
# pinned SHA-256; see install_pg16 below for what that build lacks.
# PG_BUILD_CACHE (default /var/cache/delayed_durability) holds source, build
# and prefix: servers run as the postgres user, which cannot enter /root.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_root

major=${1:-}
# suite: where apt finds the source; fallback: a Debian source version whose
# files are fetched straight from the pool when the suite's index names a
# version the mirror does not have (yet).
debian_source() {   # debian_source MAJOR: sets suite and fallback
    case "$1" in
        17) suite=trixie fallback=17.11-0+deb13u1 ;;
        18) suite=sid fallback=18.6-3 ;;
    esac
}
case "$major" in
    16) ;;
    17|18) debian_source "$major" ;;
    *) echo "usage: $0 16|17|18" >&2; exit 2 ;;
esac
jobs=${JOBS:-$(nproc)}
CACHE=${PG_BUILD_CACHE:-/var/cache/delayed_durability}
prefix=$CACHE/pg$major
build=$CACHE/build/pg$major
# The postgres user must reach the prefix, whatever the caller's umask.
install -d -m 755 "$CACHE" "$CACHE/build"
mkdir -p "$build"

# Fetches Debian's postgresql-MAJOR source package (suite and fallback as set
# by debian_source) into DIR, once (stamp DIR/.fetched).
fetch_debian_source() {
    local major=$1 dir=$2
    [ -f "$dir/.fetched" ] && return 0
    mkdir -p "$dir"
    log "fetching Debian's postgresql-$major source package ($suite) into $dir"
    local apt_dir=$CACHE/apt-$suite
    mkdir -p "$apt_dir/lists/partial"
    printf 'deb-src http://deb.debian.org/debian %s main\n' "$suite" > "$apt_dir/sources.list"
    local O=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$apt_dir/lists")
    apt-get "${O[@]}" update -qq >&2
    if ! (cd "$dir" && apt-get "${O[@]}" source --download-only "postgresql-$major") >&2; then
        log "apt could not fetch it; taking postgresql-$major $fallback from the pool, checked against its .dsc"
        local pool=https://deb.debian.org/debian/pool/main/p/postgresql-$major
        local dsc=postgresql-${major}_$fallback.dsc orig=postgresql-${major}_${fallback%%-*}.orig.tar.bz2
        (cd "$dir" && curl -fsSL -o "$dsc" "$pool/$dsc" && curl -fsSL -o "$orig" "$pool/$orig" \
            && sed -n '/^Checksums-Sha256:/,/^[^ ]/p' "$dsc" | awk -v f="$orig" '$3 == f { print $1 "  " f }' \
               | grep . | sha256sum -c -) >&2 || { echo "could not fetch the PostgreSQL $major source" >&2; exit 1; }
    fi
    touch "$dir/.fetched"
}

# PostgreSQL 16 from the pgserver wheel. Its binaries are relocatable
# (PostgreSQL finds share/ and lib/ relative to the executable, and the
# wheel's libpq is found through an $ORIGIN run path), so the wheel is
# unpacked as it is and $CACHE/pg16 is a link to its installation: no binary
# is modified. The wheel has no TAP modules and no contrib modules: the
# PostgreSQL::Test modules come from PostgreSQL 17's source (Debian's
# postgresql-17 source package, as for 17), whose Cluster.pm supports the
# installations of every major from 12 on; amcheck is missing (see
# select_pg in common.sh for the tests that cannot run).
PGSERVER_VERSION=0.1.4
PGSERVER_WHEEL=pgserver-$PGSERVER_VERSION-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
PGSERVER_SHA256=d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813
PGSERVER_PG_VERSION=16.2
TAP_MODULES_MAJOR=17
install_pg16() {
    local dest=$CACHE/pgserver-$PGSERVER_VERSION
    if [ -f "$prefix/.complete" ] && [ "$(readlink "$prefix")" = "${dest##*/}/pgserver/pginstall" ]; then
        log "PostgreSQL 16 already installed in $prefix ($("$prefix/bin/pg_config" --version), $(cat "$prefix/.origin"))"
        return 0
    fi
    if [ "$(uname -m)" != x86_64 ]; then
        echo "PostgreSQL 16 comes from the pgserver wheel, which exists for x86-64 Linux only (this is $(uname -m))" >&2
        exit 1
    fi
    install_packages unzip curl ca-certificates
    local pip=(python3 -m pip)
    if ! python3 -m pip --version >/dev/null 2>&1; then install_packages python3-pip; pip=(/usr/bin/python3 -m pip); fi
    if [ ! -f "$build/$PGSERVER_WHEEL" ]; then
        log "downloading $PGSERVER_WHEEL from PyPI"
        rm -rf "$build/download"
        # The wheel's binaries do not depend on the Python version: the
        # cp311 file is asked for whatever python3 runs pip.
        "${pip[@]}" download --quiet --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
            --python-version 3.11 --implementation cp --abi cp311 -d "$build/download" \
            "pgserver==$PGSERVER_VERSION" >&2
        [ -f "$build/download/$PGSERVER_WHEEL" ] || { echo "pip did not download $PGSERVER_WHEEL" >&2; exit 1; }
        mv "$build/download/$PGSERVER_WHEEL" "$build/" && rm -rf "$build/download"
    fi
    (cd "$build" && echo "$PGSERVER_SHA256  $PGSERVER_WHEEL" | sha256sum -c --quiet -) \
        || { echo "$build/$PGSERVER_WHEEL does not have the pinned SHA-256: remove it and run again" >&2; exit 1; }

    log "unpacking the wheel's PostgreSQL into $dest"
    local tmp
    tmp=$(mktemp -d "$CACHE/pgserver.XXXXXX")
    unzip -q "$build/$PGSERVER_WHEEL" 'pgserver/pginstall/*' 'pgserver.libs/*' -d "$tmp"
    local got
    got=$("$tmp/pgserver/pginstall/bin/pg_config" --version)
    [ "$got" = "PostgreSQL $PGSERVER_PG_VERSION" ] || { echo "the wheel's pg_config says '$got', not PostgreSQL $PGSERVER_PG_VERSION" >&2; exit 1; }

    # PostgreSQL::Test::* and PostgreSQL::Version from 17's source.
    debian_source "$TAP_MODULES_MAJOR"
    fetch_debian_source "$TAP_MODULES_MAJOR" "$CACHE/build/pg$TAP_MODULES_MAJOR"
    local orig
    orig=$(ls "$CACHE/build/pg$TAP_MODULES_MAJOR"/postgresql-${TAP_MODULES_MAJOR}_*.orig.tar.bz2 | sort -V | tail -n1)
    tar -xjf "$orig" -C "$tmp" --wildcards "postgresql-$TAP_MODULES_MAJOR.*/src/test/perl/*"
    local perl_src perl_dest=$tmp/pgserver/pginstall/lib/postgresql/pgxs/src/test/perl
    perl_src=$(ls -d "$tmp"/postgresql-$TAP_MODULES_MAJOR.*/src/test/perl | sort -V | tail -n1)
    mkdir -p "$perl_dest"
    cp -r "$perl_src/PostgreSQL" "$perl_dest/"
    [ -f "$perl_dest/PostgreSQL/Test/Cluster.pm" ] || { echo "no PostgreSQL/Test/Cluster.pm in $orig" >&2; exit 1; }
    rm -rf "$tmp"/postgresql-$TAP_MODULES_MAJOR.*
    echo "PostgreSQL::Test modules of PostgreSQL $(basename "$orig" .orig.tar.bz2 | sed 's/.*_//') ($(basename "$orig")), used with the $PGSERVER_PG_VERSION server" \
        > "$perl_dest/ORIGIN"
    echo "the pgserver $PGSERVER_VERSION wheel from PyPI (PostgreSQL $PGSERVER_PG_VERSION binaries built by the pgserver project for manylinux2014 x86-64)" \
        > "$tmp/pgserver/pginstall/.origin"

    rm -rf "$dest" && mv "$tmp" "$dest"
    chmod -R a+rX "$dest"
    if [ -e "$prefix" ] && [ ! -L "$prefix" ]; then rm -rf "$prefix"; fi
    ln -sfn "${dest##*/}/pgserver/pginstall" "$prefix.tmp" && mv -T "$prefix.tmp" "$prefix"
    # Every executable finds its libraries (libpq through the wheel's
    # $ORIGIN run path) and reports paths under the link's target.
    local missing
    missing=$(for b in "$prefix"/bin/*; do ldd "$b" | grep 'not found' | sed "s|^|$(basename "$b"): |"; done || true)
    [ -z "$missing" ] || { echo "unresolved libraries: $missing" >&2; exit 1; }
    touch "$prefix/.complete"
    log "PostgreSQL 16 ready: $prefix/bin/pg_config ($("$prefix/bin/pg_config" --version), $(cat "$prefix/.origin"); $(cat "$prefix/lib/postgresql/pgxs/src/test/perl/ORIGIN"))"
}
if [ "$major" = 16 ]; then
    install_pg16
    exit 0
fi

# 18's asynchronous I/O gets io_uring too, so that every io_method is tested.
configure_args=(--prefix="$prefix" --enable-tap-tests --enable-debug --with-icu)
packages=(bison flex libreadline-dev zlib1g-dev libicu-dev pkg-config build-essential libipc-run-perl dpkg-dev curl)
if [ "$major" -ge 18 ]; then configure_args+=(--with-liburing); packages+=(liburing-dev); fi
# A build made with other options is redone from a fresh source tree.
if [ -f "$build/.extracted" ] && [ "$(cat "$build/.configured" 2>/dev/null)" != "${configure_args[*]}" ]; then
    rm -f "$build/.extracted" "$build/.configured" "$build/.built" "$prefix/.complete"
fi

if [ -f "$prefix/.complete" ]; then
    log "PostgreSQL $major already built in $prefix ($("$prefix/bin/pg_config" --version))"
    exit 0
fi

install_packages "${packages[@]}"

fetch_debian_source "$major" "$build"

src=$(ls -d "$build"/postgresql-$major.*/ 2>/dev/null | sort -V | tail -n1 || true)
if [ -z "$src" ] || [ ! -f "$build/.extracted" ]; then
    log "extracting the upstream source"
    rm -rf "$build"/postgresql-$major.*/
    tar -xjf "$(ls "$build"/postgresql-${major}_*.orig.tar.bz2 | sort -V | tail -n1)" -C "$build"
    src=$(ls -d "$build"/postgresql-$major.*/ | sort -V | tail -n1)
    touch "$build/.extracted"
fi
src=${src%/}

if [ ! -f "$build/.configured" ]; then
    log "configuring $(basename "$src") for $prefix (${configure_args[*]})"
    (cd "$src" && ./configure "${configure_args[@]}" CFLAGS="-O2" >"$build/configure.log" 2>&1) \
        || { tail -30 "$build/configure.log" >&2; exit 1; }
    echo "${configure_args[*]}" > "$build/.configured"
fi

if [ ! -f "$build/.built" ]; then
    log "building PostgreSQL $major with $jobs jobs (about 5 minutes on 2 cores; log: $build/make.log)"
    (cd "$src" && make -j"$jobs" >"$build/make.log" 2>&1 \
        && make -C contrib/amcheck -j"$jobs" >>"$build/make.log" 2>&1) \
        || { tail -30 "$build/make.log" >&2; exit 1; }
    touch "$build/.built"
fi

log "installing into $prefix"
(cd "$src" && make install >"$build/install.log" 2>&1 && make -C contrib/amcheck install >>"$build/install.log" 2>&1) \
    || { tail -30 "$build/install.log" >&2; exit 1; }
# The servers run as postgres: the prefix must be readable (the cache is under /root).
chmod -R a+rX "$prefix"
# Where the server comes from, for the packages built against it (scripts/package.sh).
dsc=$(ls "$build"/postgresql-${major}_*.dsc 2>/dev/null | sort -V | tail -n1 || true)
echo "Debian's postgresql-$major source package${dsc:+ $(basename "$dsc" .dsc | sed 's/.*_//')}, built by scripts/build_pg.sh (${configure_args[*]:1})" \
    > "$prefix/.origin"
touch "$prefix/.complete"
log "PostgreSQL $major ready: $prefix/bin/pg_config ($("$prefix/bin/pg_config" --version))"

#!/usr/bin/env bash
# Builds a PostgreSQL major version that Debian 12 does not ship (17, 18)
# from Debian's own source package, into a prefix under the cache:
#   bash scripts/build_pg.sh 18          ->  $CACHE/pg18/bin/pg_config
# The source comes through a private apt source list (trixie for 17, sid for
# 18): the machine's apt configuration is untouched and no binary package of
# another suite is installed (they would pull a newer libc). Each step leaves
# a stamp, so the script is idempotent and resumes where it stopped. The
# server is built with PostgreSQL's own flags (no Debian hardening: no
# -z now, lazy binding), TAP tests enabled, io_uring for 18, and amcheck
# installed.
# PG_BUILD_CACHE (default /var/cache/delayed_durability) holds source, build
# and prefix: servers run as the postgres user, which cannot enter /root.
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_root

major=${1:-}
# suite: where apt finds the source; fallback: a Debian source version whose
# files are fetched straight from the pool when the suite's index names a
# version the mirror does not have (yet).
case "$major" in
    17) suite=trixie fallback=17.11-0+deb13u1 ;;
    18) suite=sid fallback=18.6-3 ;;
    *) echo "usage: $0 17|18" >&2; exit 2 ;;
esac
jobs=${JOBS:-$(nproc)}
CACHE=${PG_BUILD_CACHE:-/var/cache/delayed_durability}
prefix=$CACHE/pg$major
build=$CACHE/build/pg$major
# The postgres user must reach the prefix, whatever the caller's umask.
install -d -m 755 "$CACHE" "$CACHE/build"
mkdir -p "$build"

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

if [ ! -f "$build/.fetched" ]; then
    log "fetching Debian's postgresql-$major source package ($suite) into $build"
    apt_dir=$CACHE/apt-$suite
    mkdir -p "$apt_dir/lists/partial"
    printf 'deb-src http://deb.debian.org/debian %s main\n' "$suite" > "$apt_dir/sources.list"
    O=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$apt_dir/lists")
    apt-get "${O[@]}" update -qq >&2
    if ! (cd "$build" && apt-get "${O[@]}" source --download-only "postgresql-$major") >&2; then
        log "apt could not fetch it; taking postgresql-$major $fallback from the pool, checked against its .dsc"
        pool=https://deb.debian.org/debian/pool/main/p/postgresql-$major
        dsc=postgresql-${major}_$fallback.dsc orig=postgresql-${major}_${fallback%%-*}.orig.tar.bz2
        (cd "$build" && curl -fsSL -o "$dsc" "$pool/$dsc" && curl -fsSL -o "$orig" "$pool/$orig" \
            && sed -n '/^Checksums-Sha256:/,/^[^ ]/p' "$dsc" | awk -v f="$orig" '$3 == f { print $1 "  " f }' \
               | grep . | sha256sum -c -) >&2 || { echo "could not fetch the PostgreSQL $major source" >&2; exit 1; }
    fi
    touch "$build/.fetched"
fi

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
touch "$prefix/.complete"
log "PostgreSQL $major ready: $prefix/bin/pg_config ($("$prefix/bin/pg_config" --version))"

#!/usr/bin/env bash
# Binary packages for Debian, one per PostgreSQL major version, and the PGXN
# source distribution. Run as root on Debian 12, from a checkout:
#   bash scripts/package.sh --pg 15     postgresql-15-delayed-durability_<version>-1_<arch>.deb
#   bash scripts/package.sh --pg all    a .deb for each of 15, 16, 17 and 18, and the PGXN zip
#   bash scripts/package.sh --pgxn      delayed_durability-<version>.zip (git archive of HEAD
#                                       plus META.json), for PGXN
#   --out DIR                           where they go (default: target/packages in the checkout)
# Options combine (--pg 15 --pg 18 --pgxn); without any, --pg all.
#
# Each package is built with `cargo pgrx package` against that major's server
# (15: Debian's; 16, 17, 18: scripts/build_pg.sh's, which this script does not
# build: run it first) and laid out as Debian's own extension packages, in
# the paths where Debian's and apt.postgresql.org's postgresql-N servers
# look, whatever prefix the server it was compiled against has:
#   /usr/lib/postgresql/N/lib/delayed_durability.so
#   /usr/share/postgresql/N/extension/delayed_durability.control, and the SQL
#       scripts: this version's, the update scripts and the earlier versions'
#   /usr/share/doc/postgresql-N-delayed-durability/{copyright,README}
# Depends: postgresql-N (no other major's server provides that name) and the
# shared libraries the library links, as dpkg-shlibdeps finds them.
# Everything is built in a temporary directory and moved into the output
# directory at the end: a failure leaves nothing there. A major that is
# unknown, or whose server is not there, is refused before anything is built.
set -euo pipefail
source "$(dirname "$0")/common.sh"

usage() {
    echo "usage: $0 [--pg 15|16|17|18|all]... [--pgxn] [--out DIR]" >&2
    exit 2
}
majors=() pgxn=0 out=$REPO_ROOT/target/packages
while [ $# -gt 0 ]; do
    case "$1" in
        --pg)
            [ $# -ge 2 ] && [ -n "$2" ] || usage
            if [ "$2" = all ]; then majors+=($SUPPORTED_PG_MAJORS); pgxn=1; else majors+=("$2"); fi
            shift 2 ;;
        --pgxn) pgxn=1; shift ;;
        --out) [ $# -ge 2 ] && [ -n "$2" ] || usage; out=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) usage ;;
    esac
done
if [ ${#majors[@]} -eq 0 ] && [ $pgxn = 0 ]; then majors=($SUPPORTED_PG_MAJORS); pgxn=1; fi
# Each major once, in order.
majors=($(printf '%s\n' ${majors[@]+"${majors[@]}"} | awk '!seen[$0]++'))

# Refuse bad input before anything is built or written.
problems=()
for v in ${majors[@]+"${majors[@]}"}; do
    case " $SUPPORTED_PG_MAJORS " in
        *" $v "*) ;;
        *) problems+=("unknown PostgreSQL major version: $v (supported: $SUPPORTED_PG_MAJORS)"); continue ;;
    esac
    select_pg "$v"
    if [ "$v" = "$DEBIAN_PG_MAJOR" ]; then
        if [ ! -x "$PG_CONFIG" ] || [ ! -f "$("$PG_CONFIG" --includedir-server 2>/dev/null)/postgres.h" ]; then
            problems+=("no PostgreSQL $v server build: install Debian's postgresql-$v and postgresql-server-dev-$v (apt-get install postgresql-server-dev-$v)")
        fi
    elif [ ! -f "$PG_BUILD_CACHE/pg$v/.complete" ] || [ ! -x "$PG_CONFIG" ]; then
        problems+=("no PostgreSQL $v server build in $PG_BUILD_CACHE/pg$v: run bash scripts/build_pg.sh $v first")
    fi
done
if [ ${#problems[@]} -gt 0 ]; then
    printf '%s\n' "${problems[@]}" >&2
    echo "nothing was built" >&2
    exit 2
fi
need_root

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
[ -n "$version" ] || { echo "no version in Cargo.toml" >&2; exit 1; }
arch=$(dpkg --print-architecture)
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/delayed_durability.package.XXXXXX")
moving=()
cleanup() {
    rm -rf "$tmp"
    local f
    for f in ${moving[@]+"${moving[@]}"}; do rm -f "$f"; done
}
trap cleanup EXIT
# Reproducible timestamps: dpkg-deb clamps the files' times to this.
SOURCE_DATE_EPOCH=$(git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
maintainer=${DEB_MAINTAINER:-$(python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))["maintainer"]
print(m if isinstance(m, str) else m[0])' "$REPO_ROOT/META.json")}

# Where the server the package is compiled against comes from.
server_origin() {
    local v=$1 pgv dsc
    pgv=$("$PG_CONFIG" --version | awk '{ print $2 }')
    if [ "$v" = "$DEBIAN_PG_MAJOR" ]; then
        echo "PostgreSQL $pgv, Debian 12's postgresql-server-dev-$v $(dpkg-query -W -f='${Version}' "postgresql-server-dev-$v")"
    elif [ -f "$PG_BUILD_CACHE/pg$v/.origin" ]; then
        echo "PostgreSQL $pgv, from $(cat "$PG_BUILD_CACHE/pg$v/.origin")"
    elif dsc=$(ls "$PG_BUILD_CACHE/build/pg$v"/postgresql-${v}_*.dsc 2>/dev/null | sort -V | tail -n1) && [ -n "$dsc" ]; then
        echo "PostgreSQL $pgv, built by scripts/build_pg.sh from Debian's postgresql-$v source package $(basename "$dsc" .dsc | sed 's/.*_//')"
    else
        echo "PostgreSQL $pgv, built from source into $PG_BUILD_CACHE/pg$v"
    fi
}

# The Depends entries for the shared libraries a library links:
# dpkg-shlibdeps (dpkg-dev) when there is one, otherwise the packages
# owning the libraries the dynamic loader resolves (without versions).
shlib_depends() {   # shlib_depends WORKDIR PACKAGE-NAME SO (SO under WORKDIR/debian/PACKAGE-NAME)
    local work=$1 pkg=$2 so=$3 deps
    if command -v dpkg-shlibdeps >/dev/null; then
        mkdir -p "$work/debian"
        printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$pkg" "$pkg" > "$work/debian/control"
        deps=$(cd "$work" && dpkg-shlibdeps -O -e"${so#"$work"/}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
        rm -f "$work/debian/control"
        if [ -n "$deps" ]; then echo "$deps"; return 0; fi
    fi
    local soname path owner owners=()
    for soname in $(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(ldd "$so" | awk -v n="$soname" '$1 == n && $3 ~ /^\// { print $3 }')
        [ -n "$path" ] || path=$(ldconfig -p | awk -v n="$soname" '$1 == n { print $NF; exit }')
        [ -n "$path" ] || { echo "cannot resolve $soname, linked by $so" >&2; return 1; }
        owner=$(dpkg -S "$path" 2>/dev/null | head -n1 | cut -d: -f1 || true)
        [ -n "$owner" ] || owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -n1 | cut -d: -f1 || true)
        [ -n "$owner" ] || { echo "no Debian package owns $path ($soname, linked by $so)" >&2; return 1; }
        owners+=("$owner")
    done
    printf '%s\n' "${owners[@]}" | sort -u | paste -sd, | sed 's/,/, /g'
}

# Statically linked Rust crates and their licenses, for the copyright file.
crate_licenses() {
    local features=() host
    [ "$PG_MAJOR" = "$DEBIAN_PG_MAJOR" ] || features=(--no-default-features --features "pg$PG_MAJOR")
    host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')
    (cd "$REPO_ROOT" && cargo metadata --format-version 1 --locked ${host:+--filter-platform "$host"} \
        ${features[@]+"${features[@]}"} 2>/dev/null) | python3 -c '
import json, sys
m = json.load(sys.stdin)
pk = {p["id"]: p for p in m["packages"]}
nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
root = m["resolve"]["root"]
seen, todo = set(), [root]
while todo:   # normal dependencies of the library; build scripts and proc macros are not linked in
    for d in nodes[todo.pop()]["deps"]:
        if d["pkg"] in seen or not any(k["kind"] is None for k in d["dep_kinds"]):
            continue
        if any("proc-macro" in t["kind"] for t in pk[d["pkg"]]["targets"]):
            continue
        seen.add(d["pkg"]); todo.append(d["pkg"])
for p in sorted((pk[i] for i in seen), key=lambda p: p["name"]):
    print(" %s %s: %s" % (p["name"], p["version"], p.get("license") or "see the crate"))
' 2>/dev/null || true
}

# Builds one major's package into $tmp; sets built_deb.
build_deb() {
    local v=$1
    select_pg "$v"
    install_dependencies   # cargo-pgrx, and this major registered with pgrx
    local pkg=postgresql-$v-delayed-durability
    local deb=${pkg}_${version}-1_${arch}.deb
    local work=$tmp/pg$v
    local stage=$work/stage root=$work/debian/$pkg
    local origin
    origin=$(server_origin "$v")
    log "packaging delayed_durability $version for PostgreSQL $v ($origin)"
    mkdir -p "$stage"
    cargo_pg pgrx package --pg-config "$PG_CONFIG" --out-dir "$stage" >&2

    # What cargo pgrx staged, under the server's own paths: the library, the
    # control file and this version's script, and nothing else.
    local pkglibdir sharedir
    pkglibdir=$("$PG_CONFIG" --pkglibdir) sharedir=$("$PG_CONFIG" --sharedir)
    local so=$stage$pkglibdir/delayed_durability.so ext=$stage$sharedir/extension
    local staged expected
    staged=$(cd "$stage" && find . -type f | sed 's|^\.||' | LC_ALL=C sort)
    expected=$(printf '%s\n' "$pkglibdir/delayed_durability.so" "$sharedir/extension/delayed_durability--$version.sql" \
        "$sharedir/extension/delayed_durability.control" | LC_ALL=C sort)
    if [ "$staged" != "$expected" ]; then
        printf 'cargo pgrx package staged:\n%s\nexpected:\n%s\n' "$staged" "$expected" >&2
        exit 1
    fi
    grep -qx "default_version = '$version'" "$ext/delayed_durability.control" \
        || { echo "the staged control file does not name version $version" >&2; exit 1; }

    local libdir=/usr/lib/postgresql/$v/lib extdir=/usr/share/postgresql/$v/extension docdir=/usr/share/doc/$pkg
    install -d -m 755 "$root/DEBIAN" "$root$libdir" "$root$extdir" "$root$docdir"
    # Shared objects are not executable in Debian's packages.
    install -m 644 "$so" "$root$libdir/delayed_durability.so"
    install -m 644 "$ext/delayed_durability.control" "$ext/delayed_durability--$version.sql" "$root$extdir/"
    local f
    for f in "$REPO_ROOT"/extension/delayed_durability--*.sql; do
        [ ! -e "$root$extdir/${f##*/}" ] || { echo "extension/${f##*/} is also generated by pgrx" >&2; exit 1; }
        install -m 644 "$f" "$root$extdir/"
    done

    local years first last
    first=$(git -C "$REPO_ROOT" log --format=%ad --date=format:%Y 2>/dev/null | tail -n1 || true)
    last=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)
    years=${first:-$last}; [ "$years" = "$last" ] || years="$years-$last"
    {
        cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: delayed_durability
Upstream-Contact: $maintainer

Files: *
Copyright: $years, the delayed_durability authors
License: PostgreSQL

Files: usr/lib/postgresql/$v/lib/delayed_durability.so
Copyright: $years, the delayed_durability authors; the authors of the Rust crates below
License: PostgreSQL and the crates' licenses
Comment: The library statically links these Rust crates (crates.io), each
 under the license its authors give:
EOF
        crate_licenses | sed 's/^ $/ ./' | grep . || echo " (pgrx and its dependencies: see Cargo.lock in the source)"
        cat <<'EOF'

License: PostgreSQL
 Permission to use, copy, modify, and distribute this software and its
 documentation for any purpose, without fee, and without a written agreement
 is hereby granted, provided that the above copyright notice and this
 paragraph and the following two paragraphs appear in all copies.
 .
 IN NO EVENT SHALL THE AUTHORS BE LIABLE TO ANY PARTY FOR DIRECT, INDIRECT,
 SPECIAL, INCIDENTAL, OR CONSEQUENTIAL DAMAGES, INCLUDING LOST PROFITS,
 ARISING OUT OF THE USE OF THIS SOFTWARE AND ITS DOCUMENTATION, EVEN IF THE
 AUTHORS HAVE BEEN ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 .
 THE AUTHORS SPECIFICALLY DISCLAIM ANY WARRANTIES, INCLUDING, BUT NOT LIMITED
 TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 PURPOSE. THE SOFTWARE PROVIDED HEREUNDER IS ON AN "AS IS" BASIS, AND THE
 AUTHORS HAVE NO OBLIGATIONS TO PROVIDE MAINTENANCE, SUPPORT, UPDATES,
 ENHANCEMENTS, OR MODIFICATIONS.
EOF
    } > "$root$docdir/copyright"

    local versions
    versions=$(cd "$root$extdir" && ls delayed_durability--*--*.sql | sed -n 's/^delayed_durability--\([0-9.]*\)--.*/\1/p' | sort -uV | paste -sd' ')
    cat > "$root$docdir/README" <<EOF
delayed_durability $version for PostgreSQL $v
($pkg $version-1)

delayed_durability brings SQL Server's delayed durability to PostgreSQL: an
administrator-controlled trade between commit latency and durability (mode
disabled, allowed or forced, per database, role or cluster), a
per-transaction opt-in, durability per table, an explicit log flush,
sequences that never go backwards after a crash, statistics, a report of the
commits a crash lost, and a persistent WAL buffer.

Built against: $origin.
PostgreSQL keeps the interface between the server and its extensions stable
within a major version, so this library serves any PostgreSQL $v.x server
laid out as Debian's (Debian's or apt.postgresql.org's postgresql-$v
package). A server of another major version refuses to load it.

Enable it:
  1. In postgresql.conf (add it to any existing list), then restart the
     server (for Debian's clusters: systemctl restart postgresql@$v-main):
         shared_preload_libraries = 'delayed_durability'
  2. As a superuser, in each database that should have its functions and
     views, in a schema of its own:
         CREATE SCHEMA delayed_durability;
         CREATE EXTENSION delayed_durability SCHEMA delayed_durability;
  3. Set the policy, e.g. ALTER DATABASE shop SET delayed_durability.mode = 'allowed';
     and check it: SELECT * FROM delayed_durability_settings;
  Without the preload no policy is in force.

Upgrading from an earlier version: install this package, restart the server,
then in each database: ALTER EXTENSION delayed_durability UPDATE;
(the package has the update scripts from $versions).

Files:
  $libdir/delayed_durability.so
  $extdir/delayed_durability.control and delayed_durability--*.sql

Before removing the package: reset the settings, DROP EXTENSION in each
database, remove the library from shared_preload_libraries and restart. The
full guide (modes, settings, what a crash can lose, monitoring,
troubleshooting, uninstalling) is README.md and docs/ in the source
distribution.
EOF

    # Modes whatever the umask; md5sums; the control file.
    find "$root" -type d -exec chmod 755 {} +
    find "$root" -type f -exec chmod 644 {} +
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | LC_ALL=C sort \
        | xargs -d '\n' md5sum) > "$root/DEBIAN/md5sums"
    local depends size
    depends=$(shlib_depends "$work" "$pkg" "$root$libdir/delayed_durability.so")
    case ", $depends," in *", libpmem1"[," "]*) ;; *) echo "libpmem1 is not among the library's dependencies ($depends)" >&2; exit 1 ;; esac
    case ", $depends," in *", libc6"[," "]*) ;; *) echo "libc6 is not among the library's dependencies ($depends)" >&2; exit 1 ;; esac
    size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
    {
        echo "Package: $pkg"
        echo "Source: delayed-durability"
        echo "Version: $version-1"
        echo "Architecture: $arch"
        echo "Maintainer: $maintainer"
        echo "Installed-Size: $size"
        echo "Depends: postgresql-$v, $depends"
        echo "Section: database"
        echo "Priority: optional"
        echo "Description: delayed durability for PostgreSQL $v: a commit durability policy"
        fold -s -w 72 <<EOF | sed 's/ *$//; s/^/ /'
SQL Server's delayed durability for PostgreSQL $v: an administrator-controlled trade between commit latency and durability (per database, role or cluster), a per-transaction opt-in, durability per table, an explicit log flush, sequences that never go backwards after a crash, a report of the commits a crash lost, and a persistent WAL buffer. The library must be in shared_preload_libraries.
EOF
        echo " ."
        fold -s -w 72 <<EOF | sed 's/ *$//; s/^/ /'
Built against $origin. It installs into /usr/lib/postgresql/$v/lib and /usr/share/postgresql/$v/extension, where Debian's and apt.postgresql.org's postgresql-$v servers find extensions.
EOF
    } > "$root/DEBIAN/control"
    dpkg-deb --root-owner-group --build "$root" "$tmp/$deb" >&2
    dpkg-deb --info "$tmp/$deb" >/dev/null
    built_deb=$tmp/$deb
}

# The PGXN distribution: HEAD's tree under delayed_durability-<version>/,
# with the working tree's META.json (HEAD's when it is committed: they must
# then be the same).
build_pgxn() {
    bash "$REPO_ROOT/scripts/check_meta.sh" --quick >&2 \
        || { echo "META.json does not match the checkout (scripts/check_meta.sh --quick)" >&2; exit 1; }
    local zip=delayed_durability-$version.zip prefix=delayed_durability-$version/ args=()
    if git -C "$REPO_ROOT" cat-file -e HEAD:META.json 2>/dev/null; then
        if ! git -C "$REPO_ROOT" diff --quiet HEAD -- META.json; then
            echo "META.json differs from HEAD's: commit it (the zip is HEAD's tree)" >&2
            exit 1
        fi
    else
        args=(--add-file="$REPO_ROOT/META.json")
    fi
    if [ "$(git -C "$REPO_ROOT" show HEAD:Cargo.toml | sed -n 's/^version = "\(.*\)"$/\1/p' | head -n1)" != "$version" ]; then
        echo "Cargo.toml's version differs from HEAD's: commit it (the zip is HEAD's tree)" >&2
        exit 1
    fi
    log "PGXN distribution $zip (git archive of HEAD $(git -C "$REPO_ROOT" rev-parse --short HEAD)${args[*]:+ plus META.json from the working tree})"
    git -C "$REPO_ROOT" archive --format=zip --prefix="$prefix" ${args[@]+"${args[@]}"} -o "$tmp/$zip" HEAD
    python3 - "$tmp/$zip" "$prefix" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for need in ("META.json", "Cargo.toml", "delayed_durability.control"):
    assert sys.argv[2] + need in names, f"{need} missing from the zip"
assert all(n.startswith(sys.argv[2]) for n in names), "an entry outside the prefix"
EOF
    built_zip=$tmp/$zip
}

results=()
for v in ${majors[@]+"${majors[@]}"}; do
    build_deb "$v"
    results+=("$built_deb")
done
if [ $pgxn = 1 ]; then
    build_pgxn
    results+=("$built_zip")
fi

# Into the output directory, each file complete or not at all.
mkdir -p "$out"
for f in "${results[@]}"; do
    part=$out/.${f##*/}.part
    moving+=("$part")
    cp "$f" "$part"
    mv -f "$part" "$out/${f##*/}"
done
moving=()
echo
for f in "${results[@]}"; do
    case "$f" in
        *.deb) echo "$out/${f##*/}: $(dpkg-deb -f "$out/${f##*/}" Depends)" ;;
        *) echo "$out/${f##*/}" ;;
    esac
done

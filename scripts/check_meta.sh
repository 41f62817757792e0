#!/usr/bin/env bash
# Checks META.json, the PGXN distribution metadata, two ways:
#   spec     PGXN Meta Spec 1.0.0, with PGXN's own validator: the pgxn_meta
#            crate (its JSON schemas, compiled in), installed with
#            `cargo install` into the cache the first time (a minute or two)
#   project  what the schema cannot know: the version is Cargo.toml's (and
#            so the control file's), the name and file exist, the required
#            fields are there, the PostgreSQL range is the supported majors,
#            the cargo-pgrx version is the one the build uses
#   bash scripts/check_meta.sh            both
#   bash scripts/check_meta.sh --quick    the project checks only (no cargo;
#                                         scripts/package.sh --pgxn runs this)
# Ends with a line `check_meta: N passed, M failed`; exits non-zero on any failure.
set -euo pipefail
source "$(dirname "$0")/common.sh"

PGXN_META_VERSION=0.7.0
quick=0
case "${1:-}" in
    --quick) quick=1 ;;
    "") ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac
meta=$REPO_ROOT/META.json
passed=0 failed=0

if [ ! -f "$meta" ]; then
    echo "FAIL META.json is missing"
    echo "check_meta: 0 passed, 1 failed"
    exit 1
fi

# The project checks: Python's standard library only (json, tomllib).
set +e
python3 - "$REPO_ROOT" "$SUPPORTED_PG_MAJORS" "$PGRX_VERSION" <<'EOF' > "${TMPDIR:-/tmp}/check_meta.$$"
import json, os, re, sys, tomllib

root, majors, pgrx_version = sys.argv[1], [int(v) for v in sys.argv[2].split()], sys.argv[3]
results = []
def check(ok, what):
    results.append(ok)
    print(("ok   " if ok else "FAIL ") + what)

try:
    meta = json.load(open(os.path.join(root, "META.json"), encoding="utf-8"))
except ValueError as e:
    check(False, f"META.json is not valid JSON: {e}")
    sys.exit(0)
cargo = tomllib.load(open(os.path.join(root, "Cargo.toml"), "rb"))
name, version = cargo["package"]["name"], cargo["package"]["version"]

def get(path):
    node = meta
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node

# Required by the spec (1.0.0), and by this project.
for field in ["name", "version", "abstract", "maintainer", "license", "provides", "meta-spec",
              "meta-spec.version", "description", "tags", "release_status",
              "prereqs.runtime.requires.PostgreSQL", "prereqs.build.x_requires"]:
    value = get(field)
    check(value not in (None, "", [], {}), f"required field {field} is present")

check(meta.get("name") == name, f"name is Cargo.toml's package name ({name})")
check(meta.get("version") == version, f"version is Cargo.toml's ({meta.get('version')} = {version})")
provided = (meta.get("provides") or {}).get(name) or {}
check(provided.get("version") == version, f"provides.{name}.version is Cargo.toml's ({provided.get('version')} = {version})")
for key in ["file", "docfile"]:
    path = provided.get(key)
    check(bool(path) and os.path.isfile(os.path.join(root, path)), f"provides.{name}.{key} exists ({path})")

control = open(os.path.join(root, f"{name}.control")).read()
default = re.search(r"^default_version\s*=\s*'([^']*)'", control, re.M)
default = default.group(1) if default else None
check(default in ("@CARGO_VERSION@", version),
      f"the control file's default_version is Cargo.toml's version ({default})")
updates = [f for f in os.listdir(os.path.join(root, "extension")) if f.endswith(f"--{version}.sql") and f.count("--") == 2]
check(bool(updates) or version == "0.1.0", f"an update script reaches {version} ({', '.join(updates) or 'none'})")

check(get("meta-spec.version") == "1.0.0", "meta-spec version 1.0.0")
rng = get("prereqs.runtime.requires.PostgreSQL") or ""
lower, upper = f">= {min(majors)}.0.0", f"< {max(majors) + 1}.0.0"
check(lower in str(rng) and (upper in str(rng) or "<" not in str(rng)),
      f"runtime requires PostgreSQL {lower} (lowest supported major) and {upper} if bounded ({rng})")
pgrx_dep = str(cargo["dependencies"]["pgrx"]).lstrip("=")
x_pgrx = str((get("prereqs.build.x_requires") or {}).get("cargo-pgrx", ""))
check(x_pgrx.replace("==", "").strip() == pgrx_dep == pgrx_version,
      f"build x_requires cargo-pgrx {x_pgrx} is Cargo.toml's pgrx {pgrx_dep} and common.sh's {pgrx_version}")
EOF
status=$?
set -e
cat "${TMPDIR:-/tmp}/check_meta.$$"
passed=$(grep -c '^ok ' "${TMPDIR:-/tmp}/check_meta.$$" || true)
failed=$(grep -c '^FAIL ' "${TMPDIR:-/tmp}/check_meta.$$" || true)
rm -f "${TMPDIR:-/tmp}/check_meta.$$"
if [ "$status" != 0 ]; then echo "FAIL the project checks did not run (python3 exit $status)"; failed=$((failed + 1)); fi

if [ $quick = 0 ]; then
    # PGXN's validator: cargo install, once, into a directory of its own.
    tools=${PGXN_META_ROOT:-$PG_BUILD_CACHE/pgxn_meta-$PGXN_META_VERSION}
    if ! mkdir -p "$tools" 2>/dev/null || [ ! -w "$tools" ]; then
        tools=${XDG_CACHE_HOME:-$HOME/.cache}/delayed_durability/pgxn_meta-$PGXN_META_VERSION
        mkdir -p "$tools"
    fi
    validator=$tools/bin/pgxn_meta
    if [ "$("$validator" --version 2>/dev/null | awk '{ print $NF }' || true)" != "$PGXN_META_VERSION" ]; then
        for d in "${CARGO_HOME:-$HOME/.cargo}/bin" /root/.cargo/bin; do
            if [ -d "$d" ]; then PATH="$d:$PATH"; fi
        done
        if ! command -v cargo >/dev/null; then
            echo "FAIL PGXN's validator pgxn_meta $PGXN_META_VERSION is not installed and cargo is not available to install it"
            failed=$((failed + 1))
        else
            log "installing PGXN's validator: cargo install pgxn_meta --version $PGXN_META_VERSION --locked --root $tools"
            if ! cargo install pgxn_meta --version "$PGXN_META_VERSION" --locked --root "$tools" >&2; then
                echo "FAIL cargo install pgxn_meta $PGXN_META_VERSION failed"
                failed=$((failed + 1))
            fi
        fi
    fi
    if [ -x "$validator" ]; then
        if out=$(cd "$REPO_ROOT" && "$validator" META.json 2>&1); then
            echo "ok   PGXN Meta Spec 1.0.0: $out (pgxn_meta $PGXN_META_VERSION)"
            passed=$((passed + 1))
        else
            echo "FAIL PGXN Meta Spec 1.0.0 (pgxn_meta $PGXN_META_VERSION): $out"
            failed=$((failed + 1))
        fi
    fi
fi

echo "check_meta: $passed passed, $failed failed"
[ "$failed" = 0 ]

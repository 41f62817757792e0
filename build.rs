//! Compiles the few C functions of the extension (src/c/) against the
//! headers of the PostgreSQL version being built for, found the same way
//! pgrx finds them: PGRX_PG_CONFIG_PATH (set by cargo pgrx), or the pg_config
//! registered for the active `pgNN` feature in ~/.pgrx/config.toml.
//!
//! C is used where PostgreSQL code must run with no Rust frame in between
//! (hook trampolines: an error must reach PostgreSQL untouched) and where
//! the work is PostgreSQL's own macros (sequence page, critical section,
//! WAL record), which are clearer and safer in C than transcribed.

use pgrx_pg_config::{PgConfig, Pgrx};

const SOURCES: [&str; 9] = [
    "src/c/commit_record.c",
    "src/c/deliver_record.c",
    "src/c/hooks.c",
    "src/c/sequence_call.c",
    "src/c/sequence_page.c",
    "src/c/standby_budget.c",
    "src/c/sync_standby.c",
    "src/c/table_class.c",
    "src/c/wal_receiver.c",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-changed=src/c/sequence_page.h");
    println!("cargo:rerun-if-env-changed=PGRX_PG_CONFIG_PATH");
    let major = (13..=18)
        .find(|v| std::env::var(format!("CARGO_FEATURE_PG{v}")).is_ok())
        .ok_or("no pgNN feature is enabled")?;
    let pg_config = match PgConfig::from_env() {
        Ok(config) => config,
        Err(_) => Pgrx::from_config()?.get(&format!("pg{major}"))?,
    };
    if pg_config.major_version()? != major {
        return Err(format!("pg_config is not PostgreSQL {major}: set PGRX_PG_CONFIG_PATH").into());
    }
    let mut build = cc::Build::new();
    build.files(SOURCES).include(pg_config.includedir_server()?);
    for flag in pg_config.cppflags()?.to_string_lossy().split_whitespace() {
        build.flag(flag);
    }
    // The flags PostgreSQL itself is compiled with where its headers rely on
    // them; the shim's symbols stay inside the library.
    for flag in ["-fwrapv", "-fno-strict-aliasing", "-fexcess-precision=standard", "-fvisibility=hidden"] {
        build.flag_if_supported(flag);
    }
    build.flag_if_supported("-Wno-unused-parameter");
    // libpq-fe.h (deliver_record.c, which opens libpq at run time and links
    // nothing): the client headers of pg_config, then Debian's libpq-dev;
    // the server's headers come first.
    if let Ok(out) = std::process::Command::new(pg_config.path().ok_or("pg_config has no path")?).arg("--includedir").output() {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !dir.is_empty() {
            build.flag(format!("-idirafter{dir}"));
        }
    }
    build.flag("-idirafter/usr/include/postgresql");
    build.compile("delayed_durability_c");
    Ok(())
}

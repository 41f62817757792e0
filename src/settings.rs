//! What is in force, in one place: the cluster-wide settings as the
//! postmaster has them (postgresql.conf, ALTER SYSTEM, the command line;
//! never a database's or a role's), published in shared memory by the
//! settings' assign hooks in the postmaster, so that the view
//! `delayed_durability_settings` can show each database's effective mode
//! next to them; the LOG line at startup; the WARNING of CREATE/ALTER
//! EXTENSION when the library is not preloaded (its policy is then off,
//! though `SHOW delayed_durability.mode` shows a placeholder's value).

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, Ordering};

/// The settings the view shows, as the postmaster holds them.
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Setting {
    Mode,
    MaxLossBytes,
    MaxLossTime,
    TrackLostCommits,
}
const SETTINGS: usize = Setting::TrackLostCommits as usize + 1;

#[repr(C)]
struct Published {
    values: [AtomicI32; SETTINGS],
}

struct Postmaster {
    /// Values assigned before shared memory existed (the configuration is
    /// read before the library is loaded), copied there at attach.
    early: [Cell<i32>; SETTINGS],
    shared: Cell<*const Published>,
    /// The startup line was written (not again at a crash restart).
    logged: Cell<bool>,
}
// SAFETY: each server process runs this code on one thread only.
unsafe impl Sync for Postmaster {}
static POSTMASTER: Postmaster =
    Postmaster { early: [const { Cell::new(0) }; SETTINGS], shared: Cell::new(std::ptr::null()), logged: Cell::new(false) };

fn in_postmaster_or_standalone() -> bool {
    // SAFETY: reading a process-wide flag set at process start.
    !unsafe { pg_sys::IsUnderPostmaster }
}

/// Called by the assign hooks: only the postmaster's values are the
/// cluster's (a backend's include its database's and role's settings).
pub fn publish(setting: Setting, value: i32) {
    if !in_postmaster_or_standalone() {
        return;
    }
    POSTMASTER.early[setting as usize].set(value);
    let shared = POSTMASTER.shared.get();
    if !shared.is_null() {
        // SAFETY: the published struct lives in shared memory for the
        // server's life; its fields are atomics.
        unsafe { (*shared).values[setting as usize].store(value, Ordering::Relaxed) };
    }
}

pub unsafe extern "C-unwind" fn assign_mode(newval: std::ffi::c_int, _extra: *mut std::ffi::c_void) {
    publish(Setting::Mode, newval);
}
pub unsafe extern "C-unwind" fn assign_max_loss_bytes(newval: std::ffi::c_int, _extra: *mut std::ffi::c_void) {
    publish(Setting::MaxLossBytes, newval);
}
pub unsafe extern "C-unwind" fn assign_max_loss_time(newval: std::ffi::c_int, _extra: *mut std::ffi::c_void) {
    publish(Setting::MaxLossTime, newval);
}
pub unsafe extern "C-unwind" fn assign_track_lost_commits(newval: bool, _extra: *mut std::ffi::c_void) {
    publish(Setting::TrackLostCommits, newval as i32);
}

pub fn request_shared_memory() {
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Published>()) };
}

pub fn attach_shared_memory() {
    let shared =
        crate::shmem::init_struct(c"delayed_durability settings", std::mem::size_of::<Published>()) as *const Published;
    POSTMASTER.shared.set(shared);
    if in_postmaster_or_standalone() {
        for (i, early) in POSTMASTER.early.iter().enumerate() {
            // SAFETY: as in publish().
            unsafe { (*shared).values[i].store(early.get(), Ordering::Relaxed) };
        }
        if !POSTMASTER.logged.replace(true) {
            log_at_startup();
        }
    }
}

fn mode_name(ordinal: i32) -> &'static str {
    match ordinal {
        0 => "disabled",
        1 => "allowed",
        _ => "forced",
    }
}

/// At the first start, in the postmaster: the cluster-wide settings in the
/// log, so that what was in force is on record next to any crash.
fn log_at_startup() {
    let v = |s: Setting| POSTMASTER.early[s as usize].get();
    let path = crate::walbuf::WAL_BUFFER_PATH.get();
    let path = path.as_ref().map(|p| p.to_string_lossy().into_owned()).filter(|p| !p.is_empty());
    pgrx::log!(
        "delayed_durability: cluster-wide mode = {}, max_loss_bytes = {}, max_loss_time = {} ms, track_lost_commits = {}, wal_buffer_path = {} (ALTER DATABASE and ALTER ROLE settings apply to each new session on top)",
        mode_name(v(Setting::Mode)),
        v(Setting::MaxLossBytes),
        v(Setting::MaxLossTime),
        if v(Setting::TrackLostCommits) != 0 { "on" } else { "off" },
        path.as_deref().map_or("(none)".to_string(), |p| format!("\"{p}\""))
    );
}

/// The cluster-wide settings and whether the library is preloaded; the
/// view `delayed_durability_settings` puts each database's own settings
/// over them. Works without the preload (then only says so).
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_cluster_settings() -> TableIterator<
    'static,
    (
        name!(mode, Option<&'static str>),
        name!(max_loss_bytes, Option<i64>),
        name!(max_loss_time_ms, Option<i64>),
        name!(track_lost_commits, Option<bool>),
        name!(library_preloaded, bool),
    ),
> {
    let shared = POSTMASTER.shared.get();
    if !crate::preload::preloaded() || shared.is_null() {
        return TableIterator::once((None, None, None, None, false));
    }
    // SAFETY: as in publish().
    let v = |s: Setting| unsafe { (*shared).values[s as usize].load(Ordering::Relaxed) };
    let all = all_roles_settings();
    TableIterator::once((
        Some(all.0.unwrap_or(mode_name(v(Setting::Mode)))),
        Some(all.1.unwrap_or(v(Setting::MaxLossBytes) as i64)),
        Some(all.2.unwrap_or(v(Setting::MaxLossTime) as i64)),
        Some(all.3.unwrap_or(v(Setting::TrackLostCommits) != 0)),
        true,
    ))
}

/// `ALTER ROLE ALL SET` (database 0, role 0 in pg_db_role_setting):
/// PostgreSQL applies it to every session over postgresql.conf and ALTER
/// SYSTEM, so it is part of the cluster-wide value a database's own
/// setting overrides. Each value is read by the setting's own parser.
fn all_roles_settings() -> (Option<&'static str>, Option<i64>, Option<i64>, Option<bool>) {
    const QUERY: &str = r"
SELECT max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.mode=%'),
       max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_bytes=%'),
       max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_time=%'),
       max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.track\_lost\_commits=%')
  FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
 WHERE r.setdatabase = 0 AND r.setrole = 0";
    // A read-only query: Spi::get_one() would assign a transaction id.
    let row = Spi::connect(|client| {
        let row = client.select(QUERY, Some(1), &[])?.first();
        Ok::<_, pgrx::spi::Error>((
            row.get::<String>(1)?,
            row.get::<String>(2)?,
            row.get::<String>(3)?,
            row.get::<String>(4)?,
        ))
    });
    let Ok((mode, bytes, time, track)) = row else { return (None, None, None, None) };
    let mode = mode.and_then(|m| match m.to_ascii_lowercase().as_str() {
        "disabled" => Some(mode_name(0)),
        "allowed" => Some(mode_name(1)),
        "forced" => Some(mode_name(2)),
        _ => None,
    });
    let track = track.and_then(|t| {
        let t = std::ffi::CString::new(t).ok()?;
        let mut on = false;
        // SAFETY: a NUL-terminated string; PostgreSQL's boolean GUC parser
        // raises nothing.
        unsafe { pg_sys::parse_bool(t.as_ptr(), &mut on) }.then_some(on)
    });
    (
        mode,
        bytes.and_then(|b| parse_with_unit(&b, pg_sys::GUC_UNIT_BYTE)),
        time.and_then(|t| parse_with_unit(&t, pg_sys::GUC_UNIT_MS)),
        track,
    )
}

/// An integer setting's value as PostgreSQL's own parser reads it (units,
/// hexadecimal, a fraction rounded), in the setting's base unit.
fn parse_with_unit(value: &str, unit: u32) -> Option<i64> {
    let value = std::ffi::CString::new(value).ok()?;
    let (mut result, mut hint) = (0, std::ptr::null());
    // SAFETY: a NUL-terminated string and valid out-pointers; parse_int
    // reports failure by value and raises nothing.
    // The settings' lower bound is 0 (their upper one, i32::MAX, parse_int
    // checks).
    unsafe { pg_sys::parse_int(value.as_ptr(), &mut result, unit as i32, &mut hint) }
        .then_some(result as i64)
        .filter(|&v| v >= 0)
}

/// What a stored value of `delayed_durability.max_loss_bytes` (in bytes) or
/// `delayed_durability.max_loss_time` (in milliseconds) means, read as the
/// setting reads it: `ALTER DATABASE … SET` keeps the text as written
/// (`'64kB'`, `'0x4000'`, `'8192B'`). NULL for text the setting refuses.
#[pg_extern(immutable, parallel_safe, strict)]
fn delayed_durability_setting_value(name: &str, value: &str) -> Option<i64> {
    let unit = match name {
        "delayed_durability.max_loss_bytes" => pg_sys::GUC_UNIT_BYTE,
        "delayed_durability.max_loss_time" => pg_sys::GUC_UNIT_MS,
        _ => {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("\"{name}\" is not an integer setting of delayed_durability"),
                "",
            )
            .set_hint("Pass delayed_durability.max_loss_bytes or delayed_durability.max_loss_time.")
            .report(PgLogLevel::ERROR);
            unreachable!("ERROR does not return")
        }
    };
    parse_with_unit(value, unit)
}

/// Run by CREATE EXTENSION and ALTER EXTENSION ... UPDATE: without the
/// preload nothing of the policy is in force, whatever SHOW says.
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_warn_if_not_preloaded() {
    if !crate::preload::preloaded() {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "delayed_durability is not loaded through \"shared_preload_libraries\": its policy is not in force",
            "",
        )
        .set_detail(
            "Commits follow synchronous_commit alone; delayed_durability.mode and the other settings are \
placeholders that nothing reads.",
        )
        .set_hint(
            "Add delayed_durability to \"shared_preload_libraries\" in postgresql.conf and restart the server; \
SELECT * FROM delayed_durability_settings shows what is in force.",
        )
        .report(PgLogLevel::WARNING);
    }
}

pgrx::extension_sql!(
    r#"
-- What is in force, per database: its own setting (ALTER DATABASE ... SET)
-- over the cluster's (postgresql.conf, ALTER SYSTEM). Settings of roles
-- (ALTER ROLE ... SET) apply on top, per session: counted, not resolved.
CREATE VIEW delayed_durability_settings AS
    SELECT d.datname,
           coalesce(pg_catalog.lower(db.mode), c.mode) AS mode,
           CASE WHEN db.mode IS NOT NULL THEN 'database' WHEN c.library_preloaded THEN 'cluster' END AS mode_source,
           coalesce(@extschema@.delayed_durability_setting_value('delayed_durability.max_loss_bytes', db.max_loss_bytes),
                    c.max_loss_bytes) AS max_loss_bytes,
           coalesce(@extschema@.delayed_durability_setting_value('delayed_durability.max_loss_time', db.max_loss_time),
                    c.max_loss_time_ms) * interval '1 ms' AS max_loss_time,
           c.track_lost_commits,
           (SELECT count(*) FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
             WHERE r.setrole <> 0 AND r.setdatabase IN (0, d.oid) AND s LIKE 'delayed\_durability.%') AS role_settings,
           CASE WHEN d.datname = pg_catalog.current_database()
                THEN (SELECT count(*) FROM @extschema@.delayed_durability_table_class_config) END AS table_classes,
           c.library_preloaded
      FROM pg_catalog.pg_database AS d
     CROSS JOIN @extschema@.delayed_durability_cluster_settings() AS c
      LEFT JOIN LATERAL (
            SELECT max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.mode=%') AS mode,
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_bytes=%') AS max_loss_bytes,
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_time=%') AS max_loss_time
              FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
             WHERE r.setdatabase = d.oid AND r.setrole = 0) AS db ON true
     WHERE d.datallowconn;
GRANT SELECT ON delayed_durability_settings TO PUBLIC;

SELECT @extschema@.delayed_durability_warn_if_not_preloaded();
"#,
    name = "settings_view",
    requires = [
        "table_classes",
        delayed_durability_cluster_settings,
        delayed_durability_setting_value,
        delayed_durability_warn_if_not_preloaded
    ],
);

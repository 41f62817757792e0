//! The persistent WAL buffer: WAL made durable by copying it to persistent
//! memory instead of fsyncing pg_wal on every commit.
//!
//! - `format`: the buffer file's layout and checksums.
//! - `file`: the file system under the buffer file and the server's lock on it.
//! - `pmem`: the libpmem binding.
//! - `segment`: WAL segment files.
//! - `ring`: what a WAL write or fsync does while the buffer is on.
//! - `interpose`: redirecting PostgreSQL's WAL write/fsync calls.
//! - `restore`: writing the buffer back into pg_wal at startup.
//!
//! This module holds the settings, the startup sequence (in the postmaster,
//! from the shared-memory startup hook, before the startup process exists)
//! and the status function.

mod file;
mod format;
mod interpose;
mod marker;
pub(crate) mod pmem;
mod restore;
mod ring;
mod segment;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use restore::Problem;
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};

pub static WAL_BUFFER_PATH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// In kB.
pub static WAL_BUFFER_SIZE: GucSetting<i32> = GucSetting::<i32>::new(16 * 1024);
/// Accept a buffer on tmpfs or ramfs (tests and benchmarks).
pub static WAL_BUFFER_ALLOW_VOLATILE: GucSetting<bool> = GucSetting::<bool>::new(false);
/// The smallest useful buffer: eight 8 kB WAL pages.
const MIN_SIZE_KB: i32 = 64;
/// How long to wait for the lock on the buffer file when another process holds it.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

pub fn define_gucs() {
    GucRegistry::define_string_guc(
        c"delayed_durability.wal_buffer_path",
        c"File of the persistent WAL buffer, on a persistent-memory (DAX) file system; empty = off.",
        c"When set, WAL is made durable by copying it into this file instead of fsyncing \
pg_wal at every commit; pg_wal is fsynced when the buffer is three quarters full and when a \
WAL segment is finished. The file is created if missing.",
        &WAL_BUFFER_PATH,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"delayed_durability.wal_buffer_size",
        c"Size of the persistent WAL buffer.",
        c"At least 64kB. Takes effect when the file is created or at the next start.",
        &WAL_BUFFER_SIZE,
        1,
        1024 * 1024 * 1024, // 1 TB in kB
        GucContext::Postmaster,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_bool_guc(
        c"delayed_durability.wal_buffer_allow_volatile",
        c"Accepts a persistent WAL buffer on tmpfs or ramfs, which does not survive a power cut.",
        c"Such a file is in DRAM: it survives a crash of the server but not of the machine, so \
commits acknowledged as durable through it are lost at a power cut or operating-system crash. \
Off refuses to start with such a buffer; turn it on only for tests and benchmarks.",
        &WAL_BUFFER_ALLOW_VOLATILE,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// Process-wide state, set in the postmaster and inherited by every child.
struct Global {
    shared: Cell<*mut ring::Shared>,
    map: Cell<Option<pmem::Mapping>>,
    path: Cell<Option<&'static CStr>>,
}
// SAFETY: a PostgreSQL server process runs this code on one thread only.
unsafe impl Sync for Global {}
static GLOBAL: Global = Global { shared: Cell::new(std::ptr::null_mut()), map: Cell::new(None), path: Cell::new(None) };
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The buffer is on in this server.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// A file next to the buffer, `<wal_buffer_path><suffix>`, when the buffer
/// is in use on real persistent memory (stores made durable by cache
/// flushes) and not on a file system that forgets its files at a reboot.
/// For other records that must survive a machine crash (postmaster only,
/// after the buffer started).
pub fn persistent_memory_sibling(suffix: &str) -> Option<CString> {
    // Where the buffer file is, not whether this run uses it: the record
    // must be found again after a crash whatever the run's mode was.
    let (map, path) = (GLOBAL.map.get()?, GLOBAL.path.get()?);
    if !map.is_pmem {
        return None;
    }
    let path = path.to_str().ok()?;
    if !matches!(file::volatile_file_system(std::path::Path::new(path)), Ok(None)) {
        return None;
    }
    CString::new(format!("{path}{suffix}")).ok()
}

fn segment_size() -> u64 {
    // SAFETY: set from pg_control in the postmaster before shared memory exists.
    unsafe { pg_sys::wal_segment_size as u64 }
}

/// Runs `f` on the ring; only called with WALWriteLock held.
fn with_ring<T>(f: impl FnOnce(&mut ring::Ring) -> Result<T, ring::Errno>) -> Result<T, ring::Errno> {
    let (shared, map) = (GLOBAL.shared.get(), GLOBAL.map.get().expect("mapped when active"));
    // SAFETY: the shared state lives in shared memory for the server's
    // life; WALWriteLock serializes every caller.
    let shared = unsafe { &mut *shared };
    f(&mut ring::Ring { shared, map, segment_size: segment_size() })
}

/// PostgreSQL counts every call of its WAL fsync in pg_stat_wal.wal_sync;
/// one the buffer skipped is not a sync, so take it back before it is added.
fn uncount_wal_sync() {
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17"))]
    // SAFETY: this process's pending WAL statistics, owned by this thread.
    unsafe {
        pg_sys::PendingWalStats.wal_sync -= 1;
    }
}

pub fn request_shared_memory() {
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<ring::Shared>()) };
}

pub fn attach_shared_memory() {
    let shared = crate::shmem::init_struct(c"delayed_durability WAL buffer", std::mem::size_of::<ring::Shared>())
        as *mut ring::Shared;
    GLOBAL.shared.set(shared);
    // SAFETY: reading a postmaster-set global.
    if unsafe { pg_sys::IsUnderPostmaster } {
        return;
    }
    // The postmaster (or a single-user backend), at first start and after
    // every crash: restore the buffer before the startup process runs.
    let Some(path) = WAL_BUFFER_PATH.get().filter(|p| !p.is_empty()) else {
        refuse_if_buffer_needed();
        return;
    };
    start(Box::leak(path.into_boxed_c_str()), shared);
}

/// Without a buffer this run: the last one that wrote WAL through one must
/// have drained it, or recovery would run without WAL of durable commits.
fn refuse_if_buffer_needed() {
    if !std::path::Path::new(marker::path()).exists() {
        return;
    }
    let cluster = restore::read_control_file(segment_size())
        .unwrap_or_else(|e| fatal(PgSqlErrorCode::ERRCODE_IO_ERROR, e, None, ""));
    if let Some(buffer) = buffer_in_use(&cluster) {
        fatal(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("the persistent WAL buffer \"{buffer}\" may hold WAL this data directory lacks, and delayed_durability.wal_buffer_path is empty"),
            Some("The server stopped without draining the buffer (a crash): commits acknowledged as durable through it may be in the buffer only.".into()),
            &format!(
                "Set delayed_durability.wal_buffer_path = '{buffer}' again: the next start restores it, and a clean stop drains it. \
To start without it and lose what only the buffer holds, remove \"{}\".",
                marker::path()
            ),
        );
    }
}

/// The buffer this data directory wrote WAL through and did not drain.
fn buffer_in_use(cluster: &restore::Cluster) -> Option<String> {
    if cluster.from_backup {
        // A base backup or pg_rewind brought the marker with the rest of
        // another server's files (or an older one of this server's): it
        // says nothing of this data directory, whose buffer's WAL, if any,
        // restore() refuses (ReplacedDataDirectory).
        if let Err(e) = marker::remove() {
            pgrx::warning!("delayed_durability: could not remove \"{}\": {e}", marker::path());
        }
        return None;
    }
    marker::buffer_in_use(&cluster.data_dir).unwrap_or_else(|e| {
        fatal(
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            e,
            Some("It says whether a persistent WAL buffer holds WAL this data directory lacks.".into()),
            "Fix its permissions. If no buffer holds WAL of this data directory (it was stopped cleanly since), remove it.",
        )
    })
}

/// The buffer this data directory wrote WAL through must still be there:
/// a file missing, emptied or zeroed (a persistent-memory file system not
/// mounted after a power cut, a file recreated), or the path emptied or
/// pointed where there is no buffer, would otherwise be taken as a new
/// buffer. A buffer found at another path (moved) is left to restore()'s
/// checks of its system, owner and checkpoint.
fn refuse_if_buffer_lost(expected: Option<&str>, shown: &str, map: Option<&pmem::Mapping>) {
    let Some(expected) = expected else { return };
    let lost = match map {
        Some(map) if restore::is_blank(map) => Some("its header is zeroed"),
        Some(_) => None,
        None => match std::fs::metadata(shown) {
            Err(_) => Some("the file is missing"),
            Ok(m) if (m.len() as usize) < format::HEADER_SIZE => Some("the file is empty or shorter than its header"),
            Ok(_) => None,
        },
    };
    let Some(why) = lost else { return };
    let hint = format!(
        "Mount or restore the buffer file and start again: the start restores it. To start without it and lose what \
only the buffer held, remove \"{}\". pg_wal was not modified.",
        marker::path()
    );
    let detail = "The server stopped without draining the buffer (a crash): commits acknowledged as durable through it may be in the buffer only.";
    if expected != shown {
        fatal(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("the persistent WAL buffer \"{expected}\" may hold WAL this data directory lacks, and delayed_durability.wal_buffer_path is now \"{shown}\" ({why})"),
            Some(detail.into()),
            &format!("Set delayed_durability.wal_buffer_path = '{expected}' again, or move that file to the new path. {hint}"),
        );
    }
    fatal(
        PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
        format!("the persistent WAL buffer \"{shown}\" was lost: {why}"),
        Some(detail.into()),
        &hint,
    );
}

fn fatal(code: PgSqlErrorCode, message: String, detail: Option<String>, hint: &str) -> ! {
    let mut report = pg_sys::panic::ErrorReport::new(code, message, "");
    if let Some(detail) = detail {
        report = report.set_detail(detail);
    }
    if !hint.is_empty() {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::FATAL);
    unreachable!("FATAL does not return")
}

/// Every start of the server (normal, after a crash of a child, as a
/// standby, for archive recovery, a single-user backend run by pg_rewind)
/// restores what the buffer holds into pg_wal before the startup process
/// reads any WAL: a durable commit was acknowledged once its WAL was in the
/// buffer, so data pages on disk may depend on WAL that only the buffer
/// has. Only then is it decided whether this run uses the buffer.
fn start(path: &'static CStr, shared: *mut ring::Shared) {
    let shown = path.to_string_lossy().into_owned();
    let segment_size = segment_size();
    let wal_dir = std::fs::canonicalize("pg_wal").map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|e| {
        fatal(PgSqlErrorCode::ERRCODE_IO_ERROR, format!("could not resolve \"pg_wal\": {e}"), None, "")
    });
    segment::set_wal_dir(wal_dir, segment_size);
    let cluster = restore::read_control_file(segment_size)
        .unwrap_or_else(|e| fatal(PgSqlErrorCode::ERRCODE_IO_ERROR, e, None, ""));

    // After a crash of a child the postmaster runs this again: it keeps its
    // mapping, and its lock on the file (taken once, in open(), whatever
    // the mode: a standby holds it too, so that a copy of either server on
    // the same host is refused at start).
    let first_start = GLOBAL.map.get().is_none();
    let expected = buffer_in_use(&cluster);
    let map = match GLOBAL.map.get() {
        Some(map) => map,
        None => {
            refuse_if_buffer_lost(expected.as_deref(), &shown, None);
            open(path, &shown)
        }
    };
    refuse_if_buffer_lost(expected.as_deref(), &shown, Some(&map));
    let restored = match restore::restore(&map, &cluster, true) {
        Ok(r) => r,
        Err(problem) => refuse(&shown, problem),
    };
    if let Some(why) = restored.owner_unreadable {
        pgrx::warning!("delayed_durability: the owner recorded in the persistent WAL buffer \"{shown}\" cannot be read ({why}); it is taken as this server's");
    }
    if let Some(whose) = &restored.taken_over {
        pgrx::log!("delayed_durability: the persistent WAL buffer \"{shown}\" held {whose}; this server takes it over");
    }
    // A file of another size (wal_buffer_size changed) is resized once its
    // content is back in pg_wal.
    let wanted = WAL_BUFFER_SIZE.get() as usize * 1024;
    let map = if first_start && map.len != wanted && wanted >= MIN_SIZE_KB as usize * 1024 {
        map.unmap();
        pmem::map(path, Some(wanted)).unwrap_or_else(|e| map_failed(&shown, e))
    } else {
        map
    };
    restore::format(&map, &cluster).unwrap_or_else(|e| map_failed(&shown, e));
    if restored.bytes > 0 {
        pgrx::log!(
            "delayed_durability: restored {} bytes of WAL ({} records, {} segment(s)) from the persistent WAL buffer \"{shown}\"",
            restored.bytes,
            restored.records,
            restored.segments
        );
    }
    GLOBAL.map.set(Some(map));
    GLOBAL.path.set(Some(path));

    // Whether this run writes through the buffer. Without it every WAL
    // fsync happens as PostgreSQL does it, which is always safe: the buffer
    // is empty now.
    let standby = std::path::Path::new("standby.signal").exists();
    let unused_because = if standby {
        // WAL arriving by streaming or from the archive is the primary's to
        // persist; after a promotion the buffer is used from the next start.
        Some("standby mode: WAL received from the primary is fsynced as usual; the buffer is used from the first start after a promotion".to_string())
    } else {
        // Before the first WAL write through the buffer: without the marker
        // a later start could not tell the buffer is needed.
        unusable_settings().or_else(|| {
            marker::write(&shown, &cluster.data_dir)
                .err()
                .map(|e| format!("could not write \"{}\" ({e}), which says that WAL of this data directory goes through the buffer", marker::path()))
        })
    };
    // The interposition is installed at the first start whatever this run
    // does with the buffer (it passes every call through while the buffer
    // is off): a platform where it cannot work is refused here, never at a
    // crash restart that would turn the buffer on.
    if first_start {
        if let Err(e) = interpose::install() {
            fatal(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "delayed_durability: cannot intercept WAL writes on this platform".into(),
                Some(e),
                "Empty delayed_durability.wal_buffer_path to run without the persistent WAL buffer.",
            );
        }
        // SAFETY: registering a process-exit callback in the postmaster.
        unsafe { pg_sys::on_proc_exit(Some(drain_at_exit), pg_sys::Datum::from(0)) };
    }
    // SAFETY: the postmaster's own shared memory, before any child exists.
    let shared = unsafe { &mut *shared };
    shared.is_pmem = map.is_pmem;
    shared.restored_bytes.store(restored.bytes, std::sync::atomic::Ordering::Relaxed);
    if let Some(why) = unused_because {
        shared.enabled = false;
        ACTIVE.store(false, Ordering::Relaxed);
        // Restored and formatted: the buffer holds nothing pg_wal lacks.
        if let Err(e) = marker::remove() {
            pgrx::warning!("delayed_durability: could not remove \"{}\": {e}", marker::path());
        }
        if standby {
            pgrx::log!("delayed_durability: the persistent WAL buffer \"{shown}\" is not used in this run ({why})");
        } else {
            pgrx::warning!(
                "delayed_durability: the persistent WAL buffer \"{shown}\" is not used until the next start: {why}; what it held was restored, and WAL is fsynced as usual"
            );
        }
        return;
    }
    shared.enabled = true;
    if !ANNOUNCED.swap(true, Ordering::Relaxed) {
        if !map.is_pmem {
            pgrx::warning!(
                "delayed_durability: \"{shown}\" is not on persistent memory; every commit pays an msync() instead of an fsync, so no speed-up is to be expected"
            );
        }
        pgrx::log!(
            "delayed_durability: persistent WAL buffer \"{shown}\" in use ({} kB, {})",
            map.len / 1024,
            if map.is_pmem { "persistent memory" } else { "msync" }
        );
    }
    ACTIVE.store(true, Ordering::Relaxed);
}

/// The buffer's use was logged (once per postmaster).
static ANNOUNCED: AtomicBool = AtomicBool::new(false);

/// Why the settings do not let this run use the buffer, if they do not.
/// Checked after the restore, at every start: wal_sync_method can change by
/// reload, and a crash restart must still restore what the buffer holds.
fn unusable_settings() -> Option<String> {
    // SYNC_METHOD_FDATASYNC (WAL_SYNC_METHOD_FDATASYNC from PostgreSQL 17 on) is 1 in every version.
    const FDATASYNC: i32 = 1;
    // SAFETY: reading GUC variables the postmaster keeps current.
    #[cfg(not(any(feature = "pg17", feature = "pg18")))]
    let sync_method = unsafe { pg_sys::sync_method };
    // SAFETY: as above (the variable was renamed in PostgreSQL 17).
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let sync_method = unsafe { pg_sys::wal_sync_method };
    if sync_method != FDATASYNC {
        return Some("it requires wal_sync_method = fdatasync".into());
    }
    let size_kb = WAL_BUFFER_SIZE.get();
    if size_kb < MIN_SIZE_KB {
        return Some(format!("delayed_durability.wal_buffer_size ({size_kb}kB) is below {MIN_SIZE_KB}kB"));
    }
    None
}

/// At first start: checks where the file lives, makes it this server's
/// (before anything reads or writes it), and maps it, creating it when
/// missing (or empty).
fn open(path: &CStr, shown: &str) -> pmem::Mapping {
    let file = std::path::Path::new(shown);
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        fatal(
            PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
            format!("directory \"{}\" of the persistent WAL buffer does not exist", dir.display()),
            None,
            "Create it on a persistent-memory (DAX) file system, or correct delayed_durability.wal_buffer_path.",
        );
    }
    // An existing file is checked itself (it may be a symlink elsewhere).
    check_survives_power_cut(if file.exists() { file } else { dir }, shown);
    lock(path, shown);
    let size = std::fs::metadata(file).map(|m| m.len()).ok();
    let existing = match size {
        Some(n) if n as usize >= format::HEADER_SIZE => Some(pmem::map(path, None)),
        Some(0) | None => None,
        Some(_) => refuse(shown, Problem::NotABuffer),
    };
    let wanted = WAL_BUFFER_SIZE.get() as usize * 1024;
    existing.unwrap_or_else(|| pmem::map(path, Some(wanted))).unwrap_or_else(|e| map_failed(shown, e))
}

/// tmpfs and ramfs are DRAM: a buffer there survives a crash of the server,
/// not of the machine. Accepted only when asked for (tests, benchmarks).
fn check_survives_power_cut(path: &std::path::Path, shown: &str) {
    let kind = file::volatile_file_system(path).unwrap_or_else(|e| {
        fatal(
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("could not determine the file system of \"{}\": {e}", path.display()),
            None,
            "",
        )
    });
    let Some(kind) = kind else { return };
    if !WAL_BUFFER_ALLOW_VOLATILE.get() {
        fatal(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("persistent WAL buffer \"{shown}\" is on a file system that does not survive a power cut ({kind})"),
            Some(format!(
                "{kind} keeps its files in memory: commits acknowledged as durable through the buffer would be lost at a power cut or operating-system crash."
            )),
            "Put the buffer on a DAX file system over persistent memory: ext4 or xfs created on an fsdax \
namespace (ndctl create-namespace --mode=fsdax) and mounted with \"mount -o dax /dev/pmem0 /mnt/pmem\". \
For tests and benchmarks only, delayed_durability.wal_buffer_allow_volatile = on accepts it.",
        );
    }
    pgrx::warning!(
        "delayed_durability: persistent WAL buffer \"{shown}\" is on {kind} (delayed_durability.wal_buffer_allow_volatile = on): commits acknowledged as durable through this buffer are lost at a power cut or operating-system crash"
    );
}

/// Takes the server's lock on the buffer file, for the postmaster's life:
/// two servers appending to one buffer (a pg_basebackup copy on the same
/// host inherits the path and the system identifier) would overwrite each
/// other's WAL, and a starting one would restore and reformat the other's.
fn lock(path: &CStr, shown: &str) {
    let holder = match file::lock(path, LOCK_PATIENCE) {
        Ok(()) => return,
        Err(file::LockError::Held(holder)) => holder,
        Err(file::LockError::Io(e)) => fatal(
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("could not lock the persistent WAL buffer \"{shown}\": {e}"),
            None,
            "",
        ),
    };
    let detail = match holder {
        Some(file::Holder { pid, data_dir: Some(dir) }) => {
            format!("It is locked by process {pid} (data directory \"{dir}\").")
        }
        Some(file::Holder { pid, data_dir: None }) => format!("It is locked by process {pid}."),
        None => "Another process holds a lock on it.".to_string(),
    };
    fatal(
        PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
        format!("persistent WAL buffer \"{shown}\" is in use by another server"),
        Some(detail),
        "Each server needs its own buffer file. A copy of a data directory (pg_basebackup, a file \
system copy) keeps the original's settings: set delayed_durability.wal_buffer_path of the copy to \
another file, or empty it.",
    );
}

fn map_failed(shown: &str, e: String) -> ! {
    fatal(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("could not map the persistent WAL buffer \"{shown}\": {e}"),
        None,
        "",
    )
}

/// Refuses to start on a buffer that cannot be trusted; nothing in pg_wal was written.
fn refuse(shown: &str, problem: Problem) -> ! {
    let keep = "pg_wal was not modified. Move the file away (and remove \"delayed_durability/wal_buffer_in_use\" \
from the data directory) to start without it: commits acknowledged since the last WAL fsync that are not in \
pg_wal would then be lost.";
    let (code, message, detail) = match problem {
        Problem::NotABuffer => (
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("\"{shown}\" is not a delayed_durability WAL buffer"),
            "The file is not empty and does not start with the buffer's signature.".to_string(),
        ),
        Problem::BadHeader(why) => (
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("persistent WAL buffer \"{shown}\" has an invalid header"),
            why.to_string(),
        ),
        Problem::OtherCluster { buffer, cluster } => (
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("persistent WAL buffer \"{shown}\" belongs to another database system"),
            format!("The buffer's system identifier is {buffer}, this cluster's is {cluster}."),
        ),
        Problem::OtherDataDirectory { owner, empty } => {
            let (detail, hint) = if empty {
                (
                    format!("The buffer is empty; it was formatted by the server of data directory \"{owner}\", a server of the same database system."),
                    "Each server needs its own buffer file. A copy of a data directory (pg_basebackup, a file \
system copy) keeps the original's settings: set delayed_durability.wal_buffer_path of this server to \
another file. pg_wal was not modified.".to_string(),
                )
            } else {
                (
                    format!("The buffer holds WAL of the server of data directory \"{owner}\", a server of the same database system."),
                    format!("If this is a copy, set its delayed_durability.wal_buffer_path to another file. If this \
data directory was moved from \"{owner}\", start it once from there, which restores the buffer, and stop it \
cleanly before moving it: moving the buffer file away instead loses the commits acknowledged through it. \
pg_wal was not modified."),
                )
            };
            fatal(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("persistent WAL buffer \"{shown}\" belongs to another server"),
                Some(detail),
                &hint,
            )
        }
        Problem::ReplacedDataDirectory => fatal(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("persistent WAL buffer \"{shown}\" holds WAL this data directory no longer has"),
            Some("The data directory starts from a base backup or was rewound by pg_rewind (it holds a backup_label) \
since the buffer was written: restoring that WAL into it would corrupt it.".into()),
            "Commits acknowledged through this buffer are not in this data directory. If pg_rewind ran, its \
single-user crash recovery did not load delayed_durability (give pg_rewind --config-file when postgresql.conf \
is outside the data directory); otherwise the backup replaced the data directory the WAL belongs to. Move the \
buffer file away to start. pg_wal was not modified.",
        ),
        Problem::WrittenWithoutBuffer { checkpoint } => fatal(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("persistent WAL buffer \"{shown}\" holds WAL this data directory has since overwritten"),
            Some(format!(
                "The latest checkpoint ({:X}/{:X}) is not in the WAL the buffer would restore: the server ran without \
the buffer (delayed_durability.wal_buffer_path empty, or the library not loaded) after the buffer was last written, \
and wrote WAL over what only the buffer held. Restoring it now would corrupt that WAL.",
                checkpoint >> 32,
                checkpoint & 0xffff_ffff
            )),
            "Commits acknowledged through this buffer before that run were lost when it started without the buffer. \
Move the buffer file away (and remove \"delayed_durability/wal_buffer_in_use\" from the data directory) to start. \
pg_wal was not modified.",
        ),
        Problem::SegmentSize { buffer, cluster } => (
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("persistent WAL buffer \"{shown}\" was written with another WAL segment size"),
            format!("The buffer's WAL segment size is {buffer} bytes, this cluster's is {cluster} bytes."),
        ),
        Problem::Corrupted { offset, checksum } => (
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("persistent WAL buffer \"{shown}\" holds a corrupted record"),
            format!(
                "The record at offset {} {}.",
                format::HEADER_SIZE + offset,
                if checksum { "fails its CRC32C check" } else { "has an invalid length or position" }
            ),
        ),
        Problem::UnknownTimeline { tli, timeline } => (
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("persistent WAL buffer \"{shown}\" holds WAL of another timeline"),
            format!("The buffer holds WAL of timeline {tli}; this cluster is on timeline {timeline}."),
        ),
        Problem::MissingSegment { name } => (
            PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
            format!("persistent WAL buffer \"{shown}\" holds WAL for a missing segment"),
            format!("WAL segment \"{name}\" is not in pg_wal or does not have the segment size."),
        ),
        Problem::Io(e) => {
            (PgSqlErrorCode::ERRCODE_IO_ERROR, format!("could not restore the persistent WAL buffer \"{shown}\""), e)
        }
    };
    fatal(code, message, Some(detail), keep)
}

/// At a clean postmaster exit (every child is gone) the buffer's WAL is made
/// durable in pg_wal, so the buffer is left empty. After a failure exit the
/// buffer is kept for the next start, which restores it.
#[pg_guard]
unsafe extern "C-unwind" fn drain_at_exit(code: i32, _arg: pg_sys::Datum) {
    // SAFETY: reading a process-local global.
    if code != 0 || unsafe { pg_sys::IsUnderPostmaster } {
        return;
    }
    let (Some(map), Some(path)) = (GLOBAL.map.get(), GLOBAL.path.get()) else {
        return;
    };
    let Ok(cluster) = restore::read_control_file(segment_size()) else {
        return;
    };
    match restore::restore(&map, &cluster, true) {
        Ok(_) => {
            if restore::format(&map, &cluster).is_ok() {
                let _ = marker::remove();
            }
        }
        Err(_) => pgrx::log!(
            "delayed_durability: the persistent WAL buffer \"{}\" was left for the next start",
            path.to_string_lossy()
        ),
    }
}

/// The buffer's state for delayed_durability_status().
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_wal_buffer_state() -> TableIterator<
    'static,
    (
        name!(is_pmem, Option<bool>),
        name!(bytes_persisted, i64),
        name!(fsyncs_avoided, i64),
        name!(drains, i64),
        name!(restored_bytes, i64),
    ),
> {
    crate::preload::require_preloaded();
    // SAFETY: set at startup; the fields read here are atomics or fixed after startup.
    let shared = unsafe { &*GLOBAL.shared.get() };
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as i64;
    TableIterator::once((
        shared.enabled.then_some(shared.is_pmem),
        get(&shared.bytes_persisted),
        get(&shared.fsyncs_avoided),
        get(&shared.drains),
        get(&shared.restored_bytes),
    ))
}

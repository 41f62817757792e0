//! A crashed run's record of acknowledged delayed commits, saved outside
//! the data directory before it is formatted anew.
//!
//! When a primary dies and a standby is promoted, the old primary's record
//! is what lists exactly the acknowledged delayed commits the failover
//! lost. But the old primary's next start reformats it, and `pg_rewind`
//! (which Patroni runs by itself when the old primary comes back) replaces
//! the whole `delayed_durability/` directory with the new primary's. With
//! `delayed_durability.crash_record_directory` set, the start that finds a
//! crashed run's record (including the single-user crash recovery
//! `pg_rewind` and Patroni run first) copies it there, where neither
//! `pg_rewind` nor a re-clone touches it, and logs where; the new primary
//! imports it with `delayed_durability_import_failover_record()`.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CString;
use std::path::{Path, PathBuf};

pub static CRASH_RECORD_DIRECTORY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Saved records kept per node: the newest ones.
const KEEP: usize = 8;

pub fn define_guc() {
    GucRegistry::define_string_guc(
        c"delayed_durability.crash_record_directory",
        c"Directory outside the data directory where a crashed run's record of acknowledged delayed commits is saved.",
        c"Empty = not saved. The start that finds a crashed run's record copies it there before starting a new \
one, so that pg_rewind or a re-clone cannot destroy what a failover's import needs.",
        &CRASH_RECORD_DIRECTORY,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// The directory, if set and usable: absolute, an existing directory,
/// outside the data directory (pg_rewind and re-clones empty that).
fn directory() -> Option<Result<PathBuf, String>> {
    let dir = crate::guc::read(&CRASH_RECORD_DIRECTORY).filter(|d| !d.is_empty())?;
    let dir = PathBuf::from(dir.to_string_lossy().into_owned());
    Some(check(&dir).map(|()| dir.clone()).map_err(|why| format!("\"{}\" {why}", dir.display())))
}

fn check(dir: &Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err("is not an absolute path".into());
    }
    let real = std::fs::canonicalize(dir).map_err(|e| format!("cannot be used: {e}"))?;
    if !real.is_dir() {
        return Err("is not a directory".into());
    }
    // The server runs in its data directory.
    if let Ok(data) = std::fs::canonicalize(".") {
        if real.starts_with(&data) {
            return Err("is inside the data directory, which pg_rewind and re-clones empty".into());
        }
    }
    Ok(())
}

/// At the first start: a directory that cannot be used is said now, not
/// at the crash that needs it.
pub(super) fn check_at_start() {
    if let Some(Err(why)) = directory() {
        pgrx::warning!(
            "delayed_durability.crash_record_directory {why}: the record of a crashed run will not be saved"
        );
    }
}

/// Copies the crashed run's record file `ring_file` into the directory, if
/// one is set; never fails the start (a WARNING says why it could not).
pub(super) fn save(ring_file: &str, system_id: u64, entries: u64) {
    let dir = match directory() {
        None => return,
        Some(Err(why)) => {
            pgrx::warning!(
                "delayed_durability: the record of the crashed run is not saved: delayed_durability.crash_record_directory {why}"
            );
            return;
        }
        Some(Ok(dir)) => dir,
    };
    match copy_into(&dir, ring_file, system_id) {
        Ok(saved) => pgrx::log!(
            "delayed_durability: the record of the crashed run ({entries} entries) is saved in \"{}\"; if a standby \
was promoted meanwhile, import it there with delayed_durability_import_failover_record()",
            saved.display()
        ),
        Err(e) => pgrx::warning!(
            "delayed_durability: could not save the record of the crashed run in \"{}\": {e}",
            dir.display()
        ),
    }
}

fn copy_into(dir: &Path, ring_file: &str, system_id: u64) -> std::io::Result<PathBuf> {
    // Nodes of one database system share its id: the port tells them
    // apart in a shared directory, the process id two starts of one node.
    // SAFETY: a plain read of a GUC variable set before shared_preload_libraries.
    let port = unsafe { pg_sys::PostPortNumber };
    let prefix = format!("delayed_durability-{system_id}-p{port}-");
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let target = dir.join(format!("{prefix}{secs}-{}.commits", std::process::id()));
    let partial = target.with_extension("partial");
    let copied = std::fs::copy(ring_file, &partial)
        .and_then(|_| std::fs::File::open(&partial)?.sync_all())
        .and_then(|()| std::fs::rename(&partial, &target));
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()?;
    // The newest few of this node stay (by modification time; never the
    // one just written, whatever the clock did).
    let mut saved: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| *p != target)
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".commits"))
        })
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    saved.sort();
    let excess = saved.len().saturating_sub(KEEP - 1);
    for (_, old) in &saved[..excess] {
        let _ = std::fs::remove_file(old);
    }
    Ok(target)
}

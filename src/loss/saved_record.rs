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
use std::ffi::CString;
use std::path::{Path, PathBuf};

pub static CRASH_RECORD_DIRECTORY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Saved records kept per database system: the newest ones.
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

/// Copies the crashed run's record file `ring_file` into the directory, if
/// one is set; never fails the start (a WARNING says why it could not).
pub(super) fn save(ring_file: &str, system_id: u64, acknowledged: u64) {
    let Some(dir) = crate::guc::read(&CRASH_RECORD_DIRECTORY).filter(|d| !d.is_empty()) else { return };
    let dir = PathBuf::from(dir.to_string_lossy().into_owned());
    match copy_into(&dir, ring_file, system_id) {
        Ok(saved) => pgrx::log!(
            "delayed_durability: the record of the crashed run ({acknowledged} acknowledged delayed commits) is saved \
in \"{}\"; if a standby was promoted meanwhile, import it there with delayed_durability_import_failover_record()",
            saved.display()
        ),
        Err(e) => pgrx::warning!(
            "delayed_durability: could not save the record of the crashed run in \"{}\": {e}",
            dir.display()
        ),
    }
}

fn copy_into(dir: &Path, ring_file: &str, system_id: u64) -> std::io::Result<PathBuf> {
    if !dir.is_absolute() {
        return Err(std::io::Error::other("the directory must be an absolute path outside the data directory"));
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let prefix = format!("delayed_durability-{system_id}-");
    let mut target = dir.join(format!("{prefix}{secs:012}.commits"));
    for n in 1.. {
        if !target.exists() {
            break;
        }
        target = dir.join(format!("{prefix}{secs:012}.{n}.commits"));
    }
    let partial = target.with_extension("partial");
    std::fs::copy(ring_file, &partial)?;
    std::fs::File::open(&partial)?.sync_all()?;
    std::fs::rename(&partial, &target)?;
    std::fs::File::open(dir)?.sync_all()?;
    // The newest few of this database system stay.
    let mut saved: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".commits"))
        })
        .collect();
    saved.sort();
    let excess = saved.len().saturating_sub(KEEP);
    for old in &saved[..excess] {
        let _ = std::fs::remove_file(old);
    }
    Ok(target)
}

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
use pgrx::prelude::*;
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
/// `lost_at_restart`: the record did not survive the machine's restart
/// (not on persistent memory): the copy says so in its header, and a
/// failover's list from it is not exact.
/// `rejoining`: the server starts as a standby, or in single-user mode
/// (pg_rewind's crash recovery), so its own report cannot list what the
/// crashed run lost.
pub(super) fn save(ring_file: &str, system_id: u64, entries: u64, lost_at_restart: bool, rejoining: bool) {
    let dir = match directory() {
        None => {
            if rejoining && entries > 0 {
                pg_sys::panic::ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_WARNING,
                    format!(
                        "delayed_durability: the record of the crashed run ({entries} acknowledged delayed commits) is not \
kept: delayed_durability.crash_record_directory is not set"
                    ),
                    "",
                )
                .set_hint(
                    "If a standby was promoted, nothing can list which of them the failover lost. Set \
delayed_durability.crash_record_directory on every node (outside the data directory) so that a crashed run's record \
is saved and delivered.",
                )
                .report(PgLogLevel::WARNING);
            }
            return;
        }
        Some(Err(why)) => {
            pgrx::warning!(
                "delayed_durability: the record of the crashed run is not saved: delayed_durability.crash_record_directory {why}"
            );
            return;
        }
        Some(Ok(dir)) => dir,
    };
    match copy_into(&dir, ring_file, system_id, lost_at_restart, (0, 0), None) {
        Ok(saved) => pgrx::log!(
            "delayed_durability: the record of the crashed run ({entries} entries) is saved in \"{}\"{}; if a standby \
was promoted meanwhile, this server delivers it there once it streams from it as a standby (or import it there with \
delayed_durability_import_failover_record())",
            saved.display(),
            if lost_at_restart {
                ", marked as not surviving the operating-system restart (its last entries may be gone: a failover's list from it is not exact)"
            } else {
                ""
            }
        ),
        Err(e) => pgrx::warning!(
            "delayed_durability: could not save the record of the crashed run in \"{}\": {e}",
            dir.display()
        ),
    }
}

/// At a start as a standby after this server's clean shutdown as a
/// primary: saves the record of the run that ended there, stamped with
/// where its shutdown checkpoint starts and its time, to be delivered like
/// a crashed run's. A server promoted after that shutdown then knows the
/// run lost nothing. (`end`: the checkpoint's position and time.)
pub(super) fn save_clean_end(ring_file: &str, system_id: u64, end: (u64, i64), timeline: u32) {
    let dir = match directory() {
        None => return,
        Some(Err(why)) => {
            pgrx::warning!(
                "delayed_durability: the record of the run that shut down cleanly is not saved: \
delayed_durability.crash_record_directory {why}"
            );
            return;
        }
        Some(Ok(dir)) => dir,
    };
    match copy_into(&dir, ring_file, system_id, false, end, Some(timeline)) {
        Ok(saved) => pgrx::log!(
            "delayed_durability: the record of the run that shut down cleanly at {} is saved in \"{}\"; if a standby \
was promoted after that shutdown, this server delivers it there once it streams from it, and that failover is then \
known to have lost nothing",
            crate::flush::lsn_text(end.0),
            saved.display()
        ),
        Err(e) => pgrx::warning!(
            "delayed_durability: could not save the record of the run that shut down cleanly in \"{}\": {e}",
            dir.display()
        ),
    }
}

/// The start of the names of this node's saved records.
fn node_prefix(system_id: u64) -> String {
    // Nodes of one database system share its id: the port tells them
    // apart in a shared directory (the process id, two starts of one node).
    // SAFETY: a plain read of a GUC variable set before shared_preload_libraries.
    let port = unsafe { pg_sys::PostPortNumber };
    format!("delayed_durability-{system_id}-p{port}-")
}

/// What a saved record becomes once the new primary took it, or refused
/// it, or once this server reported the crash itself (never delivered).
pub(super) const DELIVERED: &str = ".commits.delivered";
pub(super) const REFUSED: &str = ".commits.refused";
pub(super) const REPORTED: &str = ".commits.reported";
const ENDS: [&str; 4] = [".commits", DELIVERED, REFUSED, REPORTED];

/// The newest timeline of the WAL segments in pg_wal, read before recovery
/// (a promoted server writes a segment of its new timeline at once, long
/// before pg_control's checkpoint names that timeline).
fn crashed_timeline() -> Option<u32> {
    std::fs::read_dir("pg_wal")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            (name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(&name[..8], 16).ok())
                .flatten()
        })
        .max()
}

/// The timeline a saved record's name gives (`-tl<N>.commits`), if any.
pub(super) fn timeline_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?.strip_suffix(".commits")?;
    name.rsplit_once("-tl")?.1.parse().ok()
}

/// This node's newest saved record written on `timeline`, delivered,
/// refused or not yet delivered (never one of a crash it reported itself:
/// that one is of an earlier run on the timeline than the one a failover
/// ended), if the directory is set and usable and it is a file no larger
/// than a record can be.
pub(super) fn own_record_of(system_id: u64, timeline: u32) -> Option<PathBuf> {
    newest_of_node(system_id, |name, meta| {
        let Some(stem) = [".commits", DELIVERED, REFUSED].iter().find_map(|end| name.strip_suffix(end)) else { return false };
        // Never a FIFO or device the read would block on.
        stem.rsplit_once("-tl").and_then(|(_, t)| t.parse::<u32>().ok()) == Some(timeline)
            && meta.is_file()
            && meta.len() <= super::ring::file_len(super::ring::MAX_CAPACITY) as u64
    })
}

/// This node's newest saved record not yet delivered, if the directory is
/// set and usable; older ones are never delivered (the newest is the
/// record of the last crash, the one a failover can have followed).
pub(super) fn newest_undelivered(system_id: u64) -> Option<PathBuf> {
    // Never a FIFO or device the delivery's read would block on.
    newest_of_node(system_id, |name, meta| meta.is_file() && ENDS.iter().any(|end| name.ends_with(end)))
        .filter(|p| p.extension().is_some_and(|e| e == "commits"))
}

/// The newest file (by modification time) of this node in the directory
/// that `wanted` keeps, given its name and metadata (links followed).
fn newest_of_node(system_id: u64, wanted: impl Fn(&str, &std::fs::Metadata) -> bool) -> Option<PathBuf> {
    let dir = directory()?.ok()?;
    let prefix = node_prefix(system_id);
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(&dir).ok()?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(&prefix)) else { continue };
        let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
        if !wanted(name, &meta) {
            continue;
        }
        let Ok(modified) = meta.modified() else { continue };
        if newest.as_ref().is_none_or(|(t, _)| modified > *t) {
            newest = Some((modified, entry.path()));
        }
    }
    newest.map(|(_, p)| p)
}

/// Renames a saved record to say it was delivered, refused or reported
/// here (`end`). Only the rename can fail; the directory's sync is tried.
pub(super) fn mark(path: &Path, end: &str) -> std::io::Result<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let target = path.with_file_name(format!("{}{end}", name.trim_end_matches(".commits")));
    std::fs::rename(path, &target)?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(target)
}

/// On a server that finished recovery as a primary on `timeline`: its
/// saved records not yet delivered that were written on that same
/// timeline were of its own crashes, which it reports itself (no standby
/// was promoted past them); none of them is delivered later, should it
/// become a standby.
pub(super) fn retire_undelivered(system_id: u64, timeline: u32) {
    let Some(Ok(dir)) = directory() else { return };
    let prefix = node_prefix(system_id);
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for path in entries.flatten().map(|e| e.path()) {
        let is_ours = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".commits"))
            && timeline_of(&path) == Some(timeline);
        if is_ours {
            match mark(&path, REPORTED) {
                Ok(p) => pgrx::log!(
                    "delayed_durability: this server reports its crash on timeline {timeline} itself: the record saved \
then is not delivered (\"{}\"; if a standby was promoted from that timeline meanwhile, import it there by hand)",
                    p.display()
                ),
                Err(e) => pgrx::warning!("delayed_durability: could not rename \"{}\": {e}", path.display()),
            }
        }
    }
}

/// Says in the copy's header what the import must know: the record did
/// not survive the machine's restart; or it was truncated (then cut to its
/// whole entries and padded with empty ones, so that the import reads
/// them). Synced.
pub(super) fn mark_copy(copy: &Path, lost_at_restart: bool, ended_at: (u64, i64)) -> std::io::Result<()> {
    use super::ring::{self, ENDED_AT_OFFSET, INCOMPLETE_OFFSET, LOST_AT_RESTART, SALVAGED};
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(copy)?;
    let len = file.metadata()?.len();
    let mut header = vec![0u8; ring::HEADER_LEN.min(len as usize)];
    file.read_exact_at(&mut header, 0)?;
    let mut bits = if lost_at_restart { LOST_AT_RESTART } else { 0 };
    if let Some((whole, full)) = ring::truncated_lengths(&header, len) {
        file.set_len(whole)?;
        file.set_len(full)?;
        bits |= SALVAGED;
    }
    if bits != 0 && header.len() >= INCOMPLETE_OFFSET + 4 {
        let word = u32::from_ne_bytes(header[INCOMPLETE_OFFSET..INCOMPLETE_OFFSET + 4].try_into().expect("4 bytes"));
        file.write_all_at(&(word | bits).to_ne_bytes(), INCOMPLETE_OFFSET as u64)?;
    }
    if ended_at != (0, 0) && header.len() >= ENDED_AT_OFFSET + 16 {
        file.write_all_at(&ended_at.0.to_ne_bytes(), ENDED_AT_OFFSET as u64)?;
        file.write_all_at(&ended_at.1.to_ne_bytes(), ENDED_AT_OFFSET as u64 + 8)?;
    }
    file.sync_all()
}

fn copy_into(
    dir: &Path,
    ring_file: &str,
    system_id: u64,
    lost_at_restart: bool,
    ended_at: (u64, i64),
    timeline: Option<u32>,
) -> std::io::Result<PathBuf> {
    let prefix = node_prefix(system_id);
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // The timeline the crashed run wrote on: the delivery names it, so
    // that the new primary attaches the record to the failover from it.
    // (After a clean shutdown, pg_control's checkpoint says it.)
    let timeline = timeline.or_else(crashed_timeline).map_or(String::new(), |t| format!("-tl{t}"));
    // Two crash restarts of one postmaster within a second would give the
    // same name: the later record takes the next free second, never the
    // earlier one's place.
    let name = |secs: u64| format!("{prefix}{secs}-{}{timeline}", std::process::id());
    let taken = |secs: u64| ENDS.iter().any(|end| dir.join(format!("{}{end}", name(secs))).exists());
    let secs = (secs..).find(|&s| !taken(s)).expect("a free name");
    let target = dir.join(format!("{}.commits", name(secs)));
    let partial = target.with_extension("partial");
    let copied = std::fs::copy(ring_file, &partial)
        .and_then(|_| mark_copy(&partial, lost_at_restart, ended_at))
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
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&prefix) && ENDS.iter().any(|end| n.ends_with(end))
            })
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

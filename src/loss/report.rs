//! The report of acknowledged delayed commits lost in a crash.
//!
//! Files under `delayed_durability/` in the data directory:
//! - `commits`: the ring (ring.rs), mapped by the postmaster; next to the
//!   persistent WAL buffer instead (`<wal_buffer_path>.commits`) when that
//!   is on persistent memory, so that it survives a machine crash too.
//! - `pending`: what the ring held when a crash was found, written by the
//!   postmaster before the startup process replays WAL.
//! - `lost`: the report, appended once recovery finished: every pending
//!   commit whose commit record ends past the end of the recovered WAL was
//!   lost. Kept until delayed_durability_lost_commits_reset().
//!
//! The comparison runs in a background worker started when recovery
//! finishes (at every start, and after every crash restart); it then sleeps
//! until shutdown, so that the postmaster starts it again after a crash.

use super::ring::{self, Acked, Ring, Snapshot, Summary};
use super::LOST_COMMITS_RING_SIZE;
use crate::flush::lsn_text;
use crate::walbuf::pmem;
use pgrx::bgworkers::{BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

pub(super) const DIR: &str = "delayed_durability";
const RING_FILE: &str = "delayed_durability/commits";
const PENDING_FILE: &str = "delayed_durability/pending";
const REPORT_FILE: &str = "delayed_durability/lost";

/// How exact the comparison after a crash can be.
#[derive(Clone, PartialEq, Debug)]
enum Status {
    Exact,
    /// The machine restarted and the ring was not on persistent memory.
    UnknownRestart,
    /// Some delayed commits were acknowledged while track_lost_commits was off.
    UnknownIncomplete,
    /// Another crash came before this one's record was compared.
    UnknownSecondCrash,
    /// A slot was being replaced at the crash.
    UnknownTorn,
    /// The record was not kept during the run that crashed (it could not
    /// be created or written), or its file was missing, damaged or another
    /// cluster's when the server started after the crash: why.
    UnknownNoRecord(String),
}

impl Status {
    fn name(&self) -> &'static str {
        match self {
            Status::Exact => "exact",
            Status::UnknownRestart => "unknown-restart",
            Status::UnknownIncomplete => "unknown-incomplete",
            Status::UnknownSecondCrash => "unknown-second-crash",
            Status::UnknownTorn => "unknown-torn",
            Status::UnknownNoRecord(_) => "unknown-no-record",
        }
    }

    fn reason(&self) -> &str {
        match self {
            Status::UnknownNoRecord(why) => why,
            _ => "",
        }
    }

    fn parse(s: &str, reason: &str) -> Status {
        match s {
            "exact" => Status::Exact,
            "unknown-restart" => Status::UnknownRestart,
            "unknown-incomplete" => Status::UnknownIncomplete,
            "unknown-torn" => Status::UnknownTorn,
            "unknown-no-record" => Status::UnknownNoRecord(reason.to_string()),
            _ => Status::UnknownSecondCrash,
        }
    }

    fn why_unknown(&self) -> String {
        match self {
            Status::Exact => String::new(),
            Status::UnknownRestart => {
                "the record of acknowledged commits did not survive the operating-system restart \
(it is not on persistent memory)"
                    .into()
            }
            Status::UnknownIncomplete => {
                "delayed commits were acknowledged while delayed_durability.track_lost_commits was off".into()
            }
            Status::UnknownSecondCrash => "another crash came before the record of this one was compared".into(),
            Status::UnknownTorn => "an entry of the record was being replaced at the crash".into(),
            Status::UnknownNoRecord(why) => why.clone(),
        }
    }
}

pub fn register_worker() {
    BackgroundWorkerBuilder::new("delayed_durability crash report")
        .set_type("delayed_durability crash report")
        .set_library("delayed_durability")
        .set_function("delayed_durability_report_main")
        .enable_shmem_access(None)
        // A hot standby starts it once consistent (to follow timelines);
        // a primary, after crash recovery as before.
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(std::time::Duration::from_secs(10)))
        .load();
}

// ---------------------------------------------------------------- postmaster

struct Control {
    system_id: u64,
    clean_shutdown: bool,
    /// The run that ended was a primary (a standby's record is empty).
    in_production: bool,
    /// After a primary's clean shutdown: where its checkpoint record starts,
    /// the end of every commit of the runs before this one, and the
    /// checkpoint's time.
    shutdown_checkpoint: Option<(u64, i64)>,
    /// The timeline of the last checkpoint.
    checkpoint_timeline: Option<u32>,
}

fn read_control_file() -> Result<Control, String> {
    use pg_sys::ControlFileData;
    let bytes = std::fs::read("global/pg_control").map_err(|e| format!("could not read \"global/pg_control\": {e}"))?;
    let state_at = std::mem::offset_of!(ControlFileData, state);
    if bytes.len() < state_at + 4 {
        return Err("\"global/pg_control\" is too short".into());
    }
    let state = u32::from_ne_bytes(bytes[state_at..state_at + 4].try_into().unwrap());
    let checkpoint_at = std::mem::offset_of!(ControlFileData, checkPoint);
    let checkpoint = bytes.get(checkpoint_at..checkpoint_at + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
    let time_at = std::mem::offset_of!(ControlFileData, checkPointCopy) + std::mem::offset_of!(pg_sys::CheckPoint, time);
    let time = bytes.get(time_at..time_at + 8).map(|b| i64::from_ne_bytes(b.try_into().unwrap()));
    let checkpoint = checkpoint.zip(time);
    let tli_at = std::mem::offset_of!(ControlFileData, checkPointCopy) + std::mem::offset_of!(pg_sys::CheckPoint, ThisTimeLineID);
    let checkpoint_timeline = bytes.get(tli_at..tli_at + 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
    let clean_shutdown = state == pg_sys::DBState::DB_SHUTDOWNED || state == pg_sys::DBState::DB_SHUTDOWNED_IN_RECOVERY;
    Ok(Control {
        // Not after a standby's shutdown: WAL past its last restartpoint was
        // replayed, maybe with commits of this server's own earlier run.
        shutdown_checkpoint: checkpoint.filter(|_| state == pg_sys::DBState::DB_SHUTDOWNED),
        checkpoint_timeline,
        system_id: u64::from_ne_bytes(bytes[0..8].try_into().unwrap()),
        clean_shutdown,
        in_production: state == pg_sys::DBState::DB_IN_PRODUCTION,
    })
}

fn current_boot_id() -> [u8; ring::BOOT_ID_LEN] {
    let mut id = [0u8; ring::BOOT_ID_LEN];
    if let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let text = text.trim().as_bytes();
        let n = text.len().min(id.len());
        id[..n].copy_from_slice(&text[..n]);
    }
    id
}

pub(super) fn sync_dir() -> std::io::Result<()> {
    std::fs::File::open(DIR)?.sync_all()
}

/// Held while the report is read and written again: the report worker
/// appends a crash, a backend resets the report; without it either could
/// write over the other's change (a crash's recovery end lost, a reset
/// undone). Released when the file is closed.
fn lock_report() -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(format!("{REPORT_FILE}.lock"))?;
    file.lock()?;
    Ok(file)
}

/// Replaces a file of the record directory with `text`, whole: written to
/// a temporary file of this process (the worker and a backend may write
/// the same file at once), synced, renamed into place, the directory
/// synced. A crash in between leaves the old file whole.
pub(super) fn write_whole(path: &str, text: &str) -> std::io::Result<()> {
    let tmp = format!("{path}.tmp.{}", std::process::id());
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir()
}

/// Postmaster memory, inherited by every child it forks.
struct PostmasterState {
    /// open() ran before: the next call is for a crash restart.
    started: Cell<bool>,
    /// Why the run now going on keeps no record (None while it keeps one).
    record_off: RefCell<Option<String>>,
    /// Crashes known to be unreported whose row could not be written to
    /// `pending` (the directory is not writable): shown by the views from
    /// memory and written at the next start or crash that can.
    unwritten: RefCell<Vec<(i64, String)>>,
}
// SAFETY: the postmaster and each child run this code on one thread only.
unsafe impl Sync for PostmasterState {}
static POSTMASTER: PostmasterState =
    PostmasterState { started: Cell::new(false), record_off: RefCell::new(None), unwritten: RefCell::new(Vec::new()) };

/// In the postmaster, at first start and after every crash of a child:
/// keeps what the ring says about a crash in `pending`, then starts a fresh
/// ring. A crash is never left unreported: when the ring was not kept, or
/// its file is missing, damaged or another cluster's after a crash, an
/// "unknown" row says why. Returns None (and warns) when no ring can be
/// made; the server then runs without the record (a time budget then
/// flushes every delayed commit), and the next crash is reported unknown.
pub fn open_ring_after_startup_or_crash(current: Option<Ring>) -> Option<Ring> {
    let crash_restart = POSTMASTER.started.replace(true);
    let result = open(current, crash_restart);
    match &result {
        Ok(_) => *POSTMASTER.record_off.borrow_mut() = None,
        Err(e) => {
            pgrx::warning!("delayed_durability: no record of acknowledged delayed commits: {e}");
            *POSTMASTER.record_off.borrow_mut() = Some(format!("the record could not be kept: {e}"));
        }
    }
    result.ok()
}

/// The ring's file: on persistent memory next to the WAL buffer when there
/// is one, in the data directory otherwise.
fn ring_paths() -> (CString, Option<CString>) {
    let in_data_dir = CString::new(RING_FILE).unwrap();
    match crate::walbuf::persistent_memory_sibling(".commits") {
        Some(pmem_path) => (pmem_path, Some(in_data_dir)),
        None => (in_data_dir, None),
    }
}

/// Where this server keeps its record (for a backend: the same path the
/// postmaster chose).
pub(super) fn ring_path() -> String {
    ring_paths().0.to_string_lossy().into_owned()
}

/// What was found at a ring's path.
enum Found {
    Missing,
    Ring(Ring),
    /// Unusable: why, and what could still be read of it (a truncated
    /// file's entries).
    Damaged(String, Option<Snapshot>),
}

fn map_existing(path: &CString) -> Found {
    let shown = path.to_string_lossy();
    match std::fs::metadata(&*shown) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Missing,
        Err(e) => return Found::Damaged(format!("the record file \"{shown}\" could not be read: {e}"), None),
        Ok(m) if (m.len() as usize) < ring::HEADER_LEN => {
            return Found::Damaged(format!("the record file \"{shown}\" was too short ({} bytes)", m.len()), None)
        }
        Ok(_) => {}
    }
    let map = match pmem::map(path, None) {
        Ok(map) => map,
        Err(e) => return Found::Damaged(format!("the record file \"{shown}\" could not be mapped: {e}"), None),
    };
    match Ring::new(map) {
        Ok(ring) => Found::Ring(ring),
        Err(damage) => {
            let salvaged = Ring::salvage(map).map(|r| r.snapshot());
            map.unmap();
            Found::Damaged(format!("the record file \"{shown}\" {damage}"), salvaged)
        }
    }
}

/// Moves a damaged record aside (kept for inspection as `<file>.damaged`).
fn move_aside(path: &str) {
    let aside = format!("{path}.damaged");
    if std::fs::rename(path, &aside).is_ok() {
        pgrx::warning!(
            "delayed_durability: the damaged record of acknowledged delayed commits was moved to \"{aside}\""
        );
    } else {
        let _ = std::fs::remove_file(path);
    }
}

/// What a crash between writing and renaming (write_whole) left: at start,
/// before any other process, nobody writes them.
fn remove_leftover_temporary_files() {
    let Ok(entries) = std::fs::read_dir(DIR) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // "pending.tmp": the name 0.6.0 wrote the noted crash under.
        if name.contains(".tmp.") || name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn open(current: Option<Ring>, crash_restart: bool) -> Result<Ring, String> {
    if !Path::new(DIR).exists() {
        // Never ran here before: there is no record to miss.
        std::fs::create_dir_all(DIR).map_err(|e| format!("could not create directory \"{DIR}\": {e}"))?;
        let _ = std::fs::File::open(".").and_then(|d| d.sync_all());
    }
    let control = read_control_file()?;
    // A crash not compared yet (recovered in single-user mode, as pg_rewind
    // and Patroni do, which ends with a shutdown checkpoint too): the run
    // that shut down cleanly began with commits lost, and is no clean end.
    let crash_pending = Path::new(PENDING_FILE).exists();
    if !crash_restart {
        remove_leftover_temporary_files();
        super::saved_record::check_at_start();
        match start_kind() {
            // A copy of another server's directory: what it was about to
            // compare belongs to that server's WAL.
            StartKind::Copy => {
                if std::fs::remove_file(PENDING_FILE).is_ok() {
                    let _ = sync_dir();
                }
            }
            // Crashes of this server not compared yet can no longer be:
            // the WAL it replays from now on is another server's.
            StartKind::Rejoining => pending_to_unknown(),
            StartKind::Own => {}
        }
    }
    let boot_id = current_boot_id();
    let capacity = LOST_COMMITS_RING_SIZE.get() as u32;
    let (path, other_place) = ring_paths();
    let on_persistent_memory = other_place.is_some();
    let shown = path.to_string_lossy().into_owned();
    let crashed = crash_restart || !control.clean_shutdown;
    let previous = match current {
        Some(ring) => Found::Ring(ring),
        None if crash_restart => {
            // The run that crashed kept no record.
            let why = POSTMASTER.record_off.borrow().clone().unwrap_or_else(|| "the record was not kept".into());
            note_unknown_crash(why);
            Found::Missing
        }
        None => map_existing(&path),
    };
    let previous = match previous {
        Found::Ring(prev) => {
            if crashed {
                keep(&prev, &control, &boot_id, crash_restart);
                let s = prev.snapshot();
                let held = s.entries.len() as u64 + s.summary.count;
                // Not after a base backup or pg_rewind (backup_label): the
                // record is then the source server's.
                // An empty record of a primary after a machine restart may
                // have lost every entry: saved, marked. (A standby's is
                // always empty: it would stand for no failover.)
                let lost = lost_at_restart(&s, &boot_id, crash_restart);
                if (held > 0 || (lost && control.in_production)) && s.system_id == control.system_id && !Path::new("backup_label").exists() {
                    super::saved_record::save(&shown, control.system_id, held, lost, own_report_cannot_list());
                }
            } else if let Some(end) = control.shutdown_checkpoint.filter(|_| {
                // A primary shut down cleanly and starting as a standby (a
                // switchover; not a copy, not rewound: no backup_label):
                // its record, stamped with that shutdown checkpoint, shows
                // the server promoted meanwhile that this run lost nothing.
                // SAFETY: a plain read of a flag set at process start.
                let postmaster = unsafe { pg_sys::IsPostmasterEnvironment };
                !crash_restart
                    && !crash_pending
                    && postmaster
                    && !prev.single_user_run()
                    && start_kind() == StartKind::Rejoining
                    && !Path::new("backup_label").exists()
            }) {
                if let (true, Some(tli)) = (prev.system_id() == control.system_id, control.checkpoint_timeline) {
                    super::saved_record::save_clean_end(&shown, control.system_id, end, tli);
                }
            }
            Some(prev)
        }
        Found::Missing => {
            if crashed && !crash_restart && !record_in_other_place(&other_place) {
                note_unknown_crash(format!("the record file \"{shown}\" was missing after the crash"));
            }
            None
        }
        Found::Damaged(why, salvaged) => {
            let salvaged_entries = salvaged.as_ref().map_or(0, |s| s.entries.len() as u64 + s.summary.count);
            let salvaged_lost_at_restart = salvaged.as_ref().is_some_and(|s| lost_at_restart(s, &boot_id, crash_restart));
            if crashed {
                match salvaged {
                    Some(snapshot) if start_kind() == StartKind::Own && snapshot.system_id == control.system_id => write_or_remember(
                        &snapshot,
                        Status::UnknownNoRecord(format!("{why}; its readable entries were compared")),
                    ),
                    _ => note_unknown_crash(why.clone()),
                }
            }
            pgrx::warning!("delayed_durability: {why}; a new record is started");
            // A torn record is still what a failover's import can salvage.
            if crashed && (salvaged_entries > 0 || (salvaged_lost_at_restart && control.in_production)) && !Path::new("backup_label").exists() {
                super::saved_record::save(&shown, control.system_id, salvaged_entries, salvaged_lost_at_restart, own_report_cannot_list());
            }
            move_aside(&shown);
            None
        }
    };
    // A record left in the data directory by a run without the buffer.
    if let (false, Some(other)) = (crash_restart, &other_place) {
        match map_existing(other) {
            Found::Ring(old) => {
                if !control.clean_shutdown {
                    keep(&old, &control, &boot_id, false);
                }
                old.mapping().unmap();
            }
            Found::Damaged(why, _) if !control.clean_shutdown => note_unknown_crash(why),
            _ => {}
        }
        let _ = std::fs::remove_file(other.to_string_lossy().as_ref());
    }
    let created = previous.is_none();
    let map = match previous {
        Some(prev) if prev.capacity() == capacity => prev.mapping(),
        other => {
            if let Some(prev) = other {
                // Its crash is noted: the file goes before a new one of
                // another size is made, so that a failure cannot leave the
                // old record to be read after the next crash.
                prev.mapping().unmap();
                let _ = std::fs::remove_file(&shown);
            }
            pmem::map(&path, Some(ring::file_len(capacity))).map_err(|e| format!("could not map \"{shown}\": {e}"))?
        }
    };
    // Where earlier runs' commits end, when known now (else at the first entry).
    let run_start = control.shutdown_checkpoint.filter(|_| !crash_restart).map_or(0, |(at, _)| at);
    // SAFETY: a plain read of a flag set at process start.
    let single_user = !unsafe { pg_sys::IsPostmasterEnvironment };
    let ring = match Ring::format(map, capacity, control.system_id, boot_id, on_persistent_memory, run_start, single_user) {
        Ok(ring) => ring,
        Err(e) => {
            // A file that is not known to be durable as an empty record must
            // not be read as one after the next crash: it goes.
            map.unmap();
            let _ = std::fs::remove_file(&shown);
            return Err(format!("could not write \"{shown}\": {e}"));
        }
    };
    if created {
        // The new file's directory entry, so that it is there after a machine crash.
        let dir = Path::new(&shown).parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    if !crash_restart && on_persistent_memory {
        pgrx::log!("delayed_durability: acknowledged delayed commits are recorded on persistent memory in \"{shown}\"");
    }
    Ok(ring)
}

/// With the record on persistent memory, a missing file there is expected
/// when the last run kept it in the data directory.
fn record_in_other_place(other_place: &Option<CString>) -> bool {
    other_place.as_ref().is_some_and(|other| Path::new(other.to_string_lossy().as_ref()).exists())
}

/// This start cannot list what the crashed run lost by itself: it rejoins
/// as a standby, or is a single-user crash recovery (pg_rewind's, before
/// it rewinds the data directory and drops the record).
fn own_report_cannot_list() -> bool {
    // SAFETY: a plain read of a flag set at process start.
    start_kind() == StartKind::Rejoining || !unsafe { pg_sys::IsPostmasterEnvironment }
}

/// A crash whose record is compared once recovery finished.
fn keep(ring: &Ring, control: &Control, boot_id: &[u8; ring::BOOT_ID_LEN], crash_restart: bool) {
    note_crash(ring, control, boot_id, crash_restart);
}

/// A crash of which nothing can be compared: an "unknown" row, why.
fn note_unknown_crash(why: String) {
    match start_kind() {
        StartKind::Copy => {}
        StartKind::Rejoining => report_unknown_now(vec![(why, 0)]),
        StartKind::Own => {
            let empty = Snapshot {
                entries: Vec::new(),
                torn: false,
                summary: Summary::default(),
                incomplete: false,
                lost_at_restart: false,
                salvaged: false,
                boot_id: [0; ring::BOOT_ID_LEN],
                covers_from: 0,
                ended_at: (0, 0),
                persistent: false,
                system_id: 0,
                lapped: false,
            };
            write_or_remember(&empty, Status::UnknownNoRecord(why));
        }
    }
}

/// Writes a crash to `pending`, with the crashes that could not be written
/// before; when that fails too, keeps them in the postmaster's memory,
/// where the views find them.
fn write_or_remember(snapshot: &Snapshot, status: Status) {
    let why = match status.why_unknown() {
        why if why.is_empty() => "the record of the crash could not be written down".to_string(),
        why => why,
    };
    if let Err(e) = write_pending(snapshot, status) {
        let why = format!("{why}; its row could not be written to \"{PENDING_FILE}\": {e}");
        pgrx::warning!("delayed_durability: a crash cannot be compared: {why}");
        POSTMASTER.unwritten.borrow_mut().push((crate::stats::now(), why));
    }
}

/// How this start stands to the record of acknowledged commits.
#[derive(Clone, Copy, PartialEq)]
enum StartKind {
    /// A start of this server on its own WAL: a normal start, a crash
    /// restart, archive recovery (recovery.signal). A crash is compared
    /// once recovery finished.
    Own,
    /// A copy of another server's data directory (pg_basebackup's
    /// backup_label): the record and the pending comparisons there are
    /// that server's.
    Copy,
    /// This server rejoins another one: it starts as a standby
    /// (standby.signal) or was rewound by pg_rewind. The WAL it replays
    /// from now on is the other server's, so its own acknowledged delayed
    /// commits cannot be compared with it: a crash is reported unknown at
    /// once.
    Rejoining,
}

fn start_kind() -> StartKind {
    match std::fs::read_to_string("backup_label") {
        Ok(label) if label.contains("BACKUP METHOD: pg_rewind") => StartKind::Rejoining,
        Ok(_) => StartKind::Copy,
        Err(_) if Path::new("standby.signal").exists() => StartKind::Rejoining,
        Err(_) => StartKind::Own,
    }
}

const REJOINING: &str = "the server restarted as a standby or was rewound by pg_rewind before its acknowledged \
delayed commits could be compared with its own WAL (the WAL it replays now is another server's)";

/// Appends crash rows straight to the report, each unknown with why and
/// how many acknowledged commits its record held (postmaster, at start).
fn report_unknown_now(rows: Vec<(String, u64)>) {
    let now = crate::stats::now();
    let mut out = String::new();
    let mut id = next_crash_id();
    for (why, held) in rows {
        let held = if held > 0 { format!("; its record held {held} acknowledged delayed commits") } else { String::new() };
        let _ = writeln!(out, "crash\t{id}\t{now}\t0\t-\t0\t0\tunknown: {}{held}", why.replace(['\t', '\n'], " "));
        id += 1;
    }
    if let Err(e) = append_report(&out) {
        pgrx::warning!("delayed_durability: a crash cannot be reported: could not write \"{REPORT_FILE}\": {e}");
        POSTMASTER.unwritten.borrow_mut().push((now, format!("{REJOINING}; could not write \"{REPORT_FILE}\": {e}")));
    }
}

/// The crashes still pending, reported unknown (a rejoining server).
fn pending_to_unknown() {
    let Ok(text) = std::fs::read_to_string(PENDING_FILE) else { return };
    let rows: Vec<(String, u64)> = parse_pending(&text)
        .into_iter()
        .map(|c| {
            let why = match c.status.why_unknown() {
                why if why.is_empty() => REJOINING.to_string(),
                why => format!("{why}; and {REJOINING}"),
            };
            (why, c.entries.len() as u64 + c.summary.count)
        })
        .collect();
    report_unknown_now(rows);
    if std::fs::remove_file(PENDING_FILE).is_ok() {
        let _ = sync_dir();
    }
}

/// Crash ids are unique and grow: past every id pending or reported, even
/// within one microsecond.
pub(super) fn next_crash_id() -> i64 {
    let pending = std::fs::read_to_string(PENDING_FILE).unwrap_or_default();
    let highest = parse_pending(&pending)
        .iter()
        .map(|c| c.id)
        .chain(read_report().unwrap_or_default().crashes.iter().map(|c| c.id))
        .max()
        .unwrap_or(0);
    crate::stats::now().max(highest + 1)
}

/// Appends lines to the report, rewritten and renamed into place (a crash
/// in between leaves the old report whole).
pub(super) fn append_report(lines: &str) -> std::io::Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let _lock = lock_report()?;
    let mut text = match read_text(REPORT_FILE) {
        Ok(text) => text.unwrap_or_default(),
        Err(e) => {
            set_aside_report(&e);
            read_text(REPORT_FILE).ok().flatten().unwrap_or_default()
        }
    };
    text.push_str(lines);
    write_whole(REPORT_FILE, &text)
}

/// Whether a crashed run's record may have lost its last entries with the
/// page cache: not on persistent memory, and the machine restarted since it
/// was written (not a crash restart of the server alone).
fn lost_at_restart(snapshot: &Snapshot, boot_id: &[u8; ring::BOOT_ID_LEN], crash_restart: bool) -> bool {
    // A boot id that could not be read proves nothing: treated as changed.
    let no_boot_id = |id: &[u8; ring::BOOT_ID_LEN]| id.iter().all(|&b| b == 0);
    let rebooted = snapshot.boot_id != *boot_id || no_boot_id(boot_id) || no_boot_id(&snapshot.boot_id);
    !crash_restart && rebooted && !snapshot.persistent
}

fn note_crash(prev: &Ring, control: &Control, boot_id: &[u8; ring::BOOT_ID_LEN], crash_restart: bool) {
    match start_kind() {
        StartKind::Copy => {
            pgrx::log!(
                "delayed_durability: the server starts from a base backup; the record of acknowledged delayed commits it holds is another server's and is not compared"
            );
            return;
        }
        StartKind::Rejoining => {
            // A standby's own record is empty unless it crashed as a primary.
            let s = prev.snapshot();
            let held = s.entries.len() as u64 + s.summary.count;
            if held > 0 || s.incomplete {
                report_unknown_now(vec![(REJOINING.to_string(), held)]);
            }
            return;
        }
        StartKind::Own => {}
    }
    if prev.system_id() != control.system_id {
        note_unknown_crash(format!(
            "the record file belongs to another cluster (system identifier {})",
            prev.system_id()
        ));
        return;
    }
    let snapshot = prev.snapshot();
    let status = if lost_at_restart(&snapshot, boot_id, crash_restart) {
        Status::UnknownRestart
    } else if snapshot.incomplete {
        Status::UnknownIncomplete
    } else if snapshot.torn {
        Status::UnknownTorn
    } else {
        Status::Exact
    };
    write_or_remember(&snapshot, status);
}

fn write_pending(snapshot: &Snapshot, status: Status) -> std::io::Result<()> {
    // A block still pending was never compared, and the WAL written since
    // reuses the positions past its end: it can no longer be exact.
    let mut text = String::new();
    let mut last_id = next_crash_id() - 1;
    // A noted crash that cannot be read: moved aside, and kept as a crash
    // with no record rather than written over.
    let mut unreadable = None;
    let old = read_text(PENDING_FILE).unwrap_or_else(|e| {
        set_aside_unreadable(PENDING_FILE, &e);
        unreadable = Some(format!("its noted record \"{PENDING_FILE}\" could not be read: {e}"));
        None
    });
    if let Some(old) = old {
        for line in old.lines() {
            let mut fields: Vec<&str> = line.split('\t').collect();
            if fields.first() == Some(&"crash") && fields.len() > 2 {
                last_id = last_id.max(fields[1].parse::<i64>().unwrap_or(0));
                if fields[2] == Status::Exact.name() {
                    fields[2] = Status::UnknownSecondCrash.name();
                }
            }
            let _ = writeln!(text, "{}", fields.join("\t"));
        }
    }
    // Crashes whose rows could not be written before come first (older).
    let unwritten = POSTMASTER.unwritten.borrow().clone();
    for (noted_at, why) in &unwritten {
        last_id = (*noted_at).max(last_id + 1);
        let _ = writeln!(text, "crash\t{last_id}\tunknown-no-record\t0\t0\t0\t0\t0\t{}", why.replace(['\t', '\n'], " "));
    }
    if let Some(why) = unreadable {
        last_id = crate::stats::now().max(last_id + 1);
        let _ = writeln!(text, "crash\t{last_id}\tunknown-no-record\t0\t0\t0\t0\t0\t{}", why.replace(['\t', '\n'], " "));
    }
    let id = crate::stats::now().max(last_id + 1);
    let s = snapshot.summary;
    let _ = writeln!(
        text,
        "crash\t{id}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        status.name(),
        s.count,
        s.min_end,
        s.max_end,
        s.min_time,
        s.max_time,
        status.reason().replace(['\t', '\n'], " ")
    );
    for a in &snapshot.entries {
        let _ = writeln!(text, "ack\t{}\t{}\t{}\t{}", a.fxid, a.datid, a.commit_end, a.ack_time);
    }
    write_whole(PENDING_FILE, &text)?;
    POSTMASTER.unwritten.borrow_mut().clear();
    Ok(())
}

// -------------------------------------------------------------------- worker

struct PendingCrash {
    id: i64,
    status: Status,
    summary: Summary,
    entries: Vec<Acked>,
}

fn parse_pending(text: &str) -> Vec<PendingCrash> {
    let mut crashes: Vec<PendingCrash> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        match f.first() {
            Some(&"crash") if f.len() >= 8 => crashes.push(PendingCrash {
                id: n(1),
                status: Status::parse(f[2], f.get(8).copied().unwrap_or("")),
                summary: Summary {
                    count: n(3) as u64,
                    min_end: n(4) as u64,
                    max_end: n(5) as u64,
                    min_time: n(6),
                    max_time: n(7),
                },
                entries: Vec::new(),
            }),
            Some(&"ack") if f.len() >= 5 => {
                if let Some(c) = crashes.last_mut() {
                    c.entries.push(Acked {
                        fxid: n(1) as u64,
                        datid: n(2) as u32,
                        commit_end: n(3) as u64,
                        ack_time: n(4),
                    });
                }
            }
            _ => {}
        }
    }
    crashes
}

pub(super) fn time_text(t: i64) -> String {
    // SAFETY: formats a timestamp into a static buffer; copied at once.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::timestamptz_to_str(t)) }.to_string_lossy().into_owned()
}

/// Compares every pending crash with the end of the recovered WAL and
/// appends the outcome to the report.
pub(super) fn compare_pending() -> std::io::Result<()> {
    let text = match read_text(PENDING_FILE) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(()),
        // A crash happened (its record was noted) but cannot be listed.
        Err(e) => {
            set_aside_unreadable(PENDING_FILE, &e);
            report_unknown_now(vec![(format!("the noted record of the crash \"{PENDING_FILE}\" could not be read: {e}"), 0)]);
            return Ok(());
        }
    };
    // SAFETY: reads shared recovery state; after crash recovery it is the
    // end of the last record replayed, i.e. of the recovered WAL.
    let recovered_end = unsafe { pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut()) };
    let recovered_at = crate::stats::now();
    let reported: Vec<i64> = report_to_extend().crashes.iter().map(|c| c.id).collect();
    let mut out = String::new();
    let pending: Vec<_> = parse_pending(&text).into_iter().filter(|c| !reported.contains(&c.id)).collect();
    let newest = pending.iter().map(|c| c.id).max();
    for crash in pending {
        let mut lost: Vec<&Acked> = crash.entries.iter().filter(|a| a.commit_end > recovered_end).collect();
        lost.sort_by_key(|a| a.commit_end);
        let s = crash.summary;
        let summarized_may_be_lost = if s.count > 0 && s.max_end > recovered_end { s.count } else { 0 };
        let mut status = crash.status;
        let mut why = status.why_unknown().to_string();
        if recovered_end == 0 {
            // The server was stopped cleanly and started again before the
            // comparison could run (no worker slot, say): no crash recovery
            // to compare with, and new WAL may reuse the positions.
            status = Status::UnknownSecondCrash;
            why = "the server restarted before the comparison could run".into();
        }
        let exact = status == Status::Exact && summarized_may_be_lost == 0;
        let detail = if status != Status::Exact {
            format!("unknown: {why}; the {} listed are certainly lost", lost.len())
        } else if summarized_may_be_lost > 0 {
            format!(
                "{} listed, and up to {} more that the full record summarized (LSN {}..{})",
                lost.len(),
                summarized_may_be_lost,
                lsn_text(s.min_end),
                lsn_text(s.max_end)
            )
        } else {
            format!("exact: {} of {} recorded acknowledged delayed commits lost", lost.len(), crash.entries.len())
        };
        let lost_count = if status == Status::Exact { lost.len().to_string() } else { "-".into() };
        // A crash another one followed before this comparison (whatever
        // its status): where its own recovery ended is unknown (the WAL
        // after it was written again), so receipts cannot be judged by
        // this one's end.
        let row_end = if Some(crash.id) == newest { recovered_end } else { 0 };
        let _ = writeln!(
            out,
            "crash\t{}\t{recovered_at}\t{row_end}\t{lost_count}\t{summarized_may_be_lost}\t{}\t{}",
            crash.id,
            exact as u8,
            detail.replace(['\t', '\n'], " ")
        );
        for a in &lost {
            let _ = writeln!(out, "lost\t{}\t{}\t{}\t{}\t{}", crash.id, a.fxid, a.datid, a.commit_end, a.ack_time);
        }
        if status != Status::Exact {
            pgrx::log!(
                "delayed_durability: unknown how many acknowledged delayed commits were lost: {why}; {} listed in delayed_durability_lost_commits are certainly lost",
                lost.len()
            );
        } else if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
            let (t1, t2) =
                (lost.iter().map(|a| a.ack_time).min().unwrap(), lost.iter().map(|a| a.ack_time).max().unwrap());
            pgrx::log!(
                "delayed_durability: {} acknowledged delayed commits were lost (LSN {}..{}, acknowledged between {} and {}){}",
                lost.len(),
                lsn_text(first.commit_end),
                lsn_text(last.commit_end),
                time_text(t1),
                time_text(t2),
                if summarized_may_be_lost > 0 { format!(", and up to {summarized_may_be_lost} more summarized") } else { String::new() }
            );
        } else {
            pgrx::log!(
                "delayed_durability: 0 acknowledged delayed commits were lost ({} recorded, all in the recovered WAL up to {}){}",
                crash.entries.len(),
                lsn_text(recovered_end),
                if summarized_may_be_lost > 0 { format!("; up to {summarized_may_be_lost} summarized ones may be") } else { String::new() }
            );
        }
    }
    // A crash in between leaves the old report and the pending record,
    // never half a crash.
    append_report(&out)?;
    std::fs::remove_file(PENDING_FILE)?;
    sync_dir()
}


// --------------------------------------------------------------------- views

pub(super) struct ReportedCrash {
    pub id: i64,
    pub recovered_at: i64,
    pub recovered_end: u64,
    pub lost: Option<i64>,
    pub summarized: i64,
    pub exact: bool,
    pub detail: String,
}

pub(super) struct LostCommit {
    pub crash: i64,
    pub acked: Acked,
}

#[derive(Default)]
pub(super) struct Report {
    pub crashes: Vec<ReportedCrash>,
    pub lost: Vec<LostCommit>,
    /// When each crash forgotten by a reset was recovered, and up to
    /// where: receipts still need them (0: unknown).
    pub recoveries: Vec<(i64, u64)>,
}

/// A report file's text: None when there is none. A file that exists but
/// cannot be read (permissions, an I/O error, bytes that are not text) is
/// an error, never an empty report.
pub(super) fn read_text(path: &str) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// For the report's writers (the worker, the postmaster): a report file
/// that cannot be read is moved aside as `<file>.damaged`, with a WARNING,
/// and a new one starts; rewriting it would destroy what it holds.
pub(super) fn set_aside_unreadable(path: &str, e: &std::io::Error) {
    // Never over an earlier one.
    let mut aside = format!("{path}.damaged");
    if std::path::Path::new(&aside).exists() {
        aside = format!("{path}.damaged.{}", crate::stats::now());
    }
    match std::fs::rename(path, &aside) {
        Ok(()) => {
            let _ = sync_dir();
            pgrx::warning!("delayed_durability: \"{path}\" could not be read ({e}); it was moved to \"{aside}\" and a new one starts");
        }
        Err(r) => pgrx::warning!("delayed_durability: \"{path}\" could not be read ({e}) nor moved aside ({r})"),
    }
}

/// The crash report for its writers: an unreadable one is set aside, and
/// the new one begins with a recovery of unknown end, so that receipts of
/// commits made before it read unknown, never durable.
fn report_to_extend() -> Report {
    read_report().unwrap_or_else(|e| {
        set_aside_report(&e);
        Report { recoveries: vec![(crate::stats::now(), 0)], ..Report::default() }
    })
}

fn set_aside_report(e: &std::io::Error) {
    set_aside_unreadable(REPORT_FILE, e);
    if !std::path::Path::new(REPORT_FILE).exists() {
        let _ = std::fs::write(REPORT_FILE, format!("recovery\t{}\t0\n", crate::stats::now()));
    }
}

/// The crash report for the views: an unreadable one is an error.
fn report_to_show() -> Report {
    read_report().unwrap_or_else(|e| {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("could not read the crash report \"{REPORT_FILE}\": {e}"),
            "",
        )
        .set_hint("Fix the file's permissions, or move it away; the server moves an unreadable report aside at its next crash.")
        .report(PgLogLevel::ERROR);
        unreachable!("ERROR does not return")
    })
}

pub(super) fn read_report() -> std::io::Result<Report> {
    let mut report = Report::default();
    let Some(text) = read_text(REPORT_FILE)? else {
        return Ok(report);
    };
    for line in text.lines() {
        let f: Vec<&str> = line.splitn(9, '\t').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        match f.first() {
            Some(&"crash") if f.len() >= 8 => report.crashes.push(ReportedCrash {
                id: n(1),
                recovered_at: n(2),
                recovered_end: n(3) as u64,
                lost: f[4].parse().ok(),
                summarized: n(5),
                exact: f[6] == "1",
                detail: f[7].to_string(),
            }),
            Some(&"recovery") if f.len() >= 3 => report.recoveries.push((n(1), n(2) as u64)),
            Some(&"lost") if f.len() >= 6 => report.lost.push(LostCommit {
                crash: n(1),
                acked: Acked { fxid: n(2) as u64, datid: n(3) as u32, commit_end: n(4) as u64, ack_time: n(5) },
            }),
            _ => {}
        }
    }
    Ok(report)
}

/// The report is for superusers and the roles granted SELECT on its view;
/// the function under the view checks the view's privilege, so calling it
/// directly grants nothing more.
pub(super) fn require_view_privilege(view: &str) {
    let query = format!(
        "SELECT pg_catalog.has_table_privilege(c.oid, 'SELECT') \
           FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_class c ON c.relnamespace = e.extnamespace \
          WHERE e.extname = 'delayed_durability' AND c.relname = '{view}'"
    );
    // A read-only query: Spi::get_one() would assign a transaction id.
    let allowed = Spi::connect(|client| client.select(&query, Some(1), &[])?.first().get_one::<bool>());
    if allowed.ok().flatten() != Some(true) {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for view {view}"),
            "",
        )
        .set_hint(&format!("A superuser can run GRANT SELECT ON {view} TO the role."))
        .report(PgLogLevel::ERROR);
    }
}

pub(super) fn timestamp(t: i64) -> Option<TimestampWithTimeZone> {
    TimestampWithTimeZone::try_from(t).ok()
}

#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_crash_rows() -> TableIterator<
    'static,
    (
        name!(crash_recovered_at, Option<TimestampWithTimeZone>),
        name!(recovered_end, i64),
        name!(lost_commits, Option<i64>),
        name!(summarized_commits, i64),
        name!(exact, bool),
        name!(detail, String),
    ),
> {
    crate::preload::require_preloaded();
    require_view_privilege("delayed_durability_crashes");
    let mut rows: Vec<_> = report_to_show()
        .crashes
        .into_iter()
        .map(|c| (timestamp(c.recovered_at), c.recovered_end as i64, c.lost, c.summarized, c.exact, c.detail))
        .collect();
    // Crashes the postmaster could not write down (it forked this backend
    // after noting them).
    rows.extend(
        POSTMASTER
            .unwritten
            .borrow()
            .iter()
            .map(|(t, why)| (timestamp(*t), 0, None, 0, false, format!("unknown: {why}"))),
    );
    TableIterator::new(rows)
}

#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_lost_commit_rows() -> TableIterator<
    'static,
    (
        name!(xid, i64),
        name!(datid, pg_sys::Oid),
        name!(commit_end, i64),
        name!(acknowledged_at, Option<TimestampWithTimeZone>),
        name!(crash_recovered_at, Option<TimestampWithTimeZone>),
    ),
> {
    crate::preload::require_preloaded();
    require_view_privilege("delayed_durability_lost_commits");
    let report = report_to_show();
    let rows: Vec<_> = report
        .lost
        .iter()
        .map(|l| {
            let recovered_at = report.crashes.iter().find(|c| c.id == l.crash).map(|c| c.recovered_at);
            (
                l.acked.fxid as i64,
                pg_sys::Oid::from(l.acked.datid),
                l.acked.commit_end as i64,
                timestamp(l.acked.ack_time),
                recovered_at.and_then(timestamp),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Forgets every reported crash: removes the report file.
/// Forgets the crashes and their lost commits, but not when each crash was
/// recovered and up to where: a receipt of a commit one of them lost must
/// not read durable once the report is reset.
pub(super) fn forget_crashes() -> std::io::Result<()> {
    let _lock = lock_report()?;
    let report = read_report().map_err(|e| std::io::Error::new(e.kind(), format!("could not read \"{REPORT_FILE}\": {e}")))?;
    let mut text = String::new();
    for (at, end) in report.recoveries.iter().copied().chain(report.crashes.iter().map(|c| (c.recovered_at, c.recovered_end))) {
        let _ = writeln!(text, "recovery\t{at}\t{end}");
    }
    write_whole(REPORT_FILE, &text)
}

/// Whether a crash since `at` lost the commit of `fxid` that ended at `end`:
/// Some((true, why)) when it did, Some((false, why)) when a crash since
/// cannot tell, None when no crash since touched it.
pub(super) fn lost_since(fxid: u64, end: u64, at: i64) -> Option<(bool, String)> {
    let report = match read_report() {
        Ok(report) => report,
        Err(e) => return Some((false, format!("the crash report \"{REPORT_FILE}\" cannot be read: {e}"))),
    };
    let recovered_at = |id: i64| report.crashes.iter().find(|c| c.id == id).map(|c| time_text(c.recovered_at));
    if let Some(l) = report.lost.iter().find(|l| l.acked.fxid == fxid && l.acked.commit_end == end) {
        return Some((true, format!("lost in the crash recovered at {}", recovered_at(l.crash).unwrap_or_default())));
    }
    let crashes = report.crashes.iter().map(|c| (c.recovered_at, c.recovered_end, c.detail.as_str()));
    let forgotten = report.recoveries.iter().map(|&(at, end)| (at, end, "reset from the report since"));
    for (recovered_at, recovered_end, detail) in crashes.chain(forgotten).filter(|c| c.0 > at) {
        if recovered_end == 0 {
            return Some((false, format!("a crash after the commit ({detail}) could not be compared")));
        }
        if recovered_end < end {
            return Some((
                true,
                format!(
                    "the crash recovered at {} replayed WAL up to {} only, before the commit's end",
                    time_text(recovered_at),
                    lsn_text(recovered_end)
                ),
            ));
        }
    }
    if std::path::Path::new(PENDING_FILE).exists() {
        return Some((false, "a crash is waiting to be compared".into()));
    }
    None
}

//! Failovers, reported like crashes.
//!
//! - When this server finishes recovery on a newer timeline than the last
//!   one it ran on (a promotion; that timeline is kept in
//!   `delayed_durability/failovers` with the events, written at once, and
//!   a base backup copies it along), it records a failover: old and new
//!   timeline, where the old one was left (from PostgreSQL's history file)
//!   and when, with a LOG line. Until the old
//!   primary's record of acknowledged delayed commits is imported, the row
//!   says what is known (the switch point), and is not exact.
//! - `delayed_durability_import_failover_record(path)` reads that record (a
//!   copy of the old primary's `delayed_durability/commits`, or of its file
//!   next to the persistent WAL buffer) and lists, as lost in the failover,
//!   every acknowledged delayed commit whose commit record ends past the
//!   switch point.
//! - A failover row that came with `pg_rewind` from the server promoted
//!   then (still waiting there for this server's record, when this server
//!   was its old primary) is completed at this server's own later
//!   promotion from its own saved record of that timeline.
//! - `delayed_durability_exposure(lsn)`: what a promotion of a standby that
//!   has flushed WAL up to `lsn` would lose now, from this primary's record.

use super::report;
use super::ring::{self, Acked, Ring};
use crate::flush::lsn_text;
use crate::walbuf::pmem::Mapping;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::fmt::Write as _;

const FAILOVER_FILE: &str = "delayed_durability/failovers";

struct Failover {
    id: i64,
    at: i64,
    old_tli: u32,
    new_tli: u32,
    switch: u64,
    /// Imported: how many were lost.
    lost: Option<i64>,
    detail: String,
}

#[derive(Default)]
struct Failovers {
    /// The timeline this server last ran on.
    timeline: Option<u32>,
    events: Vec<Failover>,
    lost: Vec<(i64, Acked)>,
    /// Which record each imported failover's list came from (a
    /// fingerprint of its bytes): a record delivered twice is taken once.
    records: Vec<(i64, String)>,
    /// A failover whose old timeline ends with a shutdown checkpoint, read
    /// at the promotion (its WAL may be gone when the old primary rejoins):
    /// where it starts and its time.
    shutdown_checkpoints: Vec<(i64, u64, i64)>,
}

/// Held around every read-modify-write of the failovers file: the worker
/// (a promotion noted), backends (an import, a delivery, a reset) may
/// write at once. Released when the file is closed.
fn lock() -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(format!("{FAILOVER_FILE}.lock"))?;
    file.lock()?;
    Ok(file)
}

/// FNV-1a of a record's bytes: tells a record delivered again from a new one.
fn fingerprint(bytes: &[u8]) -> String {
    format!("{:016x}", super::fnv1a(bytes))
}

/// The failover history for the report worker: an unreadable one is set
/// aside (WARNING) and a new one starts.
fn failovers_to_extend() -> Failovers {
    read_failovers().unwrap_or_else(|e| {
        report::set_aside_unreadable(FAILOVER_FILE, &e);
        Failovers::default()
    })
}

/// The failover history for SQL: an unreadable one is an error.
fn failovers_to_show() -> Failovers {
    read_failovers().unwrap_or_else(|e| {
        error(
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("could not read the failover history \"{FAILOVER_FILE}\": {e}"),
            "Fix the file's permissions, or move it away; the report worker moves an unreadable history aside at the next start.",
        )
    })
}

fn read_failovers() -> std::io::Result<Failovers> {
    let mut out = Failovers::default();
    let text = report::read_text(FAILOVER_FILE)?.unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.splitn(8, '\t').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        match f.first() {
            Some(&"timeline") if f.len() >= 2 => out.timeline = f[1].trim().parse().ok(),
            Some(&"failover") if f.len() >= 8 => out.events.push(Failover {
                id: n(1),
                at: n(2),
                old_tli: n(3) as u32,
                new_tli: n(4) as u32,
                switch: n(5) as u64,
                lost: f[6].parse().ok(),
                detail: f[7].to_string(),
            }),
            Some(&"lost") if f.len() >= 6 => out
                .lost
                .push((n(1), Acked { fxid: n(2) as u64, datid: n(3) as u32, commit_end: n(4) as u64, ack_time: n(5) })),
            Some(&"record") if f.len() >= 3 => out.records.push((n(1), f[2].to_string())),
            Some(&"shutdown_checkpoint") if f.len() >= 4 => out.shutdown_checkpoints.push((n(1), n(2) as u64, n(3))),
            _ => {}
        }
    }
    Ok(out)
}

fn write_failovers(f: &Failovers) -> std::io::Result<()> {
    let mut text = String::new();
    if let Some(tli) = f.timeline {
        let _ = writeln!(text, "timeline\t{tli}");
    }
    for e in &f.events {
        let lost = e.lost.map_or("-".to_string(), |n| n.to_string());
        let detail = e.detail.replace(['\t', '\n'], " ");
        let _ = writeln!(text, "failover\t{}\t{}\t{}\t{}\t{}\t{lost}\t{detail}", e.id, e.at, e.old_tli, e.new_tli, e.switch);
    }
    for (id, a) in &f.lost {
        let _ = writeln!(text, "lost\t{id}\t{}\t{}\t{}\t{}", a.fxid, a.datid, a.commit_end, a.ack_time);
    }
    for (id, fp) in &f.records {
        let _ = writeln!(text, "record\t{id}\t{fp}");
    }
    for (id, start, time) in &f.shutdown_checkpoints {
        let _ = writeln!(text, "shutdown_checkpoint\t{id}\t{start}\t{time}");
    }
    // The worker and a backend (the import, the reset) may write at once.
    report::write_whole(FAILOVER_FILE, &text)
}

/// Forgets every recorded failover and its lost commits; keeps the
/// timeline this server last ran on, so the next start does not record
/// the last promotion again.
pub(super) fn forget() -> std::io::Result<()> {
    let _lock = lock()?;
    let mut failovers = read_failovers()?;
    if failovers.events.is_empty() && failovers.lost.is_empty() {
        return Ok(());
    }
    failovers.events.clear();
    failovers.lost.clear();
    failovers.records.clear();
    failovers.shutdown_checkpoints.clear();
    write_failovers(&failovers)
        .map_err(|e| std::io::Error::new(e.kind(), format!("could not write \"{FAILOVER_FILE}\": {e}")))
}

fn not_imported(old_tli: u32, new_tli: u32, switch: u64) -> String {
    format!(
        "unknown: timeline {old_tli} was left at {} for {new_tli}; the delayed commits the old primary \
acknowledged past it are lost; its record lists them once the old primary delivers it, rejoining as a standby, or \
once it is imported with delayed_durability_import_failover_record()",
        lsn_text(switch)
    )
}

/// In the report worker on a standby: notes a newer timeline it follows
/// (never an older one), without recording a failover.
pub fn follow_timeline() -> std::io::Result<()> {
    // Not timeline::current(): a promotion completing right now must be
    // left to note_timeline(), which records it as a failover.
    let Some(current) = crate::timeline::followed() else { return Ok(()) };
    let _lock = lock()?;
    let mut failovers = failovers_to_extend();
    if failovers.timeline.is_some_and(|t| t >= current) {
        return Ok(());
    }
    failovers.timeline = Some(current);
    write_failovers(&failovers)
}

extern "C-unwind" {
    fn dd_wal_receiver_streaming(end: *mut u64, tli: *mut u32) -> bool;
}

/// In the report worker on a standby: the newest end of WAL the server it
/// streams from reported, on which timeline, and when this worker saw it
/// change (the WAL receiver's own time is reset at each reconnection).
struct Heard(std::cell::Cell<Option<(u64, u32, i64)>>);
// SAFETY: the worker process runs this code on one thread only.
unsafe impl Sync for Heard {}
static HEARD: Heard = Heard(std::cell::Cell::new(None));

/// Called every second while in recovery: samples what the WAL receiver
/// heard, only while it streams (a reconnection keeps the old position).
pub fn sample_upstream() {
    let (mut end, mut tli) = (0u64, 0u32);
    // SAFETY: reads the WAL receiver's shared state under its spinlock; raises nothing.
    if !unsafe { dd_wal_receiver_streaming(&mut end, &mut tli) } {
        return;
    }
    match HEARD.0.get() {
        Some((e, t, _)) if t == tli && e >= end => {}
        _ => HEARD.0.set(Some((end, tli, crate::stats::now()))),
    }
}

/// What is known without the old primary's record: a lower bound of how
/// far the server this one streamed from had flushed, against the switch
/// point.
fn heard_detail(end: u64, heard_at: i64, now: i64, switch: u64) -> String {
    let before = (now - heard_at).max(0) as f64 / 1e6;
    let mut text = format!(
        "; the server this one streamed from had flushed its WAL at least up to {} (seen about {before:.0} s before \
the promotion was noted)",
        lsn_text(end)
    );
    if end > switch {
        let _ = write!(
            text,
            ": at least {} bytes of WAL flushed there past the switch point never reached this server, and every \
commit in them is lost, durable ones too",
            end - switch
        );
    }
    text
}

/// What the WAL at the switch point says, when the old timeline ends there
/// with a shutdown checkpoint: maybe the old primary's clean shutdown (a
/// switchover), maybe the end of its crash recovery (the same record).
/// Only the old primary's record, saved at its start as a standby and
/// stamped with that checkpoint, tells them apart.
fn shutdown_checkpoint_detail(old_tli: u32, switch: u64) -> (String, Option<(u64, i64)>) {
    match crate::timeline::shutdown_checkpoint_ending_at(switch) {
        Ok(Some((start, time))) => (
            format!(
                "; timeline {old_tli} ends here with a shutdown checkpoint (at {}): if it is the old primary's clean \
shutdown (a switchover), nothing was lost, and the old primary shows it when it rejoins as a standby (its record, saved \
then in crash_record_directory, is delivered here); if it ended a crash recovery, commits acknowledged after it are lost",
                lsn_text(start)
            ),
            Some((start, time)),
        ),
        Ok(None) => (String::new(), None),
        Err(why) => {
            pgrx::log!(
                "delayed_durability: could not read the WAL at the switch point {} of timeline {old_tli}: {why}",
                lsn_text(switch)
            );
            (String::new(), None)
        }
    }
}

/// In the report worker, once recovery finished: a timeline newer than
/// the last one this server ran on is a promotion, recorded as a failover.
pub fn note_timeline() -> std::io::Result<()> {
    let heard = HEARD.0.get();
    let current = crate::timeline::current();
    let _lock = lock()?;
    let mut failovers = read_failovers().unwrap_or_else(|e| {
        report::set_aside_unreadable(FAILOVER_FILE, &e);
        // The timeline it last ran on is lost with it: a promotion this
        // start follows is recorded (once more, maybe), never missed.
        let parent = crate::timeline::read(current).ok().and_then(|h| h.ancestors.iter().map(|&(t, _)| t).max());
        Failovers { timeline: parent, ..Failovers::default() }
    });
    if failovers.timeline == Some(current) {
        return Ok(());
    }
    if let Some(last) = failovers.timeline.filter(|&l| l < current) {
        let history = crate::timeline::read(current).map_err(std::io::Error::other)?;
        let now = crate::stats::now();
        // Each timeline left since, oldest first (a chain of promotions
        // while this server was down is several failovers).
        let mut left: Vec<(u32, u64)> = history.ancestors.iter().copied().filter(|(t, _)| *t >= last).collect();
        left.sort();
        for (i, (old_tli, switch)) in left.iter().enumerate() {
            let new_tli = left.get(i + 1).map_or(current, |(t, _)| *t);
            let id = failovers.events.iter().map(|e| e.id + 1).max().unwrap_or(0).max(now + i as i64);
            let heard_past_switch = heard.is_some_and(|(end, tli, _)| tli == *old_tli && end > *switch);
            let mut detail = match heard {
                Some((end, tli, heard_at)) if tli == *old_tli => {
                    not_imported(*old_tli, new_tli, *switch) + &heard_detail(end, heard_at, now, *switch)
                }
                _ => not_imported(*old_tli, new_tli, *switch),
            };
            // Not when the old primary was heard to have flushed WAL past
            // it: it ran on after that checkpoint.
            if !heard_past_switch {
                let (text, checkpoint) = shutdown_checkpoint_detail(*old_tli, *switch);
                detail += &text;
                if let Some((start, time)) = checkpoint {
                    failovers.shutdown_checkpoints.push((id, start, time));
                }
            }
            failovers.events.push(Failover { id, at: now, old_tli: *old_tli, new_tli, switch: *switch, lost: None, detail });
            pgrx::log!(
                "delayed_durability: failover: timeline {old_tli} was left at {} for timeline {new_tli}; delayed commits the old primary acknowledged past that point are lost (its record, delivered by it when it rejoins or imported with delayed_durability_import_failover_record(), lists them)",
                lsn_text(*switch)
            );
        }
    }
    attach_own_records(&mut failovers);
    // The events and the timeline they bring this server to, in one write:
    // a crash in between cannot record a failover twice.
    failovers.timeline = Some(current);
    write_failovers(&failovers)
}

/// At a promotion: a failover still waiting for the record of the old
/// primary that was this server (the row came with pg_rewind or a base
/// backup from the server promoted then, before this one delivered its
/// record there) gets it from this server's own saved record of that
/// timeline, as the other server did: both list the same commits.
fn attach_own_records(failovers: &mut Failovers) {
    // SAFETY: reads the control data PostgreSQL keeps in shared memory.
    let system_id = unsafe { pg_sys::GetSystemIdentifier() };
    let waiting: Vec<u32> = failovers.events.iter().filter(|e| e.lost.is_none()).map(|e| e.old_tli).collect();
    for old_tli in waiting {
        let Some(path) = super::saved_record::own_record_of(system_id, old_tli) else { continue };
        let source = format!("this server's own saved record \"{}\"", path.display());
        let attached = std::fs::read(&path)
            .map_err(|e| Refusal::new(PgSqlErrorCode::ERRCODE_IO_ERROR, format!("could not read {source}: {e}"), "").into())
            .and_then(|bytes| {
                let (_memory, ring) = ring_in_memory(&bytes, &source)?;
                attach(failovers, &ring, &fingerprint(&bytes), &source, Some(old_tli as i32))
            });
        match attached {
            Ok(lost) => pgrx::log!(
                "delayed_durability: {lost} acknowledged delayed commits lost in the failover from timeline {old_tli} listed from {source}"
            ),
            Err(Attached::Already { .. }) => {}
            Err(Attached::Refused(r)) => pgrx::log!(
                "delayed_durability: the failover from timeline {old_tli} still waits for its old primary's record: {}",
                r.message
            ),
        }
    }
}

fn error(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    pg_sys::panic::ErrorReport::new(code, message, "").set_hint(hint).report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// A record file read into memory aligned for its atomics, as a ring, with
/// the fingerprint of its bytes.
fn load_record(path: &str) -> (Vec<u8>, Ring, String) {
    // At most a record of the largest lost_commits_ring_size.
    let largest = ring::file_len(ring::MAX_CAPACITY) as u64;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() || m.len() > largest => error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("\"{path}\" is not a record of acknowledged commits (not a file of at most {largest} bytes)"),
            "",
        ),
        _ => {}
    }
    if let (Ok(given), Ok(own)) = (std::fs::canonicalize(path), std::fs::canonicalize(super::report::ring_path())) {
        if given == own {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("\"{path}\" is this server's own record of acknowledged commits"),
                "Give a copy of the old primary's record.",
            );
        }
    }
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        error(PgSqlErrorCode::ERRCODE_UNDEFINED_FILE, format!("could not read \"{path}\": {e}"), "")
    });
    let (memory, ring) = ring_from_bytes(&bytes, &format!("\"{path}\""));
    (memory, ring, fingerprint(&bytes))
}

/// A record's bytes copied into memory aligned for its atomics, as a ring;
/// `source` names it in errors.
fn ring_from_bytes(bytes: &[u8], source: &str) -> (Vec<u8>, Ring) {
    ring_in_memory(bytes, source).unwrap_or_else(|r| r.raise())
}

fn ring_in_memory(bytes: &[u8], source: &str) -> Result<(Vec<u8>, Ring), Refusal> {
    let largest = ring::file_len(ring::MAX_CAPACITY);
    if bytes.len() > largest {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{source} is not a record of acknowledged commits (more than {largest} bytes)"),
            "",
        ));
    }
    let mut memory = vec![0u8; bytes.len() + 64];
    let offset = memory.as_ptr().align_offset(64);
    memory[offset..offset + bytes.len()].copy_from_slice(bytes);
    // SAFETY: the vector outlives the ring (both are returned together).
    let map = Mapping { addr: unsafe { memory.as_mut_ptr().add(offset) }, len: bytes.len(), is_pmem: false };
    let ring = Ring::new(map).map_err(|why| {
        Refusal::new(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{source} {why}"),
            "Give the old primary's delayed_durability/commits (or the .commits file next to its persistent WAL buffer), copied whole while it was down.",
        )
    })?;
    Ok((memory, ring))
}

/// Why a record is not taken: raised as an ERROR in SQL, logged by the
/// report worker.
struct Refusal {
    code: PgSqlErrorCode,
    message: String,
    hint: &'static str,
}

impl Refusal {
    fn new(code: PgSqlErrorCode, message: String, hint: &'static str) -> Refusal {
        Refusal { code, message, hint }
    }

    fn raise(self) -> ! {
        error(self.code, self.message, self.hint)
    }
}

/// The old primary's record is read on the promoted server only.
fn refuse_in_recovery() {
    if crate::flush::in_recovery() {
        error(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "recovery is in progress".into(),
            "Give the old primary's record to the server that was promoted.",
        );
    }
}

/// Lists the delayed commits the old primary acknowledged past the switch
/// point of the last failover not yet imported, from its record file: the
/// failover's row becomes exact. Superuser only. Returns how many were lost.
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_import_failover_record(path: &str, old_timeline: default!(Option<i32>, "NULL")) -> i64 {
    crate::preload::require_preloaded();
    // SAFETY: reads the current user's superuser flag.
    if !unsafe { pg_sys::superuser() } {
        error(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "permission denied to import a record of acknowledged commits".into(),
            "Only superusers can import one.",
        );
    }
    refuse_in_recovery();
    let (_memory, ring, fp) = load_record(path);
    import(&ring, &fp, &format!("\"{path}\""), old_timeline, false)
}

/// The same as the import, from the record's bytes: what a rejoined old
/// primary delivers by itself (delivery.rs), naming the timeline it
/// crashed on. EXECUTE is revoked from PUBLIC: a superuser grants it to
/// the role the delivery connects as, which is trusted to write the
/// failover report. The same record delivered again (its sender could not
/// hear the answer) is answered with the same count, changing nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_receive_failover_record(
    record: Option<&[u8]>,
    sender: Option<&str>,
    old_timeline: default!(Option<i32>, "NULL"),
) -> i64 {
    crate::preload::require_preloaded();
    let (Some(record), Some(sender)) = (record, sender) else {
        error(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "the record and its sender must not be null".into(), "")
    };
    refuse_in_recovery();
    let sender: String = sender.chars().filter(|c| !c.is_control()).take(200).collect();
    // SAFETY: the name of the session's user, looked up in the catalog
    // (an ERROR if it is gone, as for any statement).
    let user = unsafe { std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetSessionUserId(), false)) };
    let source = format!("the record delivered by {sender} as {}", user.to_string_lossy());
    let (_memory, ring) = ring_from_bytes(record, &source);
    import(&ring, &fingerprint(record), &source, old_timeline, true)
}

/// Lists, as lost in the last failover waiting for it (or the one from
/// `old_timeline`), the commits of `ring` past its switch point. A record
/// already imported (same fingerprint) is refused, or when `again_ok`,
/// answered with the count it gave.
fn import(ring: &Ring, fp: &str, source: &str, old_timeline: Option<i32>, again_ok: bool) -> i64 {
    // Before the lock and the history: a record of another system is
    // refused whatever this server's files say (attach() checks it again).
    refuse_other_system(ring, source).unwrap_or_else(|r| r.raise());
    let _lock = lock().unwrap_or_else(|e| {
        error(PgSqlErrorCode::ERRCODE_IO_ERROR, format!("could not lock \"{FAILOVER_FILE}.lock\": {e}"), "")
    });
    let mut failovers = failovers_to_show();
    let lost = match attach(&mut failovers, ring, fp, source, old_timeline) {
        Ok(lost) => lost,
        Err(Attached::Already { lost, .. }) if again_ok => return lost,
        Err(Attached::Already { old_tli, .. }) => error(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("no failover on this server waits for {source}: it was imported for the failover from timeline {old_tli}"),
            "SELECT * FROM delayed_durability_failovers shows the failovers recorded here.",
        ),
        Err(Attached::Refused(r)) => r.raise(),
    };
    write_failovers(&failovers).unwrap_or_else(|e| {
        error(PgSqlErrorCode::ERRCODE_IO_ERROR, format!("could not write \"{FAILOVER_FILE}\": {e}"), "")
    });
    pgrx::log!("delayed_durability: {lost} acknowledged delayed commits lost in the failover listed from {source}");
    lost
}

fn refuse_other_system(ring: &Ring, source: &str) -> Result<(), Refusal> {
    // SAFETY: reads the control data PostgreSQL keeps in shared memory.
    let system_id = unsafe { pg_sys::GetSystemIdentifier() };
    if ring.system_id() != system_id {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{source} is the record of another database system ({}; this one is {system_id})", ring.system_id()),
            "Give the record of this server's old primary.",
        ));
    }
    Ok(())
}

enum Attached {
    /// This record was imported before, for the failover from `old_tli`,
    /// listing `lost`.
    Already { old_tli: u32, lost: i64 },
    Refused(Refusal),
}

impl From<Refusal> for Attached {
    fn from(r: Refusal) -> Attached {
        Attached::Refused(r)
    }
}

/// The import itself, in memory: the failover waiting for the record (the
/// last one, or the one from `old_timeline`) gets its list and becomes
/// exact, unless the record is refused.
fn attach(failovers: &mut Failovers, ring: &Ring, fp: &str, source: &str, old_timeline: Option<i32>) -> Result<i64, Attached> {
    refuse_other_system(ring, source)?;
    if let Some((id, _)) = failovers.records.iter().find(|(_, f)| f == fp) {
        let event = failovers.events.iter().find(|e| e.id == *id);
        let (old_tli, lost) = event.map_or((0, 0), |e| (e.old_tli, e.lost.unwrap_or(0)));
        return Err(Attached::Already { old_tli, lost });
    }
    let waiting = failovers.events.iter().filter(|e| e.lost.is_none()).count();
    if old_timeline.is_none() && waiting > 1 {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{waiting} failovers on this server wait for their old primary's record: name the old timeline"),
            "Call delayed_durability_import_failover_record(path, old_timeline) with the timeline the old primary was on.",
        )
        .into());
    }
    let Some(event) = failovers
        .events
        .iter_mut()
        .rev()
        .find(|e| e.lost.is_none() && old_timeline.is_none_or(|t| t as u32 == e.old_tli))
    else {
        return Err(Refusal::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "no failover on this server waits for its old primary's record".into(),
            "SELECT * FROM delayed_durability_failovers shows the failovers recorded here.",
        )
        .into());
    };
    let snapshot = ring.snapshot();
    // Saved at the old primary's start as a standby after its clean
    // shutdown, and stamped with that shutdown checkpoint: when it is the
    // very record the old timeline ends with here (position and time, read
    // at the promotion), the run the record holds ended at the switch
    // point, after its WAL senders had sent everything, and no run of that
    // server came after it (that start would have stamped another
    // checkpoint, or none after a crash). Nothing was lost.
    let id = event.id;
    let ended_here = failovers.shutdown_checkpoints.iter().find(|(i, ..)| *i == id).map(|&(_, start, time)| (start, time));
    let clean_end = snapshot.ended_at != (0, 0)
        && ended_here == Some(snapshot.ended_at)
        && snapshot.entries.iter().all(|a| a.commit_end <= event.switch)
        && (snapshot.summary.count == 0 || snapshot.summary.max_end <= event.switch);
    let newest = snapshot.entries.iter().map(|a| a.commit_end).max();
    match newest {
        _ if clean_end => {}
        // Its last entries may be gone with the machine's page cache, or
        // cut with the file's end: none left, or none past the switch
        // point, is no proof of an older record. Taken, not exact.
        _ if snapshot.lost_at_restart || snapshot.salvaged => {}
        None => {
            return Err(Refusal::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{source} holds no acknowledged commit"),
                "The old primary's record is formatted anew at each of its starts: take the file it had when it failed.",
            )
            .into())
        }
        Some(newest) if newest <= event.switch && snapshot.summary.max_end <= event.switch => {
            return Err(Refusal::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "every acknowledged commit in {source} ends before the switch point {}: the record is older than the failover",
                    lsn_text(event.switch)
                ),
                "Take the record the old primary had when it failed; if it acknowledged no delayed commit past the switch point, nothing was lost.",
            )
            .into())
        }
        _ => {}
    }
    let (lapped, min_end) = (snapshot.lapped, snapshot.entries_min_end());
    let (lost_at_restart, salvaged) = (snapshot.lost_at_restart, snapshot.salvaged);
    let mut lost: Vec<Acked> = snapshot.entries.into_iter().filter(|a| a.commit_end > event.switch).collect();
    lost.sort_by_key(|a| a.commit_end);
    let summarized = if snapshot.summary.count > 0 && snapshot.summary.max_end > event.switch { snapshot.summary.count } else { 0 };
    // A ring that went round may have dropped flushed acknowledgements that
    // ended past the switch point: unless its oldest entry is before it.
    let overwritten = lapped && min_end > event.switch;
    // The record holds one run of the old primary: one that began past the
    // switch point (a restart of the old primary after the standby stopped
    // receiving) may not list what its earlier runs acknowledged past it.
    let covers_from = snapshot.covers_from;
    let earlier_runs_uncovered = covers_from == 0 || covers_from > event.switch;
    let exact = clean_end
        || (!snapshot.incomplete && !snapshot.torn && summarized == 0 && !overwritten && !earlier_runs_uncovered);
    event.lost = Some(lost.len() as i64);
    event.detail = if clean_end {
        format!(
            "exact: the old primary shut down cleanly at {}, with the checkpoint timeline {} ends with here: the run \
that ended there acknowledged no commit past the switch point, and no run came after it (shown by its record, saved at \
its start as a standby after that shutdown: {source}; commits lost in an earlier crash of it are in that crash's \
report)",
            lsn_text(snapshot.ended_at.0),
            event.old_tli
        )
    } else if exact {
        format!("exact: {} acknowledged delayed commits of the old primary were past the switch point (imported from {source})", lost.len())
    } else {
        format!(
            "{} listed; not exact: the old primary's record {} (imported from {source})",
            lost.len(),
            if lost_at_restart {
                "did not survive the restart of its machine (it is not on persistent memory): its last entries may be gone, \
the ones listed are certainly lost"
                    .into()
            } else if summarized > 0 {
                format!("summarized up to {summarized} more")
            } else if salvaged {
                "was truncated: its whole entries were compared".into()
            } else if overwritten {
                "went round: older acknowledgements past the switch point may be missing".into()
            } else if snapshot.torn {
                "was torn: an entry being written when the old primary died may be missing".into()
            } else if covers_from == 0 {
                "does not say where the run it covers began (the old primary failed before its first entry set it, or an \
earlier version wrote it): acknowledgements of its earlier runs past the switch point may be missing"
                    .into()
            } else if earlier_runs_uncovered {
                format!(
                    "covers its last run only, which began at {}, past the switch point (it restarted after this server \
stopped receiving): acknowledgements of its earlier runs past the switch point are not in it",
                    lsn_text(covers_from)
                )
            } else {
                "was incomplete".into()
            }
        )
    };
    failovers.lost.retain(|(i, _)| *i != id);
    failovers.lost.extend(lost.iter().map(|a| (id, *a)));
    failovers.records.retain(|(i, _)| *i != id);
    failovers.records.push((id, fp.to_string()));
    Ok(lost.len() as i64)
}

#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_failover_rows() -> TableIterator<
    'static,
    (
        name!(failover_at, Option<TimestampWithTimeZone>),
        name!(old_timeline, i64),
        name!(new_timeline, i64),
        name!(switch_end, i64),
        name!(lost_commits, Option<i64>),
        name!(exact, bool),
        name!(detail, String),
    ),
> {
    crate::preload::require_preloaded();
    report::require_view_privilege("delayed_durability_failovers");
    let rows: Vec<_> = failovers_to_show()
        .events
        .into_iter()
        .map(|e| {
            let exact = e.detail.starts_with("exact");
            (report::timestamp(e.at), e.old_tli as i64, e.new_tli as i64, e.switch as i64, e.lost, exact, e.detail)
        })
        .collect();
    TableIterator::new(rows)
}

#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_failover_lost_rows() -> TableIterator<
    'static,
    (
        name!(xid, i64),
        name!(datid, pg_sys::Oid),
        name!(commit_end, i64),
        name!(acknowledged_at, Option<TimestampWithTimeZone>),
        name!(failover_at, Option<TimestampWithTimeZone>),
    ),
> {
    crate::preload::require_preloaded();
    report::require_view_privilege("delayed_durability_lost_commits");
    let f = failovers_to_show();
    let rows: Vec<_> = f
        .lost
        .iter()
        .map(|(id, a)| {
            let at = f.events.iter().find(|e| e.id == *id).map(|e| e.at);
            (a.fxid as i64, pg_sys::Oid::from(a.datid), a.commit_end as i64, report::timestamp(a.ack_time), at.and_then(report::timestamp))
        })
        .collect();
    TableIterator::new(rows)
}

/// What a promotion of a standby that has flushed WAL up to `lsn` would
/// lose now: the acknowledged delayed commits past it in this primary's
/// record, the WAL past it, and when the oldest of those commits was
/// acknowledged.
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_exposure(
    lsn: i64,
) -> TableIterator<
    'static,
    (
        name!(commits, Option<i64>),
        name!(wal_bytes, i64),
        name!(oldest_acknowledged_at, Option<TimestampWithTimeZone>),
    ),
> {
    crate::preload::require_preloaded();
    report::require_view_privilege("delayed_durability_standby_exposure");
    let lsn = lsn as u64;
    let bytes = crate::flush::insert_end().saturating_sub(lsn) as i64;
    // A delayed commit acknowledged without being recorded (a database with
    // the record off) makes the count unknown, not smaller.
    let Some(ring) = super::ring().filter(|r| !r.is_incomplete()) else { return TableIterator::once((None, bytes, None)) };
    let (count, oldest) = ring.acknowledged_after(lsn);
    TableIterator::once((Some(count as i64), bytes, oldest.and_then(report::timestamp)))
}

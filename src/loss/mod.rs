//! Bounded and known loss: the loss budget checked at every delayed commit,
//! the record of acknowledged delayed commits (`ring`), and the report of
//! the ones a crash lost (`report`).
//!
//! A commit the policy delayed reaches `acknowledge()` after its commit
//! record is written and before its client hears of it. It returns without
//! waiting only if the WAL not yet flushed, up to its own commit record, is
//! within `max_loss_bytes`, and the oldest acknowledged commit not yet
//! flushed is younger than `max_loss_time`; otherwise it flushes at least up
//! to its own commit record (everything inserted so far). Since the flush
//! position only moves forward, every commit a crash can lose then lies within `max_loss_bytes` of WAL after
//! the flushed position, and all of them were acknowledged within one
//! `max_loss_time` window.

mod delivery;
mod failover;
mod report;
mod ring;
mod saved_record;
mod standby_budget;

use crate::flush::flush_end;
use crate::stats::now;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use ring::Ring;
use std::cell::Cell;

/// In bytes; 0 = no byte budget.
pub static MAX_LOSS_BYTES: GucSetting<i32> = GucSetting::<i32>::new(0);
/// In milliseconds; 0 = no time budget.
pub static MAX_LOSS_TIME: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static TRACK_LOST_COMMITS: GucSetting<bool> = GucSetting::<bool>::new(true);
/// Entries of the ring.
pub static LOST_COMMITS_RING_SIZE: GucSetting<i32> = GucSetting::<i32>::new(16384);

pub fn define_gucs() {
    use crate::settings;
    standby_budget::define_guc();
    saved_record::define_guc();
    delivery::define_guc();
    // SAFETY: the assign hooks raise nothing (they store an integer).
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"delayed_durability.max_loss_bytes",
            c"Most WAL a crash may lose from acknowledged delayed commits; 0 = no byte budget.",
            c"A delayed commit that would leave more WAL than this unflushed, counting its own \
commit record, flushes up to its commit record before it returns.",
            &MAX_LOSS_BYTES,
            0,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_BYTE,
            None,
            Some(settings::assign_max_loss_bytes),
            None,
        );
        GucRegistry::define_int_guc_with_hooks(
            c"delayed_durability.max_loss_time",
            c"Oldest age of an acknowledged delayed commit whose WAL is not flushed; 0 = no time budget.",
            c"A delayed commit made when the oldest unflushed acknowledged commit is this old flushes \
up to its own commit record before it returns.",
            &MAX_LOSS_TIME,
            0,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_MS,
            None,
            Some(settings::assign_max_loss_time),
            None,
        );
        GucRegistry::define_bool_guc_with_hooks(
            c"delayed_durability.track_lost_commits",
            c"Records acknowledged delayed commits so that a crash can report which ones it lost.",
            c"Off: the crash report says it cannot know.",
            &TRACK_LOST_COMMITS,
            GucContext::Sighup,
            GucFlags::default(),
            None,
            Some(settings::assign_track_lost_commits),
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"delayed_durability.lost_commits_ring_size",
        c"Acknowledged delayed commits the crash record holds before it summarizes the oldest.",
        c"64 bytes each, in a file under the data directory. Choose at least the delayed commits \
of a few wal_writer_delay periods at peak.",
        &LOST_COMMITS_RING_SIZE,
        64,
        ring::MAX_CAPACITY as i32,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

struct Global {
    ring: Cell<Option<Ring>>,
}
// SAFETY: set in the postmaster before forking; each process has one thread.
unsafe impl Sync for Global {}
static GLOBAL: Global = Global { ring: Cell::new(None) };

fn ring() -> Option<Ring> {
    GLOBAL.ring.get()
}

/// Shared-memory startup, in every process that attaches. The ring is a
/// file mapping the postmaster makes and its children inherit.
pub fn attach_shared_memory() {
    standby_budget::attach_shared_memory();
    // The postmaster, or a single-user backend (its crash recovery is a
    // crash to report too).
    // SAFETY: reading a process-wide flag set at process start.
    let in_postmaster_or_standalone = unsafe { !pg_sys::IsUnderPostmaster };
    if in_postmaster_or_standalone {
        GLOBAL.ring.set(report::open_ring_after_startup_or_crash(ring()));
    }
}

/// The ring is a file mapping, not PostgreSQL shared memory; the standby
/// budget's counters are.
pub fn request_shared_memory() {
    standby_budget::request_shared_memory();
}

pub fn register_worker() {
    report::register_worker();
}

/// For a commit the policy delayed, after its commit record was written
/// and before the client hears of it: applies the loss budget and records
/// the acknowledgement. Returns true when the budget made it flush.
/// Raises nothing but an XLogFlush I/O failure (a PANIC there, as in
/// RecordTransactionCommit).
pub fn acknowledge(commit_end: u64) -> bool {
    let flushed = keep_local_budget(commit_end);
    // Then against the standby, if one is named: its wait needs the WAL
    // flushed here first, which the local budget may already have done.
    let waited = keep_standby_budget(commit_end);
    flushed || waited
}

/// The byte and time budgets against the standby of budget_standby_slot.
fn keep_standby_budget(commit_end: u64) -> bool {
    let max_bytes = crate::guc::read(&MAX_LOSS_BYTES) as u64;
    let max_time_us = crate::guc::read(&MAX_LOSS_TIME) as i64 * 1000;
    // Whether the oldest acknowledged commit the standby has not confirmed
    // is max_loss_time old. Without a record of acknowledgements the age is
    // unknown: only a wait keeps the budget.
    let over_time = |confirmed: u64, place: &mut ring::ScanPlace| -> bool {
        let Some(r) = ring() else { return true };
        let now = now();
        r.oldest_past(confirmed, now, place).is_some_and(|t| now.saturating_sub(t) >= max_time_us)
    };
    standby_budget::keep(commit_end, max_bytes, (max_time_us > 0).then_some(&over_time as &dyn Fn(u64, &mut ring::ScanPlace) -> bool))
}

/// The budget against this server's own flush position, and the record.
fn keep_local_budget(commit_end: u64) -> bool {
    let max_bytes = crate::guc::read(&MAX_LOSS_BYTES) as u64;
    let max_time_us = crate::guc::read(&MAX_LOSS_TIME) as i64 * 1000;
    // The ring this acknowledgement goes into: the time budget needs it even
    // when the record for the crash report is off.
    let record = ring().filter(|_| crate::guc::read(&TRACK_LOST_COMMITS) || max_time_us > 0);
    if record.is_none() {
        if let Some(r) = ring() {
            r.mark_incomplete();
        }
    }
    if max_bytes == 0 && max_time_us == 0 {
        // No budget: no need to read the flush position.
        if let Some(r) = record {
            record_in(r, commit_end, false);
        }
        return false;
    }
    let flushed = flush_end();
    if commit_end <= flushed {
        // Someone flushed it already: nothing for a crash here to lose. It
        // is recorded all the same: a failover can still lose it.
        if let Some(r) = record {
            record_in(r, commit_end, false);
        }
        return false;
    }
    if max_bytes > 0 && commit_end - flushed > max_bytes {
        if let Some(r) = record {
            record_in(r, commit_end, false);
        }
        return flush_for_budget(commit_end);
    }
    // Recorded before the time check, so that two commits in flight see
    // each other: a later one finds this entry (or its claim, counted as
    // acknowledged now) and stops there.
    let recorded_at = record.map(|r| (r, record_in(r, commit_end, max_time_us > 0)));
    if max_time_us > 0 {
        let over_time = match recorded_at {
            Some((r, t)) => r.oldest_unflushed(flushed, t).is_some_and(|oldest| t - oldest >= max_time_us),
            // No record of acknowledgements (the ring could not be opened):
            // the age is unknown, so the budget can only be kept by flushing.
            None => true,
        };
        if over_time {
            return flush_for_budget(commit_end);
        }
    }
    false
}

/// For a commit the policy delayed that another process flushed before it
/// returned: nothing for a crash here to lose, but a standby may not have
/// it yet, so the record of acknowledgements keeps it for a failover, and
/// the budget against a standby applies. Returns true when it waited.
pub fn record_flushed_acknowledgement(commit_end: u64) -> bool {
    // The time budget against a standby needs it as the local one does.
    let time_budget = crate::guc::read(&MAX_LOSS_TIME) > 0;
    match ring() {
        Some(r) if crate::guc::read(&TRACK_LOST_COMMITS) || time_budget => {
            record_in(r, commit_end, time_budget);
        }
        // A failover's list from this record would miss it.
        Some(r) => r.mark_incomplete(),
        None => {}
    }
    keep_standby_budget(commit_end)
}

/// Records this transaction's acknowledgement; returns its time. Under a
/// time budget that is the clock read after the entry is claimed, so that
/// claim order is time order and the budget counts up to the moment the
/// client hears of the commit (the commit record's timestamp is taken
/// before its WAL insert, which can wait). Without one, the time is only
/// reported after a crash, and the commit record's timestamp, microseconds
/// earlier, saves a clock read per delayed commit.
fn record_in(r: Ring, commit_end: u64, time_budget: bool) -> i64 {
    // SAFETY: backend-local transaction state, valid until the end of the
    // commit callbacks; MyDatabaseId is set once connected.
    let (fxid, datid) = unsafe { (crate::nothrow::GetTopFullTransactionIdIfAny().value, pg_sys::MyDatabaseId.to_u32()) };
    // Where the WAL recovered from earlier runs ended (0 after a start
    // without recovery, whose position the format took from pg_control).
    // SAFETY: reads shared recovery state under its spinlock; raises nothing.
    r.note_covers_from(|| unsafe { pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut()) });
    if time_budget {
        return r.record(commit_end, fxid, datid, now, flush_end);
    }
    // SAFETY: called at XACT_EVENT_COMMIT, after RecordTransactionCommit.
    let commit_time = || unsafe { crate::nothrow::GetCurrentTransactionStopTimestamp() };
    r.record(commit_end, fxid, datid, commit_time, flush_end)
}

/// FNV-1a: a cheap, stable 64-bit hash (record fingerprints, names).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

fn flush_for_budget(commit_end: u64) -> bool {
    let target = crate::flush::insert_end().max(commit_end);
    // SAFETY: target was inserted (insert_end waits for nothing beyond
    // what is reserved; XLogFlush waits for insertions in progress up to it).
    unsafe { pg_sys::XLogFlush(target) };
    true
}

/// How long ago the oldest acknowledged delayed commit whose WAL is not yet
/// flushed was acknowledged; NULL when there is none, or when it cannot be
/// known: a delayed commit was acknowledged without being recorded since
/// the start (a database with track_lost_commits and max_loss_time off).
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_oldest_unflushed_commit_age() -> Option<Interval> {
    crate::preload::require_preloaded();
    if crate::flush::in_recovery() {
        return None;
    }
    let now = now();
    let ring = ring().filter(|r| !r.is_incomplete())?;
    let oldest = ring.oldest_unflushed(flush_end(), now)?;
    Some(Interval::from_micros((now - oldest).max(0)))
}

/// Whether a crash since `at` lost the commit of `fxid` ending at `end`
/// (for receipts): Some((lost, why)), None when no crash since touched it.
pub fn lost_since(fxid: u64, end: u64, at: i64) -> Option<(bool, String)> {
    report::lost_since(fxid, end, at)
}

/// The background worker: started when recovery finishes (at every start,
/// and after every crash restart), or on a hot standby once it is
/// consistent. On a standby it follows the timeline it receives, so that a
/// later promotion is recorded against the last timeline it followed, not
/// again for each switch it followed (those are recorded by the server
/// promoted then). Once recovery finished: compares the pending crash with
/// the recovered WAL, notes a promotion as a failover, then sleeps until
/// shutdown, so that the postmaster starts it again after a crash.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn delayed_durability_report_main(_arg: pg_sys::Datum) {
    use pgrx::bgworkers::BackgroundWorker;
    use pgrx::bgworkers::SignalWakeFlags;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let mut warned = false;
    while crate::flush::in_recovery() {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the worker's main loop, outside any transaction, as
            // PostgreSQL's own processes reload their configuration.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        failover::sample_upstream();
        delivery::tick();
        if delivery::stopping() {
            return;
        }
        if let Err(e) = failover::follow_timeline() {
            if !std::mem::replace(&mut warned, true) {
                pgrx::warning!("delayed_durability: could not note the timeline this standby follows: {e}");
            }
        }
        if !BackgroundWorker::wait_latch(Some(std::time::Duration::from_secs(1))) {
            return;
        }
    }
    if let Err(e) = report::compare_pending() {
        pgrx::warning!("delayed_durability: could not compare the record of acknowledged delayed commits: {e}");
    }
    // SAFETY: reads the control data PostgreSQL keeps in shared memory.
    saved_record::retire_undelivered(unsafe { pg_sys::GetSystemIdentifier() }, crate::timeline::current());
    if let Err(e) = failover::note_timeline() {
        pgrx::warning!("delayed_durability: could not record the failover: {e}");
    }
    // Stay until shutdown: a worker that exits is not started again after a
    // crash restart, and the next crash needs it.
    while BackgroundWorker::wait_latch(None) {}
}

/// Forgets every reported crash and failover, with their lost commits.
/// Superuser-only by default (the extension script revokes EXECUTE from
/// PUBLIC).
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_lost_commits_reset() {
    crate::preload::require_preloaded();
    // A standby's worker writes the same files (the timeline it follows).
    // SAFETY: reads shared recovery state; raises nothing.
    if unsafe { pg_sys::RecoveryInProgress() } {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
            "cannot reset the crash and failover report during recovery",
            "",
        )
        .set_hint("Reset it on the primary.")
        .report(PgLogLevel::ERROR);
    }
    if let Err(e) = report::forget_crashes().and_then(|()| failover::forget()) {
        pg_sys::panic::ErrorReport::new(PgSqlErrorCode::ERRCODE_IO_ERROR, e.to_string(), "").report(PgLogLevel::ERROR);
    }
}

//! Durability receipts: the commit position of this session's last commit,
//! whether a position is durable, and waiting until it is.
//!
//! The pattern: commit delayed, take `last_commit_lsn()`, and tell the
//! outside world only after `wait_durable()` returned true. The waiter, not
//! the transaction, pays for the flush, and every waiter shares the WAL
//! writer's next one.

use crate::flush::{back_off_page_header, flush_end, in_recovery, lsn_text, next_record_start};
use crate::stats::now;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};

struct LastCommit {
    end: Cell<u64>,
    fxid: Cell<u64>,
    /// The commit record's timestamp.
    at: Cell<i64>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for LastCommit {}
static LAST_COMMIT: LastCommit = LastCommit { end: Cell::new(0), fxid: Cell::new(0), at: Cell::new(0) };

/// Called at the end of every commit that wrote a commit record.
pub fn remember_commit(end: u64) {
    if end != 0 {
        LAST_COMMIT.end.set(end);
        // SAFETY: backend-local transaction state, valid until the end of
        // the commit callbacks (the xid of COMMIT PREPARED's own
        // transaction, if any: the receipt names the position first).
        unsafe {
            LAST_COMMIT.fxid.set(crate::nothrow::GetTopFullTransactionIdIfAny().value);
            LAST_COMMIT.at.set(crate::nothrow::GetCurrentTransactionStopTimestamp());
        }
    }
}

fn error(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    pg_sys::panic::ErrorReport::new(code, message, "").set_hint(hint).report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// What is_durable() and wait_durable() accept: a position of this primary's
/// WAL that was inserted already (pg_current_wal_insert_lsn() included).
/// Returns the WAL end it stands for: a position just past a page header
/// means the page boundary.
fn check_position(function: &str, lsn: u64) -> u64 {
    if in_recovery() {
        error(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "recovery is in progress".into(),
            &format!("{function}() answers for the primary's own commits; on a standby, compare with pg_last_wal_replay_lsn()."),
        );
    }
    if lsn == 0 {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("invalid WAL position {}", lsn_text(lsn)),
            "Pass a position returned by last_commit_lsn().",
        );
    }
    let inserted = next_record_start();
    if lsn > inserted {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "WAL position {} is beyond the current insert position {}",
                lsn_text(lsn),
                lsn_text(inserted)
            ),
            "Pass a position returned by last_commit_lsn() or pg_current_wal_insert_lsn() on this server; \
a position taken on another server or before a restore means nothing here.",
        );
    }
    back_off_page_header(lsn)
}

/// The end of the commit record of this session's last committed
/// transaction that wrote one; NULL before the first. pg_lsn is a by-value
/// 64-bit integer, like bigint.
#[pg_extern(sql = r#"
CREATE FUNCTION last_commit_lsn() RETURNS pg_lsn
    VOLATILE PARALLEL RESTRICTED
    LANGUAGE c AS 'MODULE_PATHNAME', 'last_commit_lsn_wrapper';
"#)]
fn last_commit_lsn() -> Option<i64> {
    crate::preload::require_preloaded();
    match LAST_COMMIT.end.get() {
        0 => None,
        end => Some(end as i64),
    }
}

/// Whether WAL is flushed (or persisted in the persistent WAL buffer) at
/// least up to `lsn`.
#[pg_extern(sql = r#"
CREATE FUNCTION is_durable(lsn pg_lsn) RETURNS boolean
    VOLATILE PARALLEL SAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'is_durable_wrapper';
"#)]
fn is_durable(lsn: i64) -> bool {
    crate::preload::require_preloaded();
    flush_end() >= check_position("is_durable", lsn as u64)
}

/// Longest sleep between two looks at the flush position. Nothing wakes a
/// waiter when the WAL writer flushes, so it wakes itself: a few ms is
/// small next to wal_writer_delay and costs nothing measurable.
const MAX_NAP_MS: i64 = 10;

/// Waits until `lsn` is durable (true) or the timeout passed (false). It
/// forces no flush: it tells the WAL writer there is WAL to flush (the call
/// an asynchronous commit makes), so the wait ends within about
/// wal_writer_delay plus one fsync.
#[pg_extern(sql = r#"
CREATE FUNCTION wait_durable(lsn pg_lsn, timeout interval DEFAULT NULL) RETURNS boolean
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'wait_durable_wrapper';
"#)]
fn wait_durable(lsn: Option<i64>, timeout: Option<Interval>) -> Option<bool> {
    crate::preload::require_preloaded();
    let lsn = check_position("wait_durable", lsn? as u64);
    let deadline_us = timeout.map(|t| {
        let us = t.as_micros();
        if us < 0 {
            error(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "timeout must not be negative".into(),
                "Pass NULL to wait without a time limit.",
            );
        }
        now().saturating_add(us.min(i64::MAX as i128) as i64)
    });
    if flush_end() >= lsn {
        return Some(true);
    }
    // SAFETY: the call RecordTransactionCommit makes for an asynchronous
    // commit; it wakes the WAL writer if it hibernates.
    unsafe { pg_sys::XLogSetAsyncXactLSN(lsn) };
    let mut nap_ms = 1;
    loop {
        let mut sleep_ms = nap_ms;
        if let Some(deadline) = deadline_us {
            let left = deadline - now();
            if left <= 0 {
                return Some(false);
            }
            sleep_ms = sleep_ms.min((left + 999) / 1000);
        }
        // SAFETY: the backend's own latch; WL_EXIT_ON_PM_DEATH ends the
        // backend if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                sleep_ms as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        // Query cancel, statement_timeout, pg_terminate_backend, shutdown.
        pg_sys::check_for_interrupts!();
        if flush_end() >= lsn {
            return Some(true);
        }
        nap_ms = (nap_ms * 2).min(MAX_NAP_MS);
    }
}

/// The receipt of this session's last commit as text, unambiguous across
/// crashes, promotions and clusters: database system identifier, timeline,
/// commit record end, full transaction id, commit time (microseconds since
/// 2000-01-01), separated by colons. NULL before the first commit.
#[pg_extern(volatile, parallel_restricted)]
fn last_commit_receipt() -> Option<String> {
    crate::preload::require_preloaded();
    let end = LAST_COMMIT.end.get();
    if end == 0 {
        return None;
    }
    // SAFETY: reads the control data PostgreSQL keeps in shared memory.
    let system_id = unsafe { pg_sys::GetSystemIdentifier() };
    Some(format!(
        "{system_id}:{}:{}:{}:{}",
        crate::timeline::current(),
        lsn_text(end),
        LAST_COMMIT.fxid.get(),
        LAST_COMMIT.at.get()
    ))
}

/// A receipt taken apart.
struct Receipt {
    system_id: u64,
    tli: u32,
    end: u64,
    fxid: u64,
    at: i64,
}

fn parse_receipt(text: &str) -> Receipt {
    let f: Vec<&str> = text.split(':').collect();
    let parsed = (f.len() == 5)
        .then(|| {
            Some(Receipt {
                system_id: f[0].parse().ok()?,
                tli: f[1].parse().ok().filter(|&t| t > 0)?,
                end: crate::timeline::parse_lsn(f[2]).filter(|&l| l > 0)?,
                fxid: f[3].parse().ok()?,
                at: f[4].parse().ok()?,
            })
        })
        .flatten();
    parsed.unwrap_or_else(|| {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
            format!("invalid receipt \"{text}\""),
            "A receipt is what last_commit_receipt() returned: system:timeline:position:xid:time.",
        )
    })
}

/// Where a commit named by its receipt stands on this server: `durable`
/// (in this server's WAL history and flushed), `pending` (on this
/// server's timeline, not flushed yet), `lost` (its timeline was left
/// before its commit record ended, in a failover or a recovery to an
/// earlier point; or a crash since it lost it), `unknown` (this server's
/// history does not contain its timeline, or a crash since it could not be
/// compared), with the reason. Works on a standby and after a promotion.
#[pg_extern(volatile, parallel_restricted)]
fn receipt_status(receipt: &str) -> TableIterator<'static, (name!(status, String), name!(detail, String))> {
    crate::preload::require_preloaded();
    let r = parse_receipt(receipt);
    // SAFETY: as in last_commit_receipt().
    let system_id = unsafe { pg_sys::GetSystemIdentifier() };
    if r.system_id != system_id {
        error(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("receipt of another database system ({}; this one is {system_id})", r.system_id),
            "A receipt means something only in the database system whose server issued it, and its copies.",
        );
    }
    let end = back_off_page_header(r.end);
    let current = crate::timeline::current();
    let history = crate::timeline::read(current)
        .unwrap_or_else(|e| error(PgSqlErrorCode::ERRCODE_IO_ERROR, e, "The timeline history files are in pg_wal."));
    let (status, detail) = match history.end_of(r.tli) {
        Err(()) => (
            "unknown",
            format!("this server (timeline {current}) does not descend from timeline {}", r.tli),
        ),
        Ok(Some(left_at)) if end > left_at => (
            "lost",
            format!(
                "timeline {} was left at {}, before the commit's end at {}: lost in a failover or a recovery to an earlier point",
                r.tli,
                lsn_text(left_at),
                lsn_text(end)
            ),
        ),
        _ => {
            // On this server's history: flushed here, or not yet; and not
            // lost in a crash since.
            let standby = in_recovery();
            let here = if standby { replay_or_received_end() } else { flush_end() };
            // Its crash report covers the receipt only where this server
            // wrote that timeline (a promotion starts a new one).
            let own_timeline = !standby && r.tli == current;
            match crate::loss::lost_since(r.fxid, end, r.at) {
                Some((true, why)) => ("lost", why),
                // The WAL settles what the report could not, when it has the
                // commit's position and can be read.
                Some((false, why)) if here >= end => match commit_record_at(&r, end) {
                    (RECORD_MATCHES, _) => ("durable", format!("its commit record is in this server's WAL ({why})")),
                    (RECORD_OTHER, _) => ("lost", format!("{} ({why})", not_recorded(&r, end))),
                    _ => ("unknown", why),
                },
                Some((false, why)) => ("unknown", why),
                None if here >= end => durable_if_recorded(&r, end, here, standby, own_timeline),
                None => ("pending", format!("this server has flushed up to {} only", lsn_text(here))),
            }
        }
    };
    TableIterator::once((status.to_string(), detail))
}

/// What [`dd_commit_record_at`] found.
const RECORD_MATCHES: c_int = 0;
const RECORD_OTHER: c_int = 1;
const RECORD_NOT_YET: c_int = 2;

extern "C" {
    /// src/c/commit_record.c: whether this server's WAL holds the receipt's
    /// commit record ending at `end`; raises only what is not a read error.
    fn dd_commit_record_at(end: u64, xid: u32, at: i64, message: *mut c_char, message_len: usize) -> c_int;
}

/// Reads this server's WAL at a receipt's position: one of the RECORD_*
/// values, and why it could not be read.
fn commit_record_at(r: &Receipt, end: u64) -> (c_int, String) {
    let mut message = vec![0 as c_char; 512];
    // SAFETY: the buffer is valid for its length and left NUL-terminated;
    // an error the reader raises (not a read error) reaches PostgreSQL
    // through the boundary.
    let found = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            dd_commit_record_at(end, r.fxid as u32, r.at, message.as_mut_ptr(), message.len())
        })
    };
    // SAFETY: NUL-terminated by the function.
    (found, unsafe { CStr::from_ptr(message.as_ptr()) }.to_string_lossy().into_owned())
}

fn not_recorded(r: &Receipt, end: u64) -> String {
    format!(
        "the WAL at {} holds no commit record of transaction {}: the server that issued the receipt lost the commit \
in a crash, and WAL written since passed its position",
        lsn_text(end),
        r.fxid
    )
}

/// A receipt this server's WAL has passed, with no crash report against
/// it: durable when its commit record is there. Another record at its
/// position means the server that issued it lost it in a crash and wrote
/// other WAL there since, which a standby (and a standby promoted since)
/// learns from no crash report. When the record cannot be read, only a
/// primary that wrote the receipt's timeline itself has a crash report
/// that stands for it.
fn durable_if_recorded(r: &Receipt, end: u64, here: u64, standby: bool, own_timeline: bool) -> (&'static str, String) {
    let flushed = format!("flushed on this server up to {}", lsn_text(here));
    match commit_record_at(r, end) {
        (RECORD_MATCHES, _) => ("durable", flushed),
        (RECORD_OTHER, _) => ("lost", not_recorded(r, end)),
        (RECORD_NOT_YET, _) if standby => (
            "pending",
            format!("received up to {}, its commit record is read once replayed", lsn_text(here)),
        ),
        // The reader reads whole records up to the flush position: the one
        // after the commit's (which tells where the commit's begins) is not
        // flushed yet.
        (RECORD_NOT_YET, _) if !own_timeline => (
            "pending",
            format!("{flushed}; its commit record is read once the WAL after it is flushed"),
        ),
        (RECORD_NOT_YET, _) => ("durable", format!("{flushed}, and no crash of this server lost it")),
        (_, message) if own_timeline => {
            ("durable", format!("{flushed}; its commit record cannot be read here ({message}), and no crash of this server lost it"))
        }
        (_, message) => (
            "unknown",
            format!(
                "{flushed}, but its commit record cannot be read here ({message}): without it this server cannot tell a \
commit that the server which issued the receipt lost in a crash"
            ),
        ),
    }
}

/// On a standby: WAL received and flushed here, or at least replayed.
fn replay_or_received_end() -> u64 {
    // SAFETY: read shared recovery and WAL receiver state.
    unsafe {
        let replayed = pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut());
        let received = pg_sys::GetWalRcvFlushRecPtr(std::ptr::null_mut(), std::ptr::null_mut());
        replayed.max(received)
    }
}

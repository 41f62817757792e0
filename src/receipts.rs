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

struct LastCommit(Cell<u64>);
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for LastCommit {}
static LAST_COMMIT_END: LastCommit = LastCommit(Cell::new(0));

/// Called at the end of every commit that wrote a commit record.
pub fn remember_commit(end: u64) {
    if end != 0 {
        LAST_COMMIT_END.0.set(end);
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
    match LAST_COMMIT_END.0.get() {
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

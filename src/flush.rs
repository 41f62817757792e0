//! WAL positions and the explicit log flush (SQL Server's sys.sp_flush_log).

use crate::stats::{self, Counter};
use pgrx::pg_sys;
use pgrx::prelude::*;

const fn maxalign(n: usize) -> u64 {
    ((n + 7) & !7) as u64
}
pub(crate) const SHORT_PAGE_HEADER: u64 = maxalign(std::mem::size_of::<pg_sys::XLogPageHeaderData>());
pub(crate) const LONG_PAGE_HEADER: u64 = maxalign(std::mem::size_of::<pg_sys::XLogLongPageHeaderData>());

/// The end of the WAL inserted so far.
///
/// GetXLogInsertRecPtr() returns where the next record would start, which is
/// past the page header when the last record ended exactly at a page or
/// segment boundary (e.g. right after pg_switch_wal()). Flushing that position
/// asks for bytes nobody wrote ("xlog flush request ... is not satisfied"),
/// so step back to the boundary, as XLogBytePosToEndRecPtr does.
/// A WAL position as PostgreSQL prints it.
pub(crate) fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn as u32)
}

pub(crate) fn insert_end() -> u64 {
    back_off_page_header(next_record_start())
}

/// Where the next record would start, as PostgreSQL reports it (past the
/// page header at a page or segment boundary).
pub(crate) fn next_record_start() -> u64 {
    // SAFETY: reads shared WAL insert state under PostgreSQL's own spinlock.
    unsafe { pg_sys::GetXLogInsertRecPtr() }
}

/// A position in or just past a page (or segment) header means the
/// boundary before it: no WAL record byte lies in between. Such positions
/// come from pg_current_wal_insert_lsn() right after pg_switch_wal(), or
/// from a receipt built by hand.
pub(crate) fn back_off_page_header(pos: u64) -> u64 {
    // SAFETY: wal_segment_size is set at startup and never changes.
    let segment_size = unsafe { pg_sys::wal_segment_size } as u64;
    boundary_before_header(pos, segment_size)
}

fn boundary_before_header(pos: u64, segment_size: u64) -> u64 {
    let in_segment = pos % segment_size;
    let in_page = pos % pg_sys::XLOG_BLCKSZ as u64;
    if in_segment <= LONG_PAGE_HEADER {
        pos - in_segment
    } else if in_page <= SHORT_PAGE_HEADER {
        pos - in_page
    } else {
        pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_in_a_page_header_mean_the_boundary() {
        let seg = 16 << 20;
        let page = pg_sys::XLOG_BLCKSZ as u64;
        // At, inside and just past the long header of a segment's first page.
        for at in [0, 1, 16, LONG_PAGE_HEADER] {
            assert_eq!(boundary_before_header(3 * seg + at, seg), 3 * seg);
        }
        assert_eq!(boundary_before_header(3 * seg + LONG_PAGE_HEADER + 1, seg), 3 * seg + LONG_PAGE_HEADER + 1);
        // A later page's short header.
        for at in [0, 7, SHORT_PAGE_HEADER] {
            assert_eq!(boundary_before_header(3 * seg + 5 * page + at, seg), 3 * seg + 5 * page);
        }
        assert_eq!(boundary_before_header(5 * page + SHORT_PAGE_HEADER + 8, seg), 5 * page + SHORT_PAGE_HEADER + 8);
    }
}

pub(crate) fn flush_end() -> u64 {
    // SAFETY: reads the shared flush position under PostgreSQL's spinlock.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        return crate::nothrow::GetFlushRecPtr();
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        return crate::nothrow::GetFlushRecPtr(std::ptr::null_mut());
    }
}

pub(crate) fn in_recovery() -> bool {
    // SAFETY: reads shared recovery state.
    unsafe { pg_sys::RecoveryInProgress() }
}

fn replay_end() -> u64 {
    // SAFETY: reads shared recovery state.
    unsafe { pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut()) }
}

/// Flushes all WAL inserted so far and returns the flushed position. When it
/// returns, every commit acknowledged before the call, in any session, is on
/// disk. Declared in SQL as returning pg_lsn, which is a by-value 64-bit
/// integer exactly like bigint.
#[pg_extern(sql = r#"
CREATE FUNCTION flush_log() RETURNS pg_lsn
    VOLATILE PARALLEL UNSAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'flush_log_wrapper';
"#)]
fn flush_log() -> i64 {
    crate::preload::require_preloaded();
    if in_recovery() {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "recovery is in progress",
            "",
        )
        .set_hint("flush_log() cannot be executed during recovery: a standby writes WAL as it receives it.")
        .report(PgLogLevel::ERROR);
    }
    // SAFETY: XLogFlush waits for in-progress insertions up to the target
    // and never asks for more than was inserted (see insert_end).
    unsafe { pg_sys::XLogFlush(insert_end()) };
    stats::count(Counter::FlushLogCalls);
    flush_end() as i64
}

/// Raw WAL positions for delayed_durability_status(): the end of inserted
/// WAL and the end of WAL flushed to disk. On a standby both are the replay
/// position: nothing there waits to be flushed by this server's commits.
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_wal_positions() -> TableIterator<'static, (name!(insert_end, i64), name!(flush_end, i64))> {
    crate::preload::require_preloaded();
    let (insert, flush) = if in_recovery() {
        let replayed = replay_end();
        (replayed, replayed)
    } else {
        // Read flush first: WAL is never flushed past what was inserted, so
        // an insert position read afterwards keeps the gap non-negative.
        let flush = flush_end();
        (insert_end(), flush)
    };
    TableIterator::once((insert as i64, flush as i64))
}

/// PostgreSQL's own count of WAL fsyncs, for delayed_durability_status().
/// Up to 17 it is pg_stat_wal.wal_sync; 18 moved WAL I/O to pg_stat_io
/// (object 'wal', context 'normal': the syncs of written WAL, not of new
/// segments, as wal_sync counted). Parallel restricted like the statistics
/// functions it reads.
#[pg_extern(volatile, parallel_restricted)]
fn delayed_durability_wal_fsyncs() -> Option<i64> {
    #[cfg(not(feature = "pg18"))]
    const QUERY: &str = "SELECT wal_sync FROM pg_catalog.pg_stat_wal";
    #[cfg(feature = "pg18")]
    const QUERY: &str =
        "SELECT sum(fsyncs)::bigint FROM pg_catalog.pg_stat_io WHERE object = 'wal' AND context = 'normal'";
    Spi::connect(|client| client.select(QUERY, Some(1), &[])?.first().get_one::<i64>())
        .unwrap_or_else(|e| pgrx::error!("reading WAL statistics: {e}"))
}

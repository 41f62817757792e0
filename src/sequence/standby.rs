//! A new block's recovery value on the synchronous standby before any of its
//! values is handed out (src/c/sync_standby.c): after a promotion the new
//! primary then continues after every value the old one handed out.
//! Without synchronous replication there is nothing to wait for, and a
//! promotion can hand out again values of blocks the standby had not
//! received, as a crash of an asynchronously replicated primary loses
//! commits.

use pgrx::pg_sys;
use pgrx::prelude::*;

unsafe extern "C-unwind" {
    fn dd_sync_standby_confirmed(lsn: u64) -> bool;
    fn dd_sync_standby_wait(lsn: u64) -> bool;
}

/// No synchronous standby is configured, or one has flushed WAL up to `lsn`.
pub fn confirmed(lsn: u64) -> bool {
    // SAFETY: reads shared replication state under SyncRepLock; raises nothing.
    unsafe { dd_sync_standby_confirmed(lsn) }
}

/// Waits as a commit waits for its synchronous standby; a cancel ends the
/// wait with an error (no value of the block has been handed out).
pub fn wait(lsn: u64) {
    // SAFETY: PostgreSQL's own wait, with interrupts held as at commit; a
    // termination request ends the session inside (CHECK_FOR_INTERRUPTS).
    let confirmed = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_sync_standby_wait(lsn)) };
    if !confirmed {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
            "canceling cached_nextval(): the synchronous standby has not confirmed the sequence's new block",
            "",
        )
        .set_detail(
            "No value of the block was handed out. The block's recovery value is flushed locally but may be \
missing on the standby, so a value of it could be handed out again after a failover.",
        )
        .set_hint("Check that the synchronous standby is connected (pg_stat_replication).")
        .report(PgLogLevel::ERROR);
    }
}

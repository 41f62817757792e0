//! PostgreSQL functions that cannot raise an error, declared here without
//! pgrx's error guard: each guarded call costs a sigsetjmp, and these run
//! several times on every commit. Only functions that neither allocate nor
//! raise (a stuck spinlock is a PANIC, which exits instead of unwinding)
//! belong here.

use pgrx::pg_sys;

unsafe extern "C" {
    /// xact.c: the top transaction's xid, InvalidTransactionId if none.
    pub fn GetTopTransactionIdIfAny() -> pg_sys::TransactionId;
    /// xact.c: the same as a FullTransactionId.
    pub fn GetTopFullTransactionIdIfAny() -> pg_sys::FullTransactionId;
    /// timestamp.c: gettimeofday() as a PostgreSQL timestamp.
    pub fn GetCurrentTimestamp() -> pg_sys::TimestampTz;
    /// xlog.c: the flush position, read under XLogCtl's spinlock.
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    pub fn GetFlushRecPtr(insert_tli: *mut pg_sys::TimeLineID) -> pg_sys::XLogRecPtr;
    #[cfg(any(feature = "pg13", feature = "pg14"))]
    pub fn GetFlushRecPtr() -> pg_sys::XLogRecPtr;
}

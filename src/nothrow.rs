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
    /// xact.c: the timestamp of the commit record just written (taken by
    /// RecordTransactionCommit), or GetCurrentTimestamp() when none was.
    pub fn GetCurrentTransactionStopTimestamp() -> pg_sys::TimestampTz;
    /// storage.c: the relation files this transaction's commit (or abort)
    /// deletes. It pallocs the array only when there is one, at commit time
    /// after the commit record (where an out-of-memory error is a PANIC of
    /// the committed transaction anyway) and never otherwise raises.
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
    pub fn smgrGetPendingDeletes(for_commit: bool, ptr: *mut *mut pg_sys::RelFileNode) -> std::ffi::c_int;
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
    pub fn smgrGetPendingDeletes(for_commit: bool, ptr: *mut *mut pg_sys::RelFileLocator) -> std::ffi::c_int;
    /// xlog.c: the flush position, read under XLogCtl's spinlock.
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    pub fn GetFlushRecPtr(insert_tli: *mut pg_sys::TimeLineID) -> pg_sys::XLogRecPtr;
    #[cfg(any(feature = "pg13", feature = "pg14"))]
    pub fn GetFlushRecPtr() -> pg_sys::XLogRecPtr;
}

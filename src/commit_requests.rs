//! What a transaction established for its commit before the commit
//! decision (src/commit.rs) reads it: requests flow one way, from the
//! modules that make them (commit_delayed(), cached_nextval(), table
//! classes, the utility hook) into this module, and commit.rs reads them.
//!
//! Only facts are recorded: a statement is noted once it succeeded (the
//! utility hook's after-part), never before it runs, so a statement that
//! fails and is caught (PL/pgSQL EXCEPTION, psql's ON_ERROR_ROLLBACK, a
//! driver's autosave) leaves nothing behind. Whether a commit was flushed
//! is not recorded here at all: commit.rs reads it from the flush position
//! after the commit record.

use pgrx::pg_sys;
use std::cell::Cell;

struct Requests {
    /// commit_delayed() was called in this top-level transaction.
    delayed: Cell<bool>,
    /// The extension needs this commit durable (a sequence created in the
    /// transaction handed out values, a table class changed). Kept when the
    /// subtransaction that asked aborts: values may have been handed out,
    /// and a durable commit is the safe side.
    durable: Cell<bool>,
    /// Durable, and confirmed by a synchronous standby as a commit at
    /// synchronous_commit = on at least is (cached_nextval() handed out
    /// values of a block whose only standby confirmation is this commit).
    on_standby: Cell<bool>,
    /// A COMMIT PREPARED statement completed in this transaction: the end
    /// of its commit record, read right after the statement.
    commit_prepared_end: Cell<u64>,
    /// A statement whose commit PostgreSQL always flushes completed
    /// (CREATE/DROP DATABASE or TABLESPACE, ALTER DATABASE SET TABLESPACE).
    core_flushes: Cell<bool>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for Requests {}

static REQUESTS: Requests = Requests {
    delayed: Cell::new(false),
    durable: Cell::new(false),
    on_standby: Cell::new(false),
    commit_prepared_end: Cell::new(0),
    core_flushes: Cell::new(false),
};

/// Forgets everything: at the end of every transaction.
pub fn reset() {
    REQUESTS.delayed.set(false);
    REQUESTS.durable.set(false);
    REQUESTS.on_standby.set(false);
    REQUESTS.commit_prepared_end.set(0);
    REQUESTS.core_flushes.set(false);
}

pub fn request_delayed() {
    REQUESTS.delayed.set(true);
}

pub fn delayed_requested() -> bool {
    REQUESTS.delayed.get()
}

/// Makes the commit of the current transaction durable whatever the policy
/// says (counted as forced durable when the policy wanted it delayed).
pub fn require_durable_commit() {
    REQUESTS.durable.set(true);
}

/// Durable, and waiting for a synchronous standby's flush whatever the
/// session's synchronous_commit below `on` (local, remote_write).
pub fn require_commit_on_standby() {
    REQUESTS.durable.set(true);
    REQUESTS.on_standby.set(true);
}

pub fn commit_on_standby_required() -> bool {
    REQUESTS.on_standby.get()
}

pub fn durable_required() -> bool {
    REQUESTS.durable.get()
}

/// The end of the commit record of the prepared transaction this
/// transaction committed, if it ran COMMIT PREPARED successfully.
pub fn commit_prepared_end() -> Option<u64> {
    Some(REQUESTS.commit_prepared_end.get()).filter(|&end| end != 0)
}

/// PostgreSQL flushes this commit whatever synchronous_commit says.
pub fn core_flushes_commit() -> bool {
    REQUESTS.core_flushes.get()
}

/// Called by the utility hook (src/c/hooks.c) after a utility statement
/// completed without error. Every statement noted here refuses to run in a
/// transaction block or a function (PreventInTransactionBlock), so once it
/// completed, the next thing its transaction does is commit. (ALTER
/// DATABASE SET TABLESPACE commits its own work inside the statement; the
/// note then only labels the empty transaction after it.)
/// Reads the parse tree only; raises nothing.
pub fn note_completed_statement(stmt: *mut pg_sys::Node) {
    if stmt.is_null() {
        return;
    }
    // SAFETY: utilityStmt is a valid parse node for the duration of the call.
    unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_TransactionStmt => {
                let ts = stmt as *mut pg_sys::TransactionStmt;
                if (*ts).kind == pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED {
                    // FinishPreparedTransaction wrote the commit record and
                    // nothing after it.
                    REQUESTS.commit_prepared_end.set(pg_sys::XactLastRecEnd);
                }
            }
            pg_sys::NodeTag::T_CreatedbStmt
            | pg_sys::NodeTag::T_DropdbStmt
            | pg_sys::NodeTag::T_CreateTableSpaceStmt
            | pg_sys::NodeTag::T_DropTableSpaceStmt => REQUESTS.core_flushes.set(true),
            pg_sys::NodeTag::T_AlterDatabaseStmt => {
                // Only ALTER DATABASE ... SET TABLESPACE moves files.
                let options =
                    pgrx::PgList::<pg_sys::DefElem>::from_pg((*(stmt as *mut pg_sys::AlterDatabaseStmt)).options);
                if options.iter_ptr().any(|d| std::ffi::CStr::from_ptr((*d).defname).to_bytes() == b"tablespace") {
                    REQUESTS.core_flushes.set(true);
                }
            }
            _ => {}
        }
    }
}

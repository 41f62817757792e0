//! The commit decision: the policy layered over `synchronous_commit`.
//!
//! At `XACT_EVENT_PRE_COMMIT` the policy decides whether this commit is
//! delayed and sets the commit level for it: `off` to delay, `on` to make
//! an asynchronous session's commit durable. It does so whether or not the
//! transaction has an xid yet: `PreCommit_Notify()` assigns one after the
//! pre-commit callbacks (a NOTIFY-only transaction), and ON COMMIT DROP
//! drops files after them. The level is written with the GUC's assign hook
//! called directly (no set_config_option per commit) and put back at
//! `XACT_EVENT_COMMIT` or `XACT_EVENT_ABORT`, before `AtEOXact_GUC`.
//!
//! The outcome is counted at `XACT_EVENT_COMMIT`, when the commit record is
//! written and what PostgreSQL flushed anyway is known (the xid, pending
//! file deletions, COMMIT PREPARED, CREATE/DROP DATABASE...).
//!
//! The callbacks below call no PostgreSQL function that raises an error
//! (reading the xid and pending deletions, the assign hook), so no error
//! passes through a Rust frame here; those calls skip pgrx's per-call
//! guard (src/nothrow.rs), as a commit makes several. The exception is the
//! table classes' part at pre-commit (src/table_class.rs: invalidations,
//! reading the classes, the transaction's table statistics), whose calls
//! are guarded: an error there aborts the commit, as an error in a
//! deferred trigger would. The utility hook,
//! below which every utility statement runs, is a C trampoline
//! (src/c/hooks.c) for that reason.

use crate::guc::{self, Mode};
use crate::stats::{self, Counter};
use crate::table_class;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::CStr;

/// What the policy decided at pre-commit.
#[derive(Clone, Copy)]
struct Decision {
    /// The policy, tables' classes included, asked for a delayed commit.
    wanted_delayed: bool,
    /// A `durable` table made durable a commit the policy would have delayed.
    durable_by_table: bool,
    /// `delayed` tables made delayed a commit the policy would have made durable.
    delayed_by_table: bool,
    /// The commit level this commit runs with is off.
    delayed: bool,
    /// The transaction had an xid at pre-commit.
    had_xid: bool,
    /// It had written WAL by pre-commit: RecordTransactionCommit flushes
    /// (at a level above off) only when it did.
    wrote_wal: bool,
    /// XactLastRecEnd at pre-commit: for COMMIT PREPARED, the end of the
    /// prepared transaction's commit record.
    last_rec_end: u64,
    ignored_request: bool,
}

struct XactState {
    /// commit_delayed() was called in this top-level transaction.
    requested: Cell<bool>,
    /// This transaction runs a command for which PostgreSQL calls
    /// ForceSyncCommit() (CREATE/DROP DATABASE or TABLESPACE, ...).
    core_forces_sync: Cell<bool>,
    /// This transaction runs COMMIT PREPARED (always flushed by PostgreSQL).
    commit_prepared: Cell<bool>,
    /// The extension needs this commit durable (see require_durable_commit).
    durable_required: Cell<bool>,
    decision: Cell<Option<Decision>>,
    /// synchronous_commit to put back once the commit is done, when the
    /// policy changed it for this commit.
    restore_level: Cell<Option<i32>>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for XactState {}

static STATE: XactState = XactState {
    requested: Cell::new(false),
    core_forces_sync: Cell::new(false),
    commit_prepared: Cell::new(false),
    durable_required: Cell::new(false),
    decision: Cell::new(None),
    restore_level: Cell::new(None),
};

impl XactState {
    fn reset(&self) {
        if let Some(level) = self.restore_level.take() {
            set_commit_level(level);
        }
        self.requested.set(false);
        self.core_forces_sync.set(false);
        self.commit_prepared.set(false);
        self.durable_required.set(false);
        self.decision.set(None);
    }
}

unsafe extern "C-unwind" {
    /// src/c/hooks.c; only stores function pointers.
    fn dd_install_process_utility_hook();
}

pub fn install_hooks() {
    // SAFETY: called once from _PG_init in the postmaster; backends inherit
    // the callback and the hook. The previous utility hook is chained.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        dd_install_process_utility_hook();
    }
}

/// Makes the commit of the current transaction durable whatever the policy
/// says (counted as forced durable when the policy wanted it delayed).
pub fn require_durable_commit() {
    STATE.durable_required.set(true);
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT => before_commit(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
            if STATE.commit_prepared.get() {
                table_class::note_commit_prepared();
            }
            after_commit();
            crate::stats::flush_pending();
            table_class::at_transaction_end(true);
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            STATE.reset();
            crate::stats::flush_pending();
            // A prepared transaction may still roll back: read the classes again.
            table_class::at_transaction_end(false);
        }
        _ => {}
    }
}

fn commit_level() -> i32 {
    // SAFETY: plain read of a backend-local GUC variable.
    unsafe { pg_sys::synchronous_commit }
}

const OFF: i32 = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32;
const ON: i32 = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH as i32;

unsafe extern "C" {
    /// The GUC's assign hook (syncrep.c; declared in syncrep.h up to
    /// PostgreSQL 15 and in utils/guc_hooks.h from 16 on, which pgrx's
    /// bindings leave out). It only sets syncrep.c's wait mode.
    fn assign_synchronous_commit(newval: std::ffi::c_int, extra: *mut std::ffi::c_void);
}

/// Sets synchronous_commit and, through its assign hook, the wait mode for
/// synchronous replication that goes with it (what set_config_option would
/// do, without its per-call cost).
fn set_commit_level(level: i32) {
    // SAFETY: the backend-local GUC variable and its assign hook, which
    // raises nothing (so no error can pass through this frame).
    unsafe {
        pg_sys::synchronous_commit = level;
        assign_synchronous_commit(level, std::ptr::null_mut());
    }
}

/// For this commit only; put back by XactState::reset().
fn change_commit_level(level: i32) {
    STATE.restore_level.set(Some(commit_level()));
    set_commit_level(level);
}

fn transaction_has_xid() -> bool {
    // SAFETY: valid inside a transaction, up to the end of the commit callbacks.
    let xid = unsafe { crate::nothrow::GetTopTransactionIdIfAny() };
    xid != pg_sys::InvalidTransactionId
}

#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
type RelFileId = pg_sys::RelFileNode;
#[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
type RelFileId = pg_sys::RelFileLocator;

/// Whether the commit drops relation files, which PostgreSQL always flushes.
fn commit_drops_relation_files() -> bool {
    let mut rels: *mut RelFileId = std::ptr::null_mut();
    // SAFETY: the same call RecordTransactionCommit makes; the array it
    // pallocs (only when non-empty) is freed right away.
    unsafe {
        let n = crate::nothrow::smgrGetPendingDeletes(true, &mut rels);
        if !rels.is_null() {
            pg_sys::pfree(rels.cast());
        }
        n > 0
    }
}

fn before_commit() {
    let mode = guc::mode();
    let requested = STATE.requested.get();
    let sync_off = commit_level() == OFF;
    let had_xid = transaction_has_xid();
    // Without an xid the transaction modified no table.
    let tables = if had_xid { table_class::modified() } else { table_class::Modified::default() };
    let policy_delayed = match mode {
        Mode::Disabled => false,
        Mode::Allowed => requested || sync_off,
        Mode::Forced => true,
    };
    // Precedence: a durable table, then the disabled mode, then the reasons
    // to delay (commit_delayed(), delayed tables, forced, synchronous_commit).
    let durable_by_table = policy_delayed && tables.durable;
    let delayed_by_table = !policy_delayed && mode != Mode::Disabled && tables.only_delayed;
    let wanted_delayed = (policy_delayed && !tables.durable) || delayed_by_table;
    let delayed = wanted_delayed && !STATE.durable_required.get();
    // SAFETY: backend-local; the end of this transaction's last WAL record, 0 if none.
    let last_rec_end = unsafe { pg_sys::XactLastRecEnd };
    if delayed && !sync_off {
        change_commit_level(OFF);
    } else if !delayed && sync_off {
        change_commit_level(ON);
    }
    STATE.decision.set(Some(Decision {
        wanted_delayed,
        durable_by_table,
        delayed_by_table,
        delayed,
        had_xid,
        wrote_wal: last_rec_end != 0,
        last_rec_end,
        ignored_request: (requested || tables.only_delayed) && mode == Mode::Disabled,
    }));
}

/// Whether the commit record just written is flushed, making it so when
/// the policy said durable and PostgreSQL did not flush it because the
/// transaction got its xid only after pre-commit (NOTIFY, pg_notify(): the
/// notification is delivered right after this callback, and a listener must
/// not act on a transaction a crash could lose).
fn commit_is_flushed(decision: &Decision, commit_prepared: bool) -> bool {
    // The common durable commit first: it costs no call.
    if !decision.delayed && decision.wrote_wal {
        return true;
    }
    if commit_prepared || STATE.core_forces_sync.get() || commit_drops_relation_files() {
        return true;
    }
    if decision.delayed {
        return false;
    }
    if !decision.had_xid {
        // SAFETY: XactLastCommitEnd is the end of the commit record
        // RecordTransactionCommit just wrote, so the request is satisfiable;
        // an I/O failure is a PANIC here, as in RecordTransactionCommit.
        unsafe { pg_sys::XLogFlush(pg_sys::XactLastCommitEnd) };
        return true;
    }
    // A transaction that had an xid but no WAL at pre-commit (only temporary
    // or unlogged tables): PostgreSQL commits it asynchronously, nothing it
    // did survives a crash anyway; unless on-commit actions wrote WAL after
    // pre-commit, in which case it flushed. Ask the flush position.
    // SAFETY: XactLastCommitEnd is the end of the commit record just written.
    crate::flush::flush_end() >= unsafe { pg_sys::XactLastCommitEnd }
}

fn after_commit() {
    if let Some(decision) = STATE.decision.get() {
        let commit_prepared = STATE.commit_prepared.get();
        // A commit record was written: the transaction had an xid by the
        // time it committed, or it committed a prepared transaction.
        if commit_prepared || transaction_has_xid() {
            let commit_end = if commit_prepared {
                decision.last_rec_end
            } else {
                // SAFETY: the end of the commit record RecordTransactionCommit just wrote.
                unsafe { pg_sys::XactLastCommitEnd }
            };
            let flushed = commit_is_flushed(&decision, commit_prepared);
            // The loss budget and the record of acknowledgements apply to
            // the commits the policy delayed.
            let budget_flushed = !flushed && decision.delayed && crate::loss::acknowledge(commit_end);
            stats::count(if flushed || budget_flushed { Counter::CommitsDurable } else { Counter::CommitsDelayed });
            if flushed && decision.wanted_delayed {
                stats::count(Counter::CommitsForcedDurable);
            }
            if decision.durable_by_table && (flushed || budget_flushed) {
                stats::count(Counter::CommitsDurableByTable);
            }
            if decision.delayed_by_table && !flushed && !budget_flushed {
                stats::count(Counter::CommitsDelayedByTable);
            }
            if budget_flushed {
                stats::count(Counter::CommitsBudgetFlushed);
            }
            crate::receipts::remember_commit(commit_end);
        }
        if decision.ignored_request {
            stats::count(Counter::DelayedRequestsIgnored);
        }
    }
    STATE.reset();
}

/// Called by the utility hook (src/c/hooks.c) before every utility
/// statement: notes the commands whose commit PostgreSQL always flushes, so
/// the counters can tell "forced durable by core" apart from the policy.
/// Reads the parse tree only; raises nothing.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn dd_note_utility_statement(stmt: *mut pg_sys::Node) {
    if stmt.is_null() {
        return;
    }
    // SAFETY: utilityStmt is a valid parse node for the duration of the call.
    unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_TransactionStmt => {
                let ts = stmt as *mut pg_sys::TransactionStmt;
                if (*ts).kind == pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED {
                    STATE.commit_prepared.set(true);
                }
            }
            pg_sys::NodeTag::T_CreatedbStmt
            | pg_sys::NodeTag::T_DropdbStmt
            | pg_sys::NodeTag::T_CreateTableSpaceStmt
            | pg_sys::NodeTag::T_DropTableSpaceStmt => STATE.core_forces_sync.set(true),
            pg_sys::NodeTag::T_AlterDatabaseStmt => {
                // Only ALTER DATABASE ... SET TABLESPACE moves files.
                let options =
                    pgrx::PgList::<pg_sys::DefElem>::from_pg((*(stmt as *mut pg_sys::AlterDatabaseStmt)).options);
                if options.iter_ptr().any(|d| CStr::from_ptr((*d).defname).to_bytes() == b"tablespace") {
                    STATE.core_forces_sync.set(true);
                }
            }
            _ => {}
        }
    }
}

/// Called by the utility hook after a utility statement succeeded.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn dd_after_utility_statement(stmt: *mut pg_sys::Node) {
    // SAFETY: as in dd_note_utility_statement.
    unsafe {
        if !stmt.is_null() && (*stmt).type_ == pg_sys::NodeTag::T_DiscardStmt {
            // DISCARD SEQUENCES and DISCARD ALL forget cached_currval()
            // values, as they forget currval()'s.
            let target = (*(stmt as *mut pg_sys::DiscardStmt)).target;
            if target == pg_sys::DiscardMode::DISCARD_ALL || target == pg_sys::DiscardMode::DISCARD_SEQUENCES {
                crate::sequence::discard_session_values();
            }
        }
    }
}

/// True inside BEGIN ... COMMIT, an implicit multi-statement block, or a
/// procedure or DO block (where COMMIT may end the transaction).
fn in_transaction_block_or_procedure() -> bool {
    // SAFETY: reads backend-local transaction and portal state.
    unsafe {
        if pg_sys::IsTransactionBlock() {
            return true;
        }
        let portal = pg_sys::ActivePortal;
        !portal.is_null()
            && matches!(
                (*portal).commandTag,
                pg_sys::CommandTag::CMDTAG_CALL | pg_sys::CommandTag::CMDTAG_DO
            )
    }
}

/// Asks that the current transaction commit with delayed durability, like
/// SQL Server's `COMMIT WITH (DELAYED_DURABILITY = ON)`. Returns whether the
/// commit will be delayed under the mode in effect now.
#[pg_extern(volatile, parallel_unsafe)]
fn commit_delayed() -> bool {
    crate::preload::require_preloaded();
    if !in_transaction_block_or_procedure() {
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_NO_ACTIVE_SQL_TRANSACTION,
            "commit_delayed() can only be used in transaction blocks"
        );
    }
    STATE.requested.set(true);
    guc::mode() != Mode::Disabled
}

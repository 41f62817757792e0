//! The commit decision: the policy layered over `synchronous_commit`.
//!
//! At `XACT_EVENT_PRE_COMMIT` the policy decides whether this commit is
//! delayed. Raising `off` to `on` goes through
//! `set_config_option(..., GUC_ACTION_LOCAL)` so that the GUC's assign hook
//! sets the sync-replication wait mode, and the change is undone when the
//! transaction ends; switching a commit to `off` is done directly (see
//! `delay_this_commit`). Nothing is done when the effective level already
//! matches, so the default configuration costs a GUC read and a comparison
//! per commit.

use crate::guc::{self, Mode};
use crate::stats::{self, Counter};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::CStr;

/// What the policy decided for the commit in progress, counted once the
/// commit record is written.
#[derive(Clone, Copy)]
struct CommitOutcome {
    /// The transaction wrote a commit record (it had an xid, or it is
    /// COMMIT PREPARED); read-only commits are not counted.
    counted: bool,
    delayed: bool,
    /// The policy said delayed, PostgreSQL made it durable anyway.
    forced_durable: bool,
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
    outcome: Cell<Option<CommitOutcome>>,
    /// synchronous_commit to put back once the commit is done, when the
    /// policy switched it off for this commit.
    restore_level: Cell<Option<i32>>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for XactState {}

static STATE: XactState = XactState {
    requested: Cell::new(false),
    core_forces_sync: Cell::new(false),
    commit_prepared: Cell::new(false),
    outcome: Cell::new(None),
    restore_level: Cell::new(None),
};

impl XactState {
    fn reset(&self) {
        if let Some(level) = self.restore_level.take() {
            // SAFETY: puts back the value read in delay_this_commit().
            unsafe { pg_sys::synchronous_commit = level };
        }
        self.requested.set(false);
        self.core_forces_sync.set(false);
        self.commit_prepared.set(false);
        self.outcome.set(None);
    }
}

static mut PREV_PROCESS_UTILITY_HOOK: pg_sys::ProcessUtility_hook_type = None;

pub fn install_hooks() {
    // SAFETY: called once from _PG_init in the postmaster; backends inherit
    // the callback and the hook. The previous utility hook is chained.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        PREV_PROCESS_UTILITY_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT => before_commit(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT => after_commit(),
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            STATE.reset()
        }
        _ => {}
    }
}

fn synchronous_commit_is_off() -> bool {
    // SAFETY: plain read of a backend-local GUC variable.
    let level = unsafe { pg_sys::synchronous_commit };
    level == pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32
}

fn transaction_has_xid() -> bool {
    // SAFETY: valid inside a transaction, which PRE_COMMIT is.
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() };
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
        let n = pg_sys::smgrGetPendingDeletes(true, &mut rels);
        if !rels.is_null() {
            pg_sys::pfree(rels.cast());
        }
        n > 0
    }
}

/// Raises synchronous_commit = off to on for this commit only (disabled
/// mode); the assign hook sets the sync-replication wait mode to match.
fn raise_to_durable() {
    // SAFETY: documented GUC API; GUC_ACTION_LOCAL is undone by AtEOXact_GUC
    // later in CommitTransaction, and errors are raised as PostgreSQL errors.
    unsafe {
        pg_sys::set_config_option(
            c"synchronous_commit".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            pg_sys::PGERROR as i32,
            false,
        );
    }
}

/// Makes this commit asynchronous. This is the hot path of `forced` (and of
/// opted-in commits), so it writes the variable instead of going through
/// set_config_option: for `off` nothing else needs updating, because every
/// reader at commit (RecordTransactionCommit, and SyncRepWaitForLSN through
/// SyncRepRequested()) only compares the level against off/local, and the
/// sync-replication wait mode set by the assign hook is never consulted.
/// The old value is put back at XACT_EVENT_COMMIT or ABORT, before
/// AtEOXact_GUC runs. Raising a level (disabled mode) does need the assign
/// hook, and uses set_config_option.
fn delay_this_commit() {
    // SAFETY: backend-local GUC variable, restored in XactState::reset().
    unsafe {
        STATE.restore_level.set(Some(pg_sys::synchronous_commit));
        pg_sys::synchronous_commit = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32;
    }
}

fn before_commit() {
    let mode = guc::mode();
    let requested = STATE.requested.get();
    let sync_off = synchronous_commit_is_off();
    let want_delayed = match mode {
        Mode::Disabled => false,
        Mode::Allowed => requested || sync_off,
        Mode::Forced => true,
    };
    let has_xid = transaction_has_xid();
    // Without an xid no commit record is flushed either way.
    if has_xid && want_delayed != sync_off {
        if want_delayed {
            delay_this_commit();
        } else {
            raise_to_durable();
        }
    }
    let commit_prepared = STATE.commit_prepared.get();
    let forced_durable = want_delayed
        && (commit_prepared
            || (has_xid && (STATE.core_forces_sync.get() || commit_drops_relation_files())));
    STATE.outcome.set(Some(CommitOutcome {
        counted: has_xid || commit_prepared,
        delayed: want_delayed && !forced_durable,
        forced_durable,
        ignored_request: requested && mode == Mode::Disabled,
    }));
}

fn after_commit() {
    if let Some(outcome) = STATE.outcome.get() {
        if outcome.counted {
            stats::count(if outcome.delayed {
                Counter::CommitsDelayed
            } else {
                Counter::CommitsDurable
            });
            if outcome.forced_durable {
                stats::count(Counter::CommitsForcedDurable);
            }
        }
        if outcome.ignored_request {
            stats::count(Counter::DelayedRequestsIgnored);
        }
    }
    STATE.reset();
}

/// Notes the utility commands whose commit PostgreSQL always flushes, so the
/// counters can tell "forced durable by core" apart from the policy.
fn note_utility_statement(stmt: *mut pg_sys::Node) {
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
                let options = pgrx::PgList::<pg_sys::DefElem>::from_pg(
                    (*(stmt as *mut pg_sys::AlterDatabaseStmt)).options,
                );
                if options
                    .iter_ptr()
                    .any(|d| CStr::from_ptr((*d).defname).to_bytes() == b"tablespace")
                {
                    STATE.core_forces_sync.set(true);
                }
            }
            _ => {}
        }
    }
}

#[cfg(not(feature = "pg13"))]
#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: arguments are passed through unchanged to the previous hook or
    // to standard_ProcessUtility, as every utility hook must.
    unsafe {
        note_utility_statement((*pstmt).utilityStmt);
        match PREV_PROCESS_UTILITY_HOOK {
            Some(prev) => prev(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => pg_sys::standard_ProcessUtility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
}

#[cfg(feature = "pg13")]
#[pg_guard]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: as above, for the PostgreSQL 13 signature.
    unsafe {
        note_utility_statement((*pstmt).utilityStmt);
        match PREV_PROCESS_UTILITY_HOOK {
            Some(prev) => prev(pstmt, query_string, context, params, query_env, dest, qc),
            None => pg_sys::standard_ProcessUtility(
                pstmt,
                query_string,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
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

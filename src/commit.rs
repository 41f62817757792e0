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
//! At `XACT_EVENT_COMMIT` the commit record is written, and whether it is
//! flushed is read from the flush position against the record's end: a
//! delayed commit left unflushed goes through the loss budget and the
//! record of acknowledgements, a durable one found unflushed is flushed,
//! and the receipt is the record's end. What the transaction asked for
//! (src/commit_requests.rs) only names the reason in the counters.
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

use crate::commit_requests as requests;
use crate::guc::{self, Mode};
use crate::stats::{self, Counter};
use crate::table_class;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::Cell;

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
    ignored_request: bool,
}

struct XactState {
    decision: Cell<Option<Decision>>,
    /// synchronous_commit to put back once the commit is done, when the
    /// policy changed it for this commit.
    restore_level: Cell<Option<i32>>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for XactState {}

static STATE: XactState = XactState { decision: Cell::new(None), restore_level: Cell::new(None) };

impl XactState {
    fn reset(&self) {
        if let Some(level) = self.restore_level.take() {
            set_commit_level(level);
        }
        self.decision.set(None);
        requests::reset();
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

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT => before_commit(),
        // PREPARE waits for a synchronous standby at the session's level
        // (EndPrepare); values a sequence made in this transaction handed
        // out need that wait at remote_flush at least, as its commit would.
        // Restored at XACT_EVENT_PREPARE.
        pg_sys::XactEvent::XACT_EVENT_PRE_PREPARE => {
            if requests::commit_on_standby_required() && commit_level() < ON {
                change_commit_level(ON);
            }
        }
        pg_sys::XactEvent::XACT_EVENT_COMMIT => {
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
    stats::bind_database_slot();
    let mode = guc::mode();
    let requested = requests::delayed_requested();
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
    let delayed = wanted_delayed && !requests::durable_required();
    if delayed && !sync_off {
        change_commit_level(OFF);
    } else if !delayed && (sync_off || (requests::commit_on_standby_required() && commit_level() < ON)) {
        change_commit_level(ON);
    }
    STATE.decision.set(Some(Decision {
        wanted_delayed,
        durable_by_table,
        delayed_by_table,
        delayed,
        had_xid,
        // SAFETY: backend-local; the end of this transaction's last WAL record, 0 if none.
        wrote_wal: unsafe { pg_sys::XactLastRecEnd } != 0,
        ignored_request: (requested || tables.only_delayed) && mode == Mode::Disabled,
    }));
}

/// How a commit whose record was just written stands, read from facts: the
/// flush position against the end of the commit record, and what
/// PostgreSQL was seen doing (a statement that completed, the relation
/// files the commit drops). Nothing predicted from a statement that may
/// have failed decides whether a commit is treated as flushed.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Outcome {
    /// Flushed before the client hears of it.
    Durable,
    /// Left unflushed by the policy: the loss budget and the record of
    /// acknowledgements apply.
    Delayed,
    /// Delayed by the policy, and found flushed already by another process
    /// (nothing of it can be lost: not recorded).
    DelayedFlushedMeanwhile,
    /// Flushed because PostgreSQL always flushes such a commit, though the
    /// policy delayed it.
    DurableByCore,
    /// PostgreSQL's own asynchronous commit of a transaction that wrote WAL
    /// only for temporary or unlogged tables (nothing of it survives a crash).
    CoreAsync,
}

/// Makes a durable decision hold: when the commit record is not flushed
/// although the policy said durable (the transaction got its xid only after
/// pre-commit, as with NOTIFY, whose listeners must not act on a commit a
/// crash could lose), flushes it here.
fn outcome(decision: &Decision, commit_end: u64, commit_prepared: bool) -> Outcome {
    if crate::flush::flush_end() >= commit_end {
        if !decision.delayed {
            return Outcome::Durable;
        }
        // Flushed already: by PostgreSQL because of what the transaction
        // did, or by another process (a concurrent flush) in the meantime.
        return if commit_prepared || requests::core_flushes_commit() || commit_drops_relation_files() {
            Outcome::DurableByCore
        } else {
            Outcome::DelayedFlushedMeanwhile
        };
    }
    if decision.delayed {
        return Outcome::Delayed;
    }
    if decision.had_xid && !decision.wrote_wal && !commit_prepared {
        return Outcome::CoreAsync;
    }
    // SAFETY: commit_end is the end of a commit record already inserted, so
    // the request is satisfiable; an I/O failure is a PANIC here, as in
    // RecordTransactionCommit.
    unsafe { pg_sys::XLogFlush(commit_end) };
    Outcome::Durable
}

fn after_commit() {
    if let Some(decision) = STATE.decision.get() {
        let commit_prepared_end = requests::commit_prepared_end();
        // The end of the commit record written: of this transaction's (it
        // had an xid by the time it committed) or of the prepared
        // transaction it committed.
        // SAFETY: the end of the commit record RecordTransactionCommit just
        // wrote, when the transaction had an xid.
        let own_end = if transaction_has_xid() { unsafe { pg_sys::XactLastCommitEnd } } else { 0 };
        // Both when a transaction with its own writes also ran COMMIT
        // PREPARED (a pipeline on servers that allow it): the later one.
        let commit_end = own_end.max(commit_prepared_end.unwrap_or(0));
        if commit_end != 0 {
            let outcome = outcome(&decision, commit_end, commit_prepared_end.is_some());
            // The loss budget and the record of acknowledgements apply to
            // every commit the policy delayed; the budget against a standby
            // also to one flushed here meanwhile, by another process or by
            // PostgreSQL itself.
            let budget_flushed = match outcome {
                Outcome::Delayed => crate::loss::acknowledge(commit_end),
                Outcome::DelayedFlushedMeanwhile => crate::loss::record_flushed_acknowledgement(commit_end),
                // PostgreSQL flushed it (files dropped) but, delayed by the
                // policy, did not wait for a synchronous standby: a failover
                // can lose it as any delayed commit. Not COMMIT PREPARED: it
                // waited at the session's own level, inside the statement.
                Outcome::DurableByCore if commit_prepared_end.is_none() => {
                    crate::loss::record_flushed_acknowledgement(commit_end)
                }
                _ => false,
            };
            let durable = matches!(outcome, Outcome::Durable | Outcome::DurableByCore) || budget_flushed;
            stats::count(if durable { Counter::CommitsDurable } else { Counter::CommitsDelayed });
            if decision.wanted_delayed && matches!(outcome, Outcome::Durable | Outcome::DurableByCore) {
                stats::count(Counter::CommitsForcedDurable);
            }
            if decision.durable_by_table && durable {
                stats::count(Counter::CommitsDurableByTable);
            }
            if decision.delayed_by_table && !durable {
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

/// Called by the utility hook (src/c/hooks.c) after a utility statement
/// completed without error (a failed one never gets here). Reads the parse
/// tree only; raises nothing but what processing invalidations after
/// COMMIT PREPARED may raise.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn dd_after_utility_statement(stmt: *mut pg_sys::Node) {
    requests::note_completed_statement(stmt);
    // SAFETY: utilityStmt is a valid parse node for the duration of the call.
    unsafe {
        if stmt.is_null() {
            return;
        }
        match (*stmt).type_ {
            pg_sys::NodeTag::T_DiscardStmt => {
                // DISCARD SEQUENCES and DISCARD ALL forget cached_currval()
                // values, as they forget currval()'s.
                let target = (*(stmt as *mut pg_sys::DiscardStmt)).target;
                if target == pg_sys::DiscardMode::DISCARD_ALL || target == pg_sys::DiscardMode::DISCARD_SEQUENCES {
                    crate::sequence::discard_session_values();
                }
            }
            pg_sys::NodeTag::T_TransactionStmt
                if (*(stmt as *mut pg_sys::TransactionStmt)).kind
                    == pg_sys::TransactionStmtKind::TRANS_STMT_COMMIT_PREPARED =>
            {
                table_class::commit_prepared_completed();
            }
            _ => {}
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
            && matches!((*portal).commandTag, pg_sys::CommandTag::CMDTAG_CALL | pg_sys::CommandTag::CMDTAG_DO)
    }
}

/// Asks that the current transaction commit with delayed durability, like
/// SQL Server's `COMMIT WITH (DELAYED_DURABILITY = ON)`. Returns whether the
/// commit will be delayed under the mode in effect now.
#[pg_extern(volatile, parallel_unsafe)]
fn commit_delayed() -> bool {
    crate::preload::require_preloaded();
    if !in_transaction_block_or_procedure() {
        // Like SET LOCAL outside a transaction block: no effect.
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_NO_ACTIVE_SQL_TRANSACTION,
            "commit_delayed() can only be used in transaction blocks",
            "",
        )
        .set_hint("Outside a transaction block it has no effect: call it between BEGIN and COMMIT.")
        .report(PgLogLevel::WARNING);
        return false;
    }
    requests::request_delayed();
    guc::mode() != Mode::Disabled
}

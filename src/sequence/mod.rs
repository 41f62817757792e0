//! cached_nextval(): sequences that never go backwards after a crash.
//!
//! One cache of CACHE values per sequence, shared by every session, in
//! shared memory (`slots`). When the cache is empty the next call claims a
//! new block: under the sequence page's exclusive lock, as nextval() and
//! setval() work, it writes the block's end as the sequence's last_value
//! (the recovery value), WAL-logs it, and flushes that WAL before handing
//! out any value of the block, whatever the commit policy (`page`, and
//! src/c/sequence_page.c). After a crash the sequence restarts after the
//! block end, so no value is handed out twice; native nextval() continues
//! after it too.
//!
//! Each call compares the sequence page with the one its block's claim
//! left (file, WAL position, last_value, log_cnt) and the options with
//! pg_sequence: after nextval(), setval() (even to the block's own end),
//! ALTER SEQUENCE or a rolled-back new file, the block is given up and a
//! new one claimed after what the sequence now says.
//!
//! cached_currval() and cached_lastval() return what this session's
//! cached_nextval() returned last: PostgreSQL's currval()/lastval() keep
//! their state private to sequence.c and know nothing of these values.

mod page;
mod slots;
mod standby;

use crate::stats::{self, Counter};
use page::Options;
use pgrx::pg_sys;
use pgrx::prelude::*;

/// The log_cnt of a claim on a sequence without WAL (see claim_block).
const UNLOGGED_CLAIM_MARK: i64 = -1;

pub fn define_gucs() {
    slots::define_guc();
}

pub fn request_shared_memory() {
    slots::request_shared_memory();
}

pub fn attach_shared_memory() {
    slots::attach_shared_memory();
}

/// The options cache's invalidation and the release of kept page pins at
/// transaction end (src/c/sequence_call.c).
pub fn register_callbacks() {
    // SAFETY: called once from _PG_init in the postmaster.
    unsafe { dd_sequence_register_callbacks() };
}

/// cached_currval()'s and cached_lastval()'s checks, as currval()'s
/// (cached_nextval() checks in src/c/sequence_call.c).
fn check_privileges(rel: pg_sys::Relation, relid: pg_sys::Oid, privileges: u32) {
    // SAFETY: reads the open relation and checks the ACL like currval does.
    unsafe {
        if (*(*rel).rd_rel).relkind as u8 != pg_sys::RELKIND_SEQUENCE {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("\"{}\" is not a sequence", page::relation_name(rel)),
                "",
            )
            .report(PgLogLevel::ERROR);
        }
        if pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), privileges as _) != pg_sys::AclResult::ACLCHECK_OK {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for sequence {}", page::relation_name(rel)),
                "",
            )
            .report(PgLogLevel::ERROR);
        }
    }
}

/// Opens a relation by OID, with an error that names the problem when no
/// relation has that OID (regclass input only checks names).
fn open_relation(relid: pg_sys::Oid, lockmode: u32) -> pg_sys::Relation {
    // SAFETY: try_relation_open returns NULL instead of raising when the
    // relation does not exist; the lock is kept until transaction end.
    let rel = unsafe { pg_sys::try_relation_open(relid, lockmode as i32) };
    if rel.is_null() {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("relation with OID {} does not exist", relid.to_u32()),
            "",
        )
        .report(PgLogLevel::ERROR);
    }
    rel
}

fn close_relation(rel: pg_sys::Relation) {
    // SAFETY: closes without releasing the lock, as nextval does.
    unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
}

/// Claims the next block of the sequence after what its page says now,
/// atomically with respect to nextval() and setval(), and makes its
/// recovery value durable before any of its values is handed out. Returns
/// the block's first value, taken for the caller, unless a synchronous
/// standby must confirm the block first.
fn claim_block(rel: pg_sys::Relation, options: &Options, slot: &mut slots::Slot) -> Option<i64> {
    // SAFETY: reads the open relation's persistence.
    let permanent = unsafe { (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT };
    let locked = page::lock(rel);
    let now = locked.page;
    let first = page::first_value_after(rel, options, now.last_value, now.is_called);
    // A permanent sequence whose writes are not WAL-logged (its file is new
    // in this transaction and wal_level = minimal) keeps the same page LSN
    // through a setval() in this transaction, which could then go unseen:
    // hand out one value per claim there.
    let size = if permanent && !now.needs_wal { 1 } else { options.cache };
    let end = page::block_end(options, first, size);
    // Without WAL the page LSN never changes: mark the tuple with a log_cnt
    // that nextval() (0..=32) and setval() (0) never write, so that any
    // write of theirs shows. Negative, because nextval() trusts log_cnt as
    // "values already WAL-logged": below any fetch, it makes nextval() log,
    // even after ALTER SEQUENCE ... SET LOGGED copies the tuple as it is.
    // Permanent sequences keep an honest 0.
    let log_cnt = if permanent { 0 } else { UNLOGGED_CLAIM_MARK };
    let (record_end, written) = locked.write(end, log_cnt);
    stats::count(Counter::SequenceRecoveryWrites);
    if permanent && written.new_in_transaction {
        // The recovery value lives in a file that exists only if this
        // transaction commits: flushing it now protects nothing. Make the
        // commit itself durable, and confirmed by a synchronous standby
        // whatever the session's synchronous_commit, so that no value
        // handed out here is handed out again once the commit has been
        // acknowledged, after a crash or a promotion.
        crate::commit_requests::require_commit_on_standby();
    } else if written.needs_wal {
        // SAFETY: record_end is the end of the WAL record just inserted.
        unsafe { pg_sys::XLogFlush(record_end) };
        stats::count(Counter::SequenceFlushes);
    }
    // What a synchronous standby must confirm before a value of the block
    // is handed out (nothing without WAL, or in the creating transaction,
    // whose commit waits for the standby itself).
    let confirm_lsn = if written.needs_wal && !(permanent && written.new_in_transaction) { record_end } else { 0 };
    let size = ((end as i128 - first as i128) / options.increment as i128 + 1) as u64;
    slot.begin_write();
    slot.confirm_lsn = confirm_lsn;
    slot.options = *options;
    let reserved = slot.set_block(first, size, confirm_lsn == 0);
    slot.page = written;
    slot.valid = true;
    slot.end_write();
    reserved
}

// Like nextval(), but from a cache shared by all sessions whose recovery
// value is flushed to disk before any of its values is handed out. The
// per-call work is C (src/c/sequence_call.c), shaped like nextval's; this
// module is its slow path.
pgrx::extension_sql!(
    r#"
CREATE FUNCTION cached_nextval(seq regclass) RETURNS bigint
    VOLATILE PARALLEL UNSAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_nextval_wrapper';
"#,
    name = "cached_nextval"
);

unsafe extern "C" {
    fn dd_cached_nextval(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    fn dd_sequence_session_value(relid: pg_sys::Oid, value: *mut i64) -> bool;
    fn dd_sequence_session_last(relid: *mut pg_sys::Oid, value: *mut i64) -> bool;
    fn dd_sequence_discard_session_values();
    fn dd_sequence_register_callbacks();
}

/// The symbol CREATE FUNCTION names. A Rust library exports only Rust
/// symbols, so this is a jump to the C function: no Rust frame stands
/// between the executor and the errors the C code raises.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn cached_nextval_wrapper(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("jmp {f}", f = sym dd_cached_nextval);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("b {f}", f = sym dd_cached_nextval);
}

/// Version-1 calling convention, as PG_FUNCTION_INFO_V1 declares it.
#[no_mangle]
pub extern "C" fn pg_finfo_cached_nextval_wrapper() -> &'static pg_sys::Pg_finfo_record {
    static INFO: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &INFO
}

/// cached_nextval()'s slow path, when the fast path could not take a value
/// from the slot without its lock: the slot is found (its index is stored
/// for the fast path), the page compared under the slot's lock, a block
/// claimed when needed, a synchronous standby waited for. The caller (C)
/// has locked and opened the sequence, checked privileges and read its
/// options.
#[no_mangle]
#[pg_guard]
pub unsafe extern "C-unwind" fn dd_cached_nextval_slow(
    rel: pg_sys::Relation,
    options: *const Options,
    slot_index: *mut i32,
) -> i64 {
    crate::preload::require_preloaded();
    // SAFETY: the caller's open relation and its options.
    let (relid, options) = unsafe { ((*rel).rd_id, *options) };
    // SAFETY: MyDatabaseId is set in a connected backend.
    let key = (unsafe { pg_sys::MyDatabaseId }.to_u32() as u64) << 32 | relid.to_u32() as u64;
    // The block this call waited for: still in the slot after the wait, it
    // is used even if the page changed meanwhile (a nextval() or setval()
    // that came later is ordered after this call), so that a steady stream
    // of native writes cannot make the call claim and wait forever.
    let mut waited_for = None;
    let value = loop {
        let locked = slots::lock(key);
        // SAFETY: the caller's out parameter.
        unsafe { *slot_index = locked.index };
        let slot = &mut *locked.slot;
        let now = page::read(rel);
        // A claim is known by the page LSN it wrote (the end of its record).
        let ours = waited_for.is_some() && waited_for == Some(slot.page.page_lsn) && slot.has_values();
        // A block claimed in the transaction that made the sequence's file
        // had its standby confirmation left to that transaction's commit,
        // which may not have waited (synchronous_commit = local, a canceled
        // wait): once that transaction is over, a new block is claimed.
        let usable = ours
            || (slot.has_values()
                && slot.options == options
                && now.is_called
                && slot.page.same_version(&now)
                && (!slot.page.new_in_transaction || now.new_in_transaction));
        if !usable {
            if let Some(value) = claim_block(rel, &options, slot) {
                break value;
            }
        }
        if slot.confirm_lsn != 0 {
            if !standby::confirmed(slot.confirm_lsn) {
                // Wait without the slot's lock (other sessions wait for the
                // same confirmation the same way), then look again.
                let lsn = slot.confirm_lsn;
                drop(locked);
                standby::wait(lsn);
                waited_for = Some(lsn);
                continue;
            }
            slot.begin_write();
            slot.confirm_lsn = 0;
            slot.end_write();
        }
        // Lock-free takers may have used up the block meanwhile.
        match slot.take() {
            Some(value) => break value,
            None => continue,
        }
    };
    stats::count_pending(Counter::SequenceValues);
    value
}

/// DISCARD SEQUENCES and DISCARD ALL forget them, as they do for currval().
pub fn discard_session_values() {
    // SAFETY: resets backend-local state; raises nothing.
    unsafe { dd_sequence_discard_session_values() };
}

fn not_yet_defined(message: String) -> ! {
    pg_sys::panic::ErrorReport::new(PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, message, "")
        .set_hint("Call cached_nextval() in this session first.")
        .report(PgLogLevel::ERROR);
    unreachable!()
}

/// The value cached_nextval() returned last in this session for this
/// sequence, like currval() for nextval().
#[pg_extern(sql = r#"
CREATE FUNCTION cached_currval(seq regclass) RETURNS bigint
    VOLATILE PARALLEL UNSAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_currval_wrapper';
"#)]
fn cached_currval(relid: pg_sys::Oid) -> i64 {
    crate::preload::require_preloaded();
    let rel = open_relation(relid, pg_sys::AccessShareLock);
    check_privileges(rel, relid, pg_sys::ACL_SELECT | pg_sys::ACL_USAGE);
    let name = page::relation_name(rel);
    close_relation(rel);
    let mut value = 0;
    // SAFETY: reads backend-local state into a local.
    if unsafe { dd_sequence_session_value(relid, &mut value) } {
        value
    } else {
        not_yet_defined(format!("cached_currval of sequence \"{name}\" is not yet defined in this session"))
    }
}

/// The value cached_nextval() returned last in this session, for any
/// sequence, like lastval() for nextval().
#[pg_extern(sql = r#"
CREATE FUNCTION cached_lastval() RETURNS bigint
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_lastval_wrapper';
"#)]
fn cached_lastval() -> i64 {
    crate::preload::require_preloaded();
    let (mut relid, mut value) = (pg_sys::Oid::INVALID, 0);
    // SAFETY: reads backend-local state into locals.
    if !unsafe { dd_sequence_session_last(&mut relid, &mut value) } {
        not_yet_defined("cached_lastval is not yet defined in this session".into())
    }
    // As lastval(): the sequence may have been dropped since.
    // SAFETY: try_relation_open returns NULL for a dropped relation.
    let rel = unsafe { pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as i32) };
    if rel.is_null() {
        not_yet_defined("cached_lastval is not yet defined in this session".into());
    }
    check_privileges(rel, relid, pg_sys::ACL_SELECT | pg_sys::ACL_USAGE);
    close_relation(rel);
    value
}

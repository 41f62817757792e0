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
use std::cell::RefCell;
use std::collections::HashMap;

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

pub fn register_invalidation_callback() {
    page::register_invalidation_callback();
}

fn check_privileges(rel: pg_sys::Relation, relid: pg_sys::Oid, privileges: u32, writes: bool) {
    // SAFETY: reads the open relation and checks the ACL like nextval does.
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
        if writes {
            if pg_sys::XactReadOnly && (*(*rel).rd_rel).relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP {
                pg_sys::PreventCommandIfReadOnly(c"cached_nextval()".as_ptr());
            }
            pg_sys::PreventCommandIfParallelMode(c"cached_nextval()".as_ptr());
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
/// recovery value durable before any of its values is handed out.
fn claim_block(rel: pg_sys::Relation, options: &Options, slot: &mut slots::Slot) {
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
        // commit itself durable instead, so that no value handed out here
        // is handed out again once the commit has been acknowledged.
        crate::commit::require_durable_commit();
    } else if written.needs_wal {
        // SAFETY: record_end is the end of the WAL record just inserted.
        unsafe { pg_sys::XLogFlush(record_end) };
        stats::count(Counter::SequenceFlushes);
    }
    // What a synchronous standby must confirm before a value of the block
    // is handed out (nothing without WAL, or in the creating transaction,
    // whose commit waits for the standby itself).
    slot.confirm_lsn = if written.needs_wal && !(permanent && written.new_in_transaction) { record_end } else { 0 };
    slot.options = *options;
    slot.next = first;
    slot.block_end = end;
    slot.page = written;
    slot.exhausted = false;
    slot.valid = true;
}

/// Like nextval(), but from a cache shared by all sessions whose recovery
/// value is flushed to disk before any of its values is handed out.
#[pg_extern(sql = r#"
CREATE FUNCTION cached_nextval(seq regclass) RETURNS bigint
    VOLATILE PARALLEL UNSAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_nextval_wrapper';
"#)]
fn cached_nextval(relid: pg_sys::Oid) -> i64 {
    crate::preload::require_preloaded();
    let rel = open_relation(relid, pg_sys::RowExclusiveLock);
    check_privileges(rel, relid, pg_sys::ACL_USAGE | pg_sys::ACL_UPDATE, true);
    let options = page::options(relid);
    // SAFETY: MyDatabaseId is set in a connected backend.
    let key = (unsafe { pg_sys::MyDatabaseId }.to_u32() as u64) << 32 | relid.to_u32() as u64;
    // The block this call waited for: still in the slot after the wait, it
    // is used even if the page changed meanwhile (a nextval() or setval()
    // that came later is ordered after this call), so that a steady stream
    // of native writes cannot make the call claim and wait forever.
    let mut waited_for = None;
    let value = loop {
        let locked = slots::lock(key);
        let slot = &mut *locked.slot;
        let now = page::read(rel);
        // A claim is known by the page LSN it wrote (the end of its record).
        let ours = waited_for.is_some() && waited_for == Some(slot.page.page_lsn) && slot.valid && !slot.exhausted;
        let usable = ours
            || (slot.valid && !slot.exhausted && slot.options == options && now.is_called && slot.page.same_version(&now));
        if !usable {
            claim_block(rel, &options, slot);
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
            slot.confirm_lsn = 0;
        }
        let value = slot.next;
        if value == slot.block_end {
            slot.exhausted = true;
        } else {
            slot.next = value + options.increment;
        }
        break value;
    };
    stats::count(Counter::SequenceValues);
    close_relation(rel);
    SESSION.with(|s| s.returned(relid.to_u32(), value));
    value
}

/// What this session's cached_nextval() returned, per sequence and last.
#[derive(Default)]
struct SessionValues {
    by_sequence: HashMap<u32, i64>,
    last_sequence: Option<u32>,
}

struct Session(RefCell<Option<SessionValues>>);
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for Session {}
static SESSION: Session = Session(RefCell::new(None));

impl Session {
    fn with<T>(&self, f: impl FnOnce(&mut SessionValues) -> T) -> T {
        f(self.0.borrow_mut().get_or_insert_with(Default::default))
    }
}

impl SessionValues {
    fn returned(&mut self, relid: u32, value: i64) {
        self.by_sequence.insert(relid, value);
        self.last_sequence = Some(relid);
    }
}

/// DISCARD SEQUENCES and DISCARD ALL forget them, as they do for currval().
pub fn discard_session_values() {
    if let Ok(mut values) = SESSION.0.try_borrow_mut() {
        *values = None;
    }
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
    check_privileges(rel, relid, pg_sys::ACL_SELECT | pg_sys::ACL_USAGE, false);
    let name = page::relation_name(rel);
    close_relation(rel);
    SESSION
        .with(|s| s.by_sequence.get(&relid.to_u32()).copied())
        .unwrap_or_else(|| not_yet_defined(format!("cached_currval of sequence \"{name}\" is not yet defined in this session")))
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
    let last = SESSION.with(|s| s.last_sequence.map(|relid| (relid, s.by_sequence[&relid])));
    let Some((relid, value)) = last else {
        not_yet_defined("cached_lastval is not yet defined in this session".into())
    };
    // As lastval(): the sequence may have been dropped since.
    let relid = pg_sys::Oid::from(relid);
    // SAFETY: try_relation_open returns NULL for a dropped relation.
    let rel = unsafe { pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as i32) };
    if rel.is_null() {
        not_yet_defined("cached_lastval is not yet defined in this session".into());
    }
    check_privileges(rel, relid, pg_sys::ACL_SELECT | pg_sys::ACL_USAGE, false);
    close_relation(rel);
    value
}

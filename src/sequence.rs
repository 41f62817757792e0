//! cached_nextval(): sequences that never go backwards after a crash.
//!
//! One cache of CACHE values per sequence, shared by every session, in
//! shared memory. When the cache is empty the next call writes a recovery
//! value (the end of the new block) into the sequence, WAL-logged through
//! PostgreSQL's own setval(), and flushes that WAL before handing out any
//! value of the block, whatever the commit policy. After a crash the
//! sequence restarts after the block end, so no value is handed out twice.
//!
//! Each call checks the sequence's current state (its pg_sequence options
//! and the on-disk tuple): after nextval(), setval(), ALTER SEQUENCE or a
//! rolled-back change the tuple no longer holds this cache's block end, and
//! the cache is refilled from what is on disk instead of handing out stale
//! values.

use crate::stats::{self, Counter};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};

pub static MAX_SEQUENCES: pgrx::GucSetting<i32> = pgrx::GucSetting::<i32>::new(1024);
const TRANCHE: &CStr = c"delayed_durability_sequences";

/// pg_sequence's row (catalog/pg_sequence.h).
#[repr(C)]
struct FormPgSequence {
    seqrelid: pg_sys::Oid,
    seqtypid: pg_sys::Oid,
    seqstart: i64,
    seqincrement: i64,
    seqmax: i64,
    seqmin: i64,
    seqcache: i64,
    seqcycle: bool,
}

/// The sequence relation's single tuple (commands/sequence.h).
#[repr(C)]
struct FormPgSequenceData {
    last_value: i64,
    log_cnt: i64,
    is_called: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Options {
    increment: i64,
    min: i64,
    max: i64,
    cache: i64,
    cycle: bool,
}

/// One shared cache slot. `key` is read without a lock to find the slot;
/// everything else is only touched under the slot's LWLock.
#[repr(C)]
struct Slot {
    key: AtomicU64,
    valid: bool,
    exhausted: bool,
    next: i64,
    block_end: i64,
    options: Options,
}

#[derive(Clone, Copy)]
struct Shared {
    slots: *mut Slot,
    locks: *mut pg_sys::LWLockPadded,
    count: usize,
}
struct SharedCell(std::cell::Cell<Option<Shared>>);
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for SharedCell {}
static SHARED: SharedCell = SharedCell(std::cell::Cell::new(None));

pub fn define_gucs() {
    pgrx::GucRegistry::define_int_guc(
        c"delayed_durability.max_sequences",
        c"How many sequences cached_nextval() can cache at once.",
        c"Each slot holds one sequence's shared cache. Slots of dropped sequences are reused.",
        &MAX_SEQUENCES,
        16,
        1_000_000,
        pgrx::GucContext::Postmaster,
        pgrx::GucFlags::default(),
    );
}

fn slot_count() -> usize {
    MAX_SEQUENCES.get() as usize
}

/// Space for the slots and one lock per slot plus one to claim slots
/// (called from the shared-memory request hook, shmem.rs).
pub fn request_shared_memory() {
    // SAFETY: called while add-ins may request resources.
    unsafe {
        pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Slot>() * slot_count());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), slot_count() as i32 + 1);
    }
}

pub fn attach_shared_memory() {
    let size = std::mem::size_of::<Slot>() * slot_count();
    let slots = crate::shmem::init_struct(c"delayed_durability sequence caches", size) as *mut Slot;
    // SAFETY: the tranche was requested in request_shared_memory().
    let locks = unsafe { pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()) };
    SHARED.0.set(Some(Shared {
        slots,
        locks,
        count: slot_count(),
    }));
}

fn shared() -> Shared {
    match SHARED.0.get() {
        Some(s) => s,
        None => {
            crate::preload::require_preloaded();
            unreachable!("shared memory is set up whenever the library is preloaded")
        }
    }
}

struct LockGuard(*mut pg_sys::LWLock);
impl LockGuard {
    fn exclusive(lock: *mut pg_sys::LWLock) -> Self {
        // SAFETY: a valid LWLock from our named tranche; an error while it is
        // held releases it through LWLockReleaseAll in transaction abort.
        unsafe { pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        LockGuard(lock)
    }
}
impl Drop for LockGuard {
    fn drop(&mut self) {
        // SAFETY: acquired in exclusive(); a PostgreSQL error raised while it
        // is held reaches us as a Rust panic, which runs this before the
        // error is re-thrown, so it is released exactly once.
        unsafe { pg_sys::LWLockRelease(self.0) };
    }
}

fn slot_lock(s: &Shared, i: usize) -> *mut pg_sys::LWLock {
    // SAFETY: the tranche has count + 1 locks; index count is the claim lock.
    unsafe { &raw mut (*s.locks.add(i)).lock }
}

fn slot(s: &Shared, i: usize) -> &'static mut Slot {
    // SAFETY: i < count; fields other than `key` are only used under the lock.
    unsafe { &mut *s.slots.add(i) }
}

fn relation_exists(relid: u32) -> bool {
    // SAFETY: a syscache probe by OID.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// Finds or claims the slot of (database, sequence). Slots are never
/// emptied; when all are taken, the slot of a sequence of this database that
/// no longer exists is reused (under its own lock, so nobody is using it).
fn find_slot(s: &Shared, key: u64) -> usize {
    let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize % s.count;
    for probe in 0..s.count {
        let i = (start + probe) % s.count;
        match slot(s, i).key.load(Ordering::Acquire) {
            k if k == key => return i,
            0 => break,
            _ => {}
        }
    }
    let _claim = LockGuard::exclusive(slot_lock(s, s.count));
    let my_db = key >> 32;
    let mut reusable = None;
    for probe in 0..s.count {
        let i = (start + probe) % s.count;
        let k = slot(s, i).key.load(Ordering::Acquire);
        if k == key {
            return i;
        }
        if k == 0 {
            slot(s, i).valid = false;
            slot(s, i).key.store(key, Ordering::Release);
            return i;
        }
        if reusable.is_none() && k >> 32 == my_db && !relation_exists(k as u32) {
            reusable = Some(i);
        }
    }
    if let Some(i) = reusable {
        let _slot_lock = LockGuard::exclusive(slot_lock(s, i));
        slot(s, i).valid = false;
        slot(s, i).key.store(key, Ordering::Release);
        return i;
    }
    pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!("all {} cached_nextval() sequence slots are in use", s.count),
        "",
    )
    .set_hint("Raise \"delayed_durability.max_sequences\" and restart the server.")
    .report(PgLogLevel::ERROR);
    unreachable!()
}

/// Sequence options already read in this backend, forgotten whenever any
/// pg_sequence row is invalidated (ALTER SEQUENCE, DROP, rolled-back DDL).
struct OptionsCache(std::cell::RefCell<Option<std::collections::HashMap<u32, Options>>>);
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for OptionsCache {}
static OPTIONS_CACHE: OptionsCache = OptionsCache(std::cell::RefCell::new(None));

#[pg_guard]
unsafe extern "C-unwind" fn forget_sequence_options(
    _arg: pg_sys::Datum,
    _cache_id: i32,
    _hash: u32,
) {
    if let Ok(mut cache) = OPTIONS_CACHE.0.try_borrow_mut() {
        if let Some(map) = cache.as_mut() {
            map.clear();
        }
    }
}

/// Registered in the postmaster; backends inherit the callback.
pub fn register_invalidation_callback() {
    // SAFETY: documented syscache callback API, called once from _PG_init.
    unsafe {
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::SEQRELID as i32,
            Some(forget_sequence_options),
            pg_sys::Datum::from(0),
        );
    }
}

fn sequence_options(relid: pg_sys::Oid) -> Options {
    if let Some(options) = OPTIONS_CACHE
        .0
        .borrow()
        .as_ref()
        .and_then(|m| m.get(&relid.to_u32()).copied())
    {
        return options;
    }
    let options = read_sequence_options(relid);
    OPTIONS_CACHE
        .0
        .borrow_mut()
        .get_or_insert_with(Default::default)
        .insert(relid.to_u32(), options);
    options
}

fn read_sequence_options(relid: pg_sys::Oid) -> Options {
    // SAFETY: syscache lookup of pg_sequence by the sequence's OID; the tuple
    // is released before returning.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::SEQRELID as i32,
            pg_sys::Datum::from(relid),
        );
        if tuple.is_null() {
            error!("cache lookup failed for sequence {}", relid.to_u32());
        }
        let form = &*pg_sys::heap_tuple_get_struct::<FormPgSequence>(tuple);
        let options = Options {
            increment: form.seqincrement,
            min: form.seqmin,
            max: form.seqmax,
            cache: form.seqcache.max(1),
            cycle: form.seqcycle,
        };
        pg_sys::ReleaseSysCache(tuple);
        options
    }
}

/// (last_value, is_called) as stored in the sequence relation.
fn read_sequence_tuple(rel: pg_sys::Relation) -> (i64, bool) {
    // SAFETY: block 0 of a sequence holds exactly one tuple at offset 1
    // (PostgreSQL's read_seq_tuple); it is read under a share lock.
    unsafe {
        let buf = pg_sys::ReadBuffer(rel, 0);
        pg_sys::LockBuffer(buf, pg_sys::BUFFER_LOCK_SHARE as i32);
        let page = pg_sys::BufferGetPage(buf);
        let item = pg_sys::PageGetItemId(page, pg_sys::FirstOffsetNumber as u16);
        let header = pg_sys::PageGetItem(page, item) as pg_sys::HeapTupleHeader;
        let data =
            &*((header as *const u8).add((*header).t_hoff as usize) as *const FormPgSequenceData);
        let result = (data.last_value, data.is_called);
        pg_sys::UnlockReleaseBuffer(buf);
        result
    }
}

fn relation_name(rel: pg_sys::Relation) -> String {
    // SAFETY: rd_rel is valid while the relation is open.
    unsafe {
        CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

fn limit_error(rel: pg_sys::Relation, maximum: bool, value: i64) -> ! {
    pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED,
        format!(
            "cached_nextval: reached {} value of sequence \"{}\" ({})",
            if maximum { "maximum" } else { "minimum" },
            relation_name(rel),
            value
        ),
        "",
    )
    .report(PgLogLevel::ERROR);
    unreachable!()
}

/// The first value after the on-disk state, as nextval would compute it.
fn first_value_after(rel: pg_sys::Relation, o: &Options, last_value: i64, is_called: bool) -> i64 {
    if !is_called {
        return last_value;
    }
    let next = last_value as i128 + o.increment as i128;
    if o.increment > 0 && next > o.max as i128 {
        if !o.cycle {
            limit_error(rel, true, o.max);
        }
        o.min
    } else if o.increment < 0 && next < o.min as i128 {
        if !o.cycle {
            limit_error(rel, false, o.min);
        }
        o.max
    } else {
        next as i64
    }
}

/// The last value of a block of `cache` values starting at `first`,
/// stopping at the sequence's limit (the next refill cycles or errors).
fn block_end(o: &Options, first: i64) -> i64 {
    let end = first as i128 + o.increment as i128 * (o.cache as i128 - 1);
    let end = if o.increment > 0 {
        end.min(o.max as i128)
    } else {
        end.max(o.min as i128)
    };
    // Stay on the increment's grid when the limit clipped the block.
    let steps = (end - first as i128) / o.increment as i128;
    (first as i128 + steps * o.increment as i128) as i64
}

/// Writes `value` as the sequence's recovery value with PostgreSQL's setval()
/// (WAL-logged for permanent sequences), as the sequence owner: the caller
/// may hold only USAGE, which nextval accepts but setval does not.
fn write_recovery_value(rel: pg_sys::Relation, relid: pg_sys::Oid, value: i64) {
    // SAFETY: the user switch is the one SECURITY DEFINER functions make;
    // transaction abort restores it if setval raises an error.
    unsafe {
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context = 0;
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            (*(*rel).rd_rel).relowner,
            saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
        pgrx::direct_function_call::<i64>(
            pg_sys::setval3_oid,
            &[relid.into_datum(), value.into_datum(), true.into_datum()],
        );
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
    }
}

fn check_privileges(rel: pg_sys::Relation, relid: pg_sys::Oid) {
    // SAFETY: reads the open relation and checks the ACL like nextval does.
    unsafe {
        if (*(*rel).rd_rel).relkind as u8 != pg_sys::RELKIND_SEQUENCE {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("\"{}\" is not a sequence", relation_name(rel)),
                "",
            )
            .report(PgLogLevel::ERROR);
        }
        let allowed = pg_sys::pg_class_aclcheck(
            relid,
            pg_sys::GetUserId(),
            (pg_sys::ACL_USAGE | pg_sys::ACL_UPDATE) as _,
        );
        if allowed != pg_sys::AclResult::ACLCHECK_OK {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for sequence {}", relation_name(rel)),
                "",
            )
            .report(PgLogLevel::ERROR);
        }
        if pg_sys::XactReadOnly
            && (*(*rel).rd_rel).relpersistence as u8 != pg_sys::RELPERSISTENCE_TEMP
        {
            pg_sys::PreventCommandIfReadOnly(c"cached_nextval()".as_ptr());
        }
        pg_sys::PreventCommandIfParallelMode(c"cached_nextval()".as_ptr());
    }
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
    // SAFETY: opens the relation with the lock nextval takes; closed below,
    // the lock is kept until transaction end as usual.
    let rel = unsafe { pg_sys::relation_open(relid, pg_sys::RowExclusiveLock as i32) };
    check_privileges(rel, relid);
    let options = sequence_options(relid);
    // SAFETY: MyDatabaseId is set in a connected backend.
    let key = (unsafe { pg_sys::MyDatabaseId }.to_u32() as u64) << 32 | relid.to_u32() as u64;
    let s = shared();
    let index = find_slot(&s, key);
    let slot_guard = LockGuard::exclusive(slot_lock(&s, index));
    let slot = slot(&s, index);
    debug_assert_eq!(slot.key.load(Ordering::Acquire), key);

    let (last_value, is_called) = read_sequence_tuple(rel);
    let cache_usable = slot.valid
        && !slot.exhausted
        && slot.options == options
        && is_called
        && last_value == slot.block_end;
    if !cache_usable {
        let first = first_value_after(rel, &options, last_value, is_called);
        let end = block_end(&options, first);
        write_recovery_value(rel, relid, end);
        stats::count(Counter::SequenceRecoveryWrites);
        // SAFETY: reads the open relation's persistence.
        let permanent =
            unsafe { (*(*rel).rd_rel).relpersistence as u8 == pg_sys::RELPERSISTENCE_PERMANENT };
        if permanent {
            // SAFETY: XactLastRecEnd is the end of the record setval() just
            // inserted; flushing it makes the recovery value durable.
            unsafe { pg_sys::XLogFlush(pg_sys::XactLastRecEnd) };
            stats::count(Counter::SequenceFlushes);
        }
        slot.options = options;
        slot.next = first;
        slot.block_end = end;
        slot.exhausted = false;
        slot.valid = true;
    }
    let value = slot.next;
    if value == slot.block_end {
        slot.exhausted = true;
    } else {
        slot.next = value + options.increment;
    }
    drop(slot_guard);
    stats::count(Counter::SequenceValues);
    // SAFETY: closes without releasing the lock, as nextval does.
    unsafe { pg_sys::relation_close(rel, pg_sys::NoLock as i32) };
    value
}

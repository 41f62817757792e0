//! The shared caches of cached_nextval(): one slot per sequence in shared
//! memory, each with its own LWLock, found by an open-addressing hash on
//! (database, sequence OID).

use super::page::{Options, SequencePage};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};

pub static MAX_SEQUENCES: pgrx::GucSetting<i32> = pgrx::GucSetting::<i32>::new(1024);
const TRANCHE: &CStr = c"delayed_durability_sequences";

/// One shared cache. `key` is read without a lock to find the slot and
/// checked again under the slot's lock; everything else is only touched
/// under that lock.
#[repr(C)]
pub struct Slot {
    key: AtomicU64,
    pub valid: bool,
    pub exhausted: bool,
    pub next: i64,
    pub block_end: i64,
    pub options: Options,
    /// The sequence page as the claim of this block left it. Any other
    /// write to the sequence (nextval, setval, ALTER, a rolled-back new
    /// file) changes one of its fields: the block is then given up.
    pub page: SequencePage,
    /// The end of the claim's WAL record, until a synchronous standby has
    /// confirmed it (0 then, or when there is nothing to confirm): no value
    /// of the block is handed out before.
    pub confirm_lsn: u64,
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

pub fn define_guc() {
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

/// Space for the slots and one lock per slot plus one to claim slots.
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
    SHARED.0.set(Some(Shared { slots, locks, count: slot_count() }));
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

fn lock_of(s: &Shared, i: usize) -> *mut pg_sys::LWLock {
    // SAFETY: the tranche has count + 1 locks; index count is the claim lock.
    unsafe { &raw mut (*s.locks.add(i)).lock }
}

fn slot_at(s: &Shared, i: usize) -> &'static mut Slot {
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

/// A slot locked for one sequence; the lock is released when dropped.
pub struct LockedSlot {
    _guard: LockGuard,
    pub slot: &'static mut Slot,
}

/// Finds (or claims) the slot of (database, sequence) and locks it. The key
/// is checked again under the slot's lock: a slot found without the lock
/// may have been given to another sequence in between, and is looked up
/// again then.
pub fn lock(key: u64) -> LockedSlot {
    let s = shared();
    loop {
        let i = find(&s, key);
        let guard = LockGuard::exclusive(lock_of(&s, i));
        let slot = slot_at(&s, i);
        if slot.key.load(Ordering::Acquire) == key {
            return LockedSlot { _guard: guard, slot };
        }
    }
}

/// Slots are never emptied; when all are taken, the slot of a sequence of
/// this database that no longer exists is reused (under its own lock, so
/// nobody is using it). A sequence that exists only in another session's
/// uncommitted transaction looks dropped from here and may lose its slot:
/// that session then claims another one and refills it, which is safe.
fn find(s: &Shared, key: u64) -> usize {
    let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) as usize % s.count;
    for probe in 0..s.count {
        let i = (start + probe) % s.count;
        match slot_at(s, i).key.load(Ordering::Acquire) {
            k if k == key => return i,
            0 => break,
            _ => {}
        }
    }
    let _claim = LockGuard::exclusive(lock_of(s, s.count));
    let my_db = key >> 32;
    let mut reusable = None;
    for probe in 0..s.count {
        let i = (start + probe) % s.count;
        let k = slot_at(s, i).key.load(Ordering::Acquire);
        if k == key {
            return i;
        }
        if k == 0 {
            slot_at(s, i).valid = false;
            slot_at(s, i).key.store(key, Ordering::Release);
            return i;
        }
        if reusable.is_none() && k >> 32 == my_db && !relation_exists(k as u32) {
            reusable = Some(i);
        }
    }
    if let Some(i) = reusable {
        let _slot_lock = LockGuard::exclusive(lock_of(s, i));
        slot_at(s, i).valid = false;
        slot_at(s, i).key.store(key, Ordering::Release);
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

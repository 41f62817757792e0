//! The shared caches of cached_nextval(): one slot per sequence in shared
//! memory, each with its own LWLock, found by an open-addressing hash on
//! (database, sequence OID).
//!
//! Values are taken without the lock while the block lasts: one atomic
//! fetch-add on `taken`, validated by the slot's generation, which is odd
//! while a holder of the lock rewrites the block (a seqlock). Claims,
//! confirmations and slot reuse take the lock.

use super::page::{Options, SequencePage};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;
use std::sync::atomic::{fence, AtomicU64, Ordering};

pub static MAX_SEQUENCES: pgrx::GucSetting<i32> = pgrx::GucSetting::<i32>::new(1024);
const TRANCHE: &CStr = c"delayed_durability_sequences";

/// One shared cache. `key` is read without a lock to find the slot and
/// checked again under the slot's lock. The other fields are written only
/// under that lock, between `begin_write` and `end_write`; `take_fast`
/// reads them without it and keeps what it read only if the generation did
/// not change meanwhile (dd_sequence_fast_take).
#[repr(C)]
pub struct Slot {
    key: AtomicU64,
    /// Even while the block is stable, odd while it is being rewritten.
    generation: AtomicU64,
    /// Values of the block handed out (or skipped) so far; at or past
    /// `size` the block is exhausted.
    taken: AtomicU64,
    pub valid: bool,
    /// The block: `size` values from `first`, `options.increment` apart.
    pub first: i64,
    pub size: u64,
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

impl Slot {
    /// Starts a rewrite of the block (under the slot's lock): concurrent
    /// lock-free takers discard what they read.
    pub fn begin_write(&mut self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        // The odd generation is visible before any field written after it
        // (a seqlock writer): a taker that reads a new field then sees the
        // generation changed. A locked add already orders this on x86; weaker
        // memory models need the fence.
        fence(Ordering::Release);
    }

    pub fn end_write(&mut self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// A new block; the slot's lock is held and begin_write() was called.
    /// With `reserve_first`, its first value is taken for the caller before
    /// any lock-free taker can see the block (a claimer is never starved by
    /// them).
    pub fn set_block(&mut self, first: i64, size: u64, reserve_first: bool) -> Option<i64> {
        self.first = first;
        self.size = size;
        self.taken.store(reserve_first as u64, Ordering::Release);
        reserve_first.then_some(first)
    }

    /// Whether values remain (under the slot's lock; lock-free takers may
    /// still exhaust the block before take()).
    pub fn has_values(&self) -> bool {
        self.valid && self.taken.load(Ordering::Acquire) < self.size
    }

    /// The next value of the block, under the slot's lock, or None when
    /// lock-free takers exhausted it.
    pub fn take(&self) -> Option<i64> {
        let n = self.taken.fetch_add(1, Ordering::AcqRel);
        (self.valid && n < self.size).then(|| self.value_at(n))
    }

    fn value_at(&self, n: u64) -> i64 {
        // In the block, so no overflow: first + (size - 1) * increment is
        // the block's end, within the sequence's bounds.
        self.first.wrapping_add((n as i64).wrapping_mul(self.options.increment))
    }
}

/// The slot fields dd_sequence_fast_take() compares, read as one snapshot.
#[derive(Clone, Copy)]
struct Snapshot {
    key: u64,
    valid: bool,
    options: Options,
    page: SequencePage,
    confirm_lsn: u64,
}

/// cached_nextval()'s fast path (src/c/sequence_call.c): the next value of
/// the slot's block when the slot is still the sequence's, its block was
/// claimed with these options, the page is still the version the claim
/// left and nothing is left to confirm. Without the lock: false sends the
/// caller to the slow path, which decides under the lock. Raises nothing.
///
/// The comparison is skipped when the caller's page is the one it
/// validated at `*validated_generation` and the slot has not been
/// rewritten since (every rewrite changes the generation); the caller
/// resets that generation when it reads the options again.
#[no_mangle]
pub unsafe extern "C" fn dd_sequence_fast_take(
    slot_index: i32,
    key: u64,
    options: *const Options,
    now: *const SequencePage,
    page_as_validated: bool,
    validated_generation: *mut u64,
    value: *mut i64,
) -> bool {
    let Some(s) = SHARED.0.get() else { return false };
    if slot_index < 0 || slot_index as usize >= s.count {
        return false;
    }
    // SAFETY: index checked above; the slot lives as long as the server.
    let slot = unsafe { &*s.slots.add(slot_index as usize) };
    // SAFETY: the caller passes valid pointers to its own data.
    let (options, now, validated_generation) = unsafe { (&*options, &*now, &mut *validated_generation) };
    let generation = slot.generation.load(Ordering::Acquire);
    if generation & 1 == 1 {
        return false;
    }
    if !(page_as_validated && generation == *validated_generation) {
        *validated_generation = u64::MAX;
        // SAFETY: a seqlock read: a writer may be changing these fields
        // under the lock; what is read is used only if the generation is
        // unchanged after the fetch-add below (volatile: read once each).
        let snap = unsafe {
            Snapshot {
                key: slot.key.load(Ordering::Relaxed),
                valid: std::ptr::read_volatile(&slot.valid),
                options: std::ptr::read_volatile(&slot.options),
                page: std::ptr::read_volatile(&slot.page),
                confirm_lsn: std::ptr::read_volatile(&slot.confirm_lsn),
            }
        };
        if snap.key != key
            || !snap.valid
            || snap.confirm_lsn != 0
            // Claimed in the transaction that made the file: the slow path
            // claims anew once it is over (mod.rs).
            || snap.page.new_in_transaction
            || snap.options != *options
            || !now.is_called
            || !snap.page.same_version(now)
        {
            return false;
        }
    }
    // SAFETY: as above.
    let (first, size) = unsafe { (std::ptr::read_volatile(&slot.first), std::ptr::read_volatile(&slot.size)) };
    let n = slot.taken.fetch_add(1, Ordering::AcqRel);
    // Pairs with begin_write()'s fence: if anything read above was written
    // by a rewrite, the generation read below is that rewrite's or later.
    fence(Ordering::Acquire);
    // A value counted in a block rewritten meanwhile is skipped (a gap, as
    // any sequence may have), never handed out twice.
    if slot.generation.load(Ordering::Relaxed) != generation || n >= size {
        return false;
    }
    *validated_generation = generation;
    // SAFETY: the caller's out parameter.
    unsafe { *value = first.wrapping_add((n as i64).wrapping_mul(options.increment)) };
    crate::stats::count_pending(crate::stats::Counter::SequenceValues);
    true
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
    /// The slot's index, which cached_nextval()'s fast path remembers.
    pub index: i32,
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
            return LockedSlot { _guard: guard, slot, index: i as i32 };
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
        let slot = slot_at(s, i);
        slot.begin_write();
        slot.valid = false;
        slot.key.store(key, Ordering::Release);
        slot.end_write();
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

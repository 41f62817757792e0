//! Cumulative per-database counters in shared memory.
//!
//! One slot per database (delayed_durability.max_databases of them),
//! claimed lock-free on first use and kept until the server restarts or the
//! database is dropped (like pg_stat_statements, the counters are not
//! written to disk). When every slot is taken, the slots of dropped
//! databases are freed before a new one is claimed. Each backend counts
//! into a slot of its own (indexed by its backend number, on a cache line
//! of its own) tagged with its database, so that concurrent commits never
//! contend on one counter; a read sums the database's slot and the backend
//! slots tagged with it. A backend number
//! reused for another database first moves the old counts into their
//! database's slot. The commit path takes no lock.

use pgrx::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Database slots (delayed_durability.max_databases): when every slot
/// belongs to an existing database, a further database is not counted.
pub static MAX_DATABASES: pgrx::GucSetting<i32> = pgrx::GucSetting::<i32>::new(1024);

pub fn define_guc() {
    pgrx::GucRegistry::define_int_guc(
        c"delayed_durability.max_databases",
        c"Databases whose counters are kept in delayed_durability_stats.",
        c"One slot of about 128 bytes each in shared memory; the slots of dropped databases are \
reused. Databases beyond this many at once are not counted.",
        &MAX_DATABASES,
        8,
        1 << 20,
        pgrx::GucContext::Postmaster,
        pgrx::GucFlags::default(),
    );
}

fn database_slot_count() -> usize {
    MAX_DATABASES.get().max(1) as usize
}

#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Counter {
    CommitsDurable,
    CommitsDelayed,
    DelayedRequestsIgnored,
    CommitsForcedDurable,
    FlushLogCalls,
    SequenceValues,
    SequenceRecoveryWrites,
    SequenceFlushes,
    CommitsBudgetFlushed,
    CommitsDurableByTable,
    CommitsDelayedByTable,
}
const COUNTERS: usize = Counter::CommitsDelayedByTable as usize + 1;

#[repr(C)]
struct DatabaseSlot {
    /// InvalidOid (0) while the slot is free.
    datid: AtomicU32,
    counters: [AtomicU64; COUNTERS],
    stats_reset: AtomicI64,
}

/// One backend's counts, on cache lines no other backend writes.
#[repr(C, align(128))]
struct BackendSlot {
    /// The database the counts belong to; InvalidOid (0) while none.
    datid: AtomicU32,
    counters: [AtomicU64; COUNTERS],
}

struct BackendLocal {
    /// The database slots and their number (max_databases).
    shared: Cell<*mut DatabaseSlot>,
    shared_count: Cell<usize>,
    /// The per-backend slots and their number (MaxBackends).
    backends: Cell<*mut BackendSlot>,
    backend_count: Cell<usize>,
    my_slot: Cell<Option<usize>>,
    /// This backend's own slot, bound to its database on first use.
    my_backend_slot: Cell<Option<&'static BackendSlot>>,
    /// Counts not yet added to the shared slot (see count_pending).
    pending: [Cell<u64>; COUNTERS],
    /// Some pending count is not zero: most transactions have none.
    any_pending: Cell<bool>,
    /// This backend found every slot taken and freed those of dropped
    /// databases once; it does not scan again.
    reclaim_tried: Cell<bool>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for BackendLocal {}
static LOCAL: BackendLocal = BackendLocal {
    shared: Cell::new(std::ptr::null_mut()),
    shared_count: Cell::new(0),
    backends: Cell::new(std::ptr::null_mut()),
    backend_count: Cell::new(0),
    my_slot: Cell::new(None),
    my_backend_slot: Cell::new(None),
    pending: [const { Cell::new(0) }; COUNTERS],
    any_pending: Cell::new(false),
    reclaim_tried: Cell::new(false),
};

fn max_backends() -> usize {
    // Before 15 shared memory is requested from _PG_init, before
    // MaxBackends is known: no per-backend slots there (every process
    // counts into its database's slot).
    if cfg!(any(feature = "pg13", feature = "pg14")) {
        return 0;
    }
    // SAFETY: set by the postmaster before the shared-memory request hook
    // (15 and later).
    unsafe { pg_sys::MaxBackends }.max(0) as usize
}

pub fn request_shared_memory() {
    let size = database_slot_count() * std::mem::size_of::<DatabaseSlot>()
        + max_backends() * std::mem::size_of::<BackendSlot>();
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(size) };
}

pub fn attach_shared_memory() {
    let count = database_slot_count();
    let ptr = crate::shmem::init_struct(c"delayed_durability statistics", count * std::mem::size_of::<DatabaseSlot>());
    LOCAL.shared.set(ptr as *mut DatabaseSlot);
    LOCAL.shared_count.set(count);
    let n = max_backends();
    let backends =
        crate::shmem::init_struct(c"delayed_durability statistics per backend", n * std::mem::size_of::<BackendSlot>());
    LOCAL.backends.set(backends as *mut BackendSlot);
    LOCAL.backend_count.set(n);
}

fn backend_slots() -> &'static [BackendSlot] {
    let ptr = LOCAL.backends.get();
    if ptr.is_null() {
        return &[];
    }
    // SAFETY: backend_count slots, zeroed at startup, valid for the
    // server's life; every field is atomic.
    unsafe { std::slice::from_raw_parts(ptr, LOCAL.backend_count.get()) }
}

/// This backend's index among the regular backends (0-based), if it has one.
fn backend_index() -> Option<usize> {
    // SAFETY: backend-local identifiers, set once the process has a PGPROC.
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
    let index = unsafe { pg_sys::MyBackendId } as i64 - 1;
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16")))]
    let index = unsafe { pg_sys::MyProcNumber } as i64;
    (index >= 0 && (index as usize) < LOCAL.backend_count.get()).then_some(index as usize)
}

/// This backend's slot, bound to its database: counts a previous owner of
/// the backend number left for another database move to that database's
/// slot first (taken out before they are added, so a concurrent read can
/// miss them for a moment but never counts them twice).
fn my_backend_slot() -> Option<&'static BackendSlot> {
    if let Some(slot) = LOCAL.my_backend_slot.get() {
        return Some(slot);
    }
    let db = my_slot()?;
    let datid = db.datid.load(Ordering::Relaxed);
    let slot = backend_slots().get(backend_index()?)?;
    let previous = slot.datid.load(Ordering::Acquire);
    if previous != datid {
        let owner = database_slots().iter().find(|d| previous != 0 && d.datid.load(Ordering::Acquire) == previous);
        for (i, counter) in slot.counters.iter().enumerate() {
            let n = counter.swap(0, Ordering::AcqRel);
            if let Some(owner) = owner {
                owner.counters[i].fetch_add(n, Ordering::Release);
            }
        }
        slot.datid.store(datid, Ordering::Release);
    }
    LOCAL.my_backend_slot.set(Some(slot));
    Some(slot)
}

/// A database's count: its slot and the backend slots tagged with it.
fn total(db: &DatabaseSlot, counter: Counter) -> u64 {
    let datid = db.datid.load(Ordering::Acquire);
    // Acquire: the backend slots are read after the database's count, so a
    // fold (backend slot emptied, then added here) is never counted twice.
    db.counters[counter as usize].load(Ordering::Acquire)
        + backend_slots()
            .iter()
            .filter(|b| b.datid.load(Ordering::Acquire) == datid)
            .map(|b| b.counters[counter as usize].load(Ordering::Relaxed))
            .sum::<u64>()
}

fn database_slots() -> &'static [DatabaseSlot] {
    let ptr = LOCAL.shared.get();
    if ptr.is_null() {
        return &[];
    }
    // SAFETY: shared_count slots, zeroed at startup, valid for the server's
    // life; every field is atomic.
    unsafe { std::slice::from_raw_parts(ptr, LOCAL.shared_count.get()) }
}

/// This backend's database slot, claimed on first use.
fn my_slot() -> Option<&'static DatabaseSlot> {
    let slots = database_slots();
    if let Some(i) = LOCAL.my_slot.get() {
        return Some(&slots[i]);
    }
    // SAFETY: MyDatabaseId is set once the backend is connected.
    let datid = unsafe { pg_sys::MyDatabaseId }.to_u32();
    if datid == 0 {
        return None;
    }
    // Every backend scans in the same order and claims the first free slot,
    // so two racing backends of one database settle on the same slot.
    for (i, slot) in slots.iter().enumerate() {
        let owner = match slot.datid.compare_exchange(0, datid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                slot.stats_reset.store(now(), Ordering::Relaxed);
                datid
            }
            Err(current) => current,
        };
        if owner == datid {
            LOCAL.my_slot.set(Some(i));
            return Some(slot);
        }
    }
    None
}

/// At pre-commit, while catalogs can still be read: makes sure this
/// backend has its database's slot before the commit callbacks count into
/// it, freeing the slots of dropped databases when every slot is taken.
pub fn bind_database_slot() {
    if LOCAL.my_slot.get().is_some() || my_slot().is_some() || LOCAL.reclaim_tried.replace(true) {
        return;
    }
    // SAFETY: MyDatabaseId is set once the backend is connected.
    if unsafe { pg_sys::MyDatabaseId } == pg_sys::InvalidOid {
        return;
    }
    free_slots_of_dropped_databases();
    let _ = my_slot();
}

fn free_slots_of_dropped_databases() {
    // What pg_database says now, not what this transaction's caches
    // remember: a database created since must not look dropped.
    // SAFETY: what a lock acquisition does, and dropping the catalog
    // snapshot so the next lookup takes a fresh one; pgrx guards the calls.
    unsafe {
        pg_sys::AcceptInvalidationMessages();
        pg_sys::InvalidateCatalogSnapshot();
    }
    for slot in database_slots() {
        let datid = slot.datid.load(Ordering::Acquire);
        if datid == 0 || database_exists(datid) {
            continue;
        }
        // Nobody counts into it any more: no backend is connected to a
        // dropped database. Zeroed before it is freed, so that its next
        // owner starts from nothing.
        for counter in &slot.counters {
            counter.store(0, Ordering::Relaxed);
        }
        let _ = slot.datid.compare_exchange(datid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

fn database_exists(datid: u32) -> bool {
    // SAFETY: a syscache probe of the shared catalog pg_database, inside a
    // transaction; pgrx guards the call.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::Oid::from(datid)),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// The current time as a PostgreSQL timestamp (microseconds).
pub(crate) fn now() -> i64 {
    // SAFETY: reads the clock; no PostgreSQL state involved, raises nothing.
    unsafe { crate::nothrow::GetCurrentTimestamp() }
}

/// Adds one to a counter of the current database. Never errors: it runs
/// after the commit record is written.
#[inline]
pub fn count(counter: Counter) {
    add(counter as usize, 1);
}

/// Into this backend's slot, or the database's slot for a process without
/// a backend number.
fn add(counter: usize, n: u64) {
    if let Some(slot) = my_backend_slot() {
        slot.counters[counter].fetch_add(n, Ordering::Relaxed);
    } else if let Some(slot) = my_slot() {
        slot.counters[counter].fetch_add(n, Ordering::Relaxed);
    }
}

/// Adds one to a counter in this backend only, for per-call paths where an
/// atomic add on a cache line shared by all backends would cost more than
/// the call (cached_nextval()); flush_pending() publishes it at the end of
/// the transaction, as PostgreSQL's own statistics do.
#[inline]
pub fn count_pending(counter: Counter) {
    let cell = &LOCAL.pending[counter as usize];
    cell.set(cell.get() + 1);
    LOCAL.any_pending.set(true);
}

/// Adds this backend's pending counts to its database's counters. Never
/// errors: it runs at transaction end.
pub fn flush_pending() {
    if !LOCAL.any_pending.replace(false) {
        return;
    }
    for (i, cell) in LOCAL.pending.iter().enumerate() {
        let n = cell.replace(0);
        if n != 0 {
            add(i, n);
        }
    }
}

/// One row per database that has counted anything; the view
/// `delayed_durability_stats` joins it with pg_database.
#[pg_extern(volatile, parallel_safe)]
fn delayed_durability_stats_per_database() -> TableIterator<
    'static,
    (
        name!(datid, pg_sys::Oid),
        name!(commits_durable, i64),
        name!(commits_delayed, i64),
        name!(delayed_requests_ignored, i64),
        name!(commits_forced_durable, i64),
        name!(flush_log_calls, i64),
        name!(sequence_values, i64),
        name!(sequence_recovery_writes, i64),
        name!(sequence_flushes, i64),
        name!(commits_budget_flushed, i64),
        name!(commits_durable_by_table, i64),
        name!(commits_delayed_by_table, i64),
        name!(stats_reset, Option<TimestampWithTimeZone>),
    ),
> {
    crate::preload::require_preloaded();
    flush_pending();
    let rows: Vec<_> = database_slots()
        .iter()
        .filter(|slot| slot.datid.load(Ordering::Acquire) != 0)
        .map(|slot| {
            let c = |k: Counter| total(slot, k) as i64;
            (
                pg_sys::Oid::from(slot.datid.load(Ordering::Relaxed)),
                c(Counter::CommitsDurable),
                c(Counter::CommitsDelayed),
                c(Counter::DelayedRequestsIgnored),
                c(Counter::CommitsForcedDurable),
                c(Counter::FlushLogCalls),
                c(Counter::SequenceValues),
                c(Counter::SequenceRecoveryWrites),
                c(Counter::SequenceFlushes),
                c(Counter::CommitsBudgetFlushed),
                c(Counter::CommitsDurableByTable),
                c(Counter::CommitsDelayedByTable),
                TimestampWithTimeZone::try_from(slot.stats_reset.load(Ordering::Relaxed)).ok(),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Zeroes every database's counters. Superuser-only by default: the
/// extension script revokes EXECUTE from PUBLIC.
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_stats_reset() {
    crate::preload::require_preloaded();
    // Backend slots first, then the databases' (a fold moves counts the
    // other way).
    for slot in backend_slots() {
        for counter in &slot.counters {
            counter.store(0, Ordering::Relaxed);
        }
    }
    let reset_at = now();
    for slot in database_slots().iter().filter(|slot| slot.datid.load(Ordering::Acquire) != 0) {
        for counter in &slot.counters {
            counter.store(0, Ordering::Relaxed);
        }
        slot.stats_reset.store(reset_at, Ordering::Relaxed);
    }
}

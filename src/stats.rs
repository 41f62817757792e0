//! Cumulative per-database counters in shared memory.
//!
//! One fixed slot per database, claimed lock-free on first use and kept until
//! the server restarts (like pg_stat_statements, the counters are not written
//! to disk). Increments are relaxed atomic adds: the commit path takes no lock.

use pgrx::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

/// Databases beyond this many get no row (documented in README).
const MAX_DATABASES: usize = 1024;

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
}
const COUNTERS: usize = Counter::CommitsBudgetFlushed as usize + 1;

#[repr(C)]
struct DatabaseSlot {
    /// InvalidOid (0) while the slot is free.
    datid: AtomicU32,
    counters: [AtomicU64; COUNTERS],
    stats_reset: AtomicI64,
}

#[repr(C)]
struct SharedStats {
    slots: [DatabaseSlot; MAX_DATABASES],
}

struct BackendLocal {
    shared: Cell<*mut SharedStats>,
    my_slot: Cell<Option<usize>>,
    /// Counts not yet added to the shared slot (see count_pending).
    pending: [Cell<u64>; COUNTERS],
    /// Some pending count is not zero: most transactions have none.
    any_pending: Cell<bool>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for BackendLocal {}
static LOCAL: BackendLocal = BackendLocal {
    shared: Cell::new(std::ptr::null_mut()),
    my_slot: Cell::new(None),
    pending: [const { Cell::new(0) }; COUNTERS],
    any_pending: Cell::new(false),
};

pub fn request_shared_memory() {
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<SharedStats>()) };
}

pub fn attach_shared_memory() {
    let ptr = crate::shmem::init_struct(
        c"delayed_durability statistics",
        std::mem::size_of::<SharedStats>(),
    );
    LOCAL.shared.set(ptr as *mut SharedStats);
}

fn shared() -> Option<&'static SharedStats> {
    let ptr = LOCAL.shared.get();
    // SAFETY: set once at shared memory startup, valid for the server's life.
    unsafe { ptr.as_ref() }
}

/// This backend's database slot, claimed on first use.
fn my_slot() -> Option<&'static DatabaseSlot> {
    let shared = shared()?;
    if let Some(i) = LOCAL.my_slot.get() {
        return Some(&shared.slots[i]);
    }
    // SAFETY: MyDatabaseId is set once the backend is connected.
    let datid = unsafe { pg_sys::MyDatabaseId }.to_u32();
    if datid == 0 {
        return None;
    }
    // Every backend scans in the same order and claims the first free slot,
    // so two racing backends of one database settle on the same slot.
    for (i, slot) in shared.slots.iter().enumerate() {
        let owner = match slot
            .datid
            .compare_exchange(0, datid, Ordering::AcqRel, Ordering::Acquire)
        {
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

/// The current time as a PostgreSQL timestamp (microseconds).
pub(crate) fn now() -> i64 {
    // SAFETY: reads the clock; no PostgreSQL state involved, raises nothing.
    unsafe { crate::nothrow::GetCurrentTimestamp() }
}

/// Adds one to a counter of the current database. Never errors: it runs
/// after the commit record is written.
#[inline]
pub fn count(counter: Counter) {
    if let Some(slot) = my_slot() {
        slot.counters[counter as usize].fetch_add(1, Ordering::Relaxed);
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
            if let Some(slot) = my_slot() {
                slot.counters[i].fetch_add(n, Ordering::Relaxed);
            }
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
        name!(stats_reset, Option<TimestampWithTimeZone>),
    ),
> {
    crate::preload::require_preloaded();
    flush_pending();
    let rows: Vec<_> = shared()
        .map(|s| {
            s.slots
                .iter()
                .filter(|slot| slot.datid.load(Ordering::Acquire) != 0)
                .map(|slot| {
                    let c = |k: Counter| slot.counters[k as usize].load(Ordering::Relaxed) as i64;
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
                        TimestampWithTimeZone::try_from(slot.stats_reset.load(Ordering::Relaxed))
                            .ok(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    TableIterator::new(rows)
}

/// Zeroes every database's counters. Superuser-only by default: the
/// extension script revokes EXECUTE from PUBLIC.
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_stats_reset() {
    crate::preload::require_preloaded();
    if let Some(s) = shared() {
        let reset_at = now();
        for slot in s
            .slots
            .iter()
            .filter(|slot| slot.datid.load(Ordering::Acquire) != 0)
        {
            for counter in &slot.counters {
                counter.store(0, Ordering::Relaxed);
            }
            slot.stats_reset.store(reset_at, Ordering::Relaxed);
        }
    }
}

//! The loss budget kept against a standby, to bound what a failover loses.
//!
//! With `delayed_durability.budget_standby_slot` naming a physical
//! replication slot, a delayed commit whose commit record ends more than
//! `max_loss_bytes` past the flush position that slot's standby confirmed,
//! or made when the oldest acknowledged delayed commit that standby has
//! not confirmed is `max_loss_time` old, flushes its WAL here (a WAL sender
//! sends only flushed WAL) and waits until the standby confirms its commit
//! record, before its client hears of it. Promoting that standby can then
//! lose only what a crash here can: at most `max_loss_bytes` of
//! acknowledged WAL, acknowledged within one `max_loss_time` window.
//!
//! The rule when the standby is not there: when the slot does not exist or
//! no WAL sender streams from it (at the commit or during the wait), the
//! commit does not wait: the budget holds against this server's own flush
//! position only, the commit is counted in `fallbacks`, and the change is
//! logged once. A cancel request ends a wait with a WARNING (the commit
//! stands), counted in `canceled`.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::{CStr, CString};
use super::ring::ScanPlace;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

pub static BUDGET_STANDBY_SLOT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

extern "C-unwind" {
    fn dd_slot_confirmed_flush(name: *const std::ffi::c_char, flush: *mut u64, active: *mut bool, sender_pid: *mut i32) -> bool;
    fn dd_wait_slot_flush(name: *const std::ffi::c_char, target: u64, wait_event_info: u32) -> i32;
}

pub fn define_guc() {
    GucRegistry::define_string_guc(
        c"delayed_durability.budget_standby_slot",
        c"Physical replication slot whose standby the loss budget is also kept against; empty = none.",
        c"A delayed commit ending more than max_loss_bytes past the flush position this slot's standby \
confirmed, or made when the oldest acknowledged commit that standby lacks is max_loss_time old, waits for \
the standby to confirm it. When nothing streams from the slot, commits do not wait (counted as fallbacks).",
        &BUDGET_STANDBY_SLOT,
        GucContext::Suset,
        GucFlags::default(),
    );
}

#[repr(C)]
struct Shared {
    waited: AtomicI64,
    fallbacks: AtomicI64,
    canceled: AtomicI64,
    /// The last SlotState logged (0: none yet).
    logged_state: AtomicU32,
    /// Where the time budget's scans of the record stand, per slot and WAL
    /// sender, shared so that each entry is visited about once.
    places: [Place; PLACES],
    places_lock: AtomicBool,
}

/// Slots with a place kept at once (sessions may name different slots).
const PLACES: usize = 4;

/// A ScanPlace for one slot, valid for one connection of its standby: a
/// new WAL sender (a reconnection, or a slot dropped and made again for
/// another standby, whose confirmed position may be older) starts over.
/// With more slots in use at once than PLACES, the least recently used
/// place starts over too: a scan of the whole record, and a wait if the
/// standby lacks even its oldest entry.
#[repr(C)]
struct Place {
    slot_key: AtomicU64,
    sender: AtomicI32,
    claim: AtomicU64,
    oldest: AtomicI64,
    unread_since: AtomicI64,
    end: AtomicU64,
    own_time: AtomicI64,
    last_used: AtomicU64,
}

impl Place {
    /// Read under the places' lock.
    fn load(&self) -> ScanPlace {
        ScanPlace {
            claim: self.claim.load(Ordering::Relaxed),
            oldest: self.oldest.load(Ordering::Relaxed),
            unread_since: self.unread_since.load(Ordering::Relaxed),
            end: self.end.load(Ordering::Relaxed),
            own_time: self.own_time.load(Ordering::Relaxed),
        }
    }
}

struct Local(std::cell::Cell<*const Shared>);
// SAFETY: each server process runs this code on one thread only.
unsafe impl Sync for Local {}
static SHARED: Local = Local(std::cell::Cell::new(std::ptr::null()));

pub fn request_shared_memory() {
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Shared>()) };
}

pub fn attach_shared_memory() {
    let ptr = crate::shmem::init_struct(c"delayed_durability standby budget", std::mem::size_of::<Shared>());
    SHARED.0.set(ptr as *const Shared);
}

fn shared() -> Option<&'static Shared> {
    // SAFETY: set at attach, zeroed shared memory of the right size.
    unsafe { SHARED.0.get().as_ref() }
}

/// Runs `f` holding the places' lock: a few loads and stores, nothing that
/// can raise an error or wait. A waiter spins briefly, then sleeps between
/// tries, as PostgreSQL's spinlocks do, so that a holder descheduled
/// meanwhile gets the CPU back (a killed holder takes shared memory with
/// it: the postmaster resets it).
fn with_places<R>(s: &Shared, f: impl FnOnce(&[Place; PLACES]) -> R) -> R {
    let mut tries = 0u32;
    while s.places_lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        tries += 1;
        if tries < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(u64::from(tries.min(1000))));
        }
    }
    let r = f(&s.places);
    s.places_lock.store(false, Ordering::Release);
    r
}

/// Answers `over_time` for the standby of `slot` streaming through WAL
/// sender `sender`, from the shared place of the last scan, and keeps where
/// this scan stopped.
fn over_time_from_place(slot: &CStr, sender: i32, confirmed: u64, over_time: &dyn Fn(u64, &mut ScanPlace) -> bool) -> bool {
    let Some(s) = shared() else {
        let mut place = ScanPlace::UNKNOWN;
        return over_time(confirmed, &mut place);
    };
    let key = super::fnv1a(slot.to_bytes()).max(1);
    let mine = |p: &Place| p.slot_key.load(Ordering::Relaxed) == key && p.sender.load(Ordering::Relaxed) == sender;
    let mut place = with_places(s, |places| {
        places.iter().find(|p| mine(p)).map_or(ScanPlace::UNKNOWN, |p| p.load())
    });
    let over = over_time(confirmed, &mut place);
    with_places(s, |places| {
        let tick = places.iter().map(|p| p.last_used.load(Ordering::Relaxed)).max().unwrap_or(0) + 1;
        let p = match places.iter().find(|p| mine(p)) {
            // Another process may have gone further meanwhile, or stopped
            // at the same entry carrying an older age.
            Some(p) if p.claim.load(Ordering::Relaxed) > place.claim => {
                p.last_used.store(tick, Ordering::Relaxed);
                return;
            }
            Some(p) if p.claim.load(Ordering::Relaxed) == place.claim => {
                place = place.merge(p.load());
                p
            }
            Some(p) => p,
            None => {
                let p = places.iter().min_by_key(|p| p.last_used.load(Ordering::Relaxed)).expect("PLACES > 0");
                p.slot_key.store(key, Ordering::Relaxed);
                p.sender.store(sender, Ordering::Relaxed);
                p
            }
        };
        p.claim.store(place.claim, Ordering::Relaxed);
        p.oldest.store(place.oldest, Ordering::Relaxed);
        p.unread_since.store(place.unread_since, Ordering::Relaxed);
        p.end.store(place.end, Ordering::Relaxed);
        p.own_time.store(place.own_time, Ordering::Relaxed);
        p.last_used.store(tick, Ordering::Relaxed);
    });
    over
}

/// The slot's confirmed flush position, whether something streams from it,
/// and the WAL sender using it (0: none); None when there is no physical
/// slot of that name.
fn confirmed(slot: &CStr) -> Option<(u64, bool, i32)> {
    let (mut flush, mut active, mut sender) = (0u64, false, 0i32);
    // SAFETY: reads slot state under PostgreSQL's slot lock and spinlock;
    // raises nothing.
    let found = unsafe { dd_slot_confirmed_flush(slot.as_ptr(), &mut flush, &mut active, &mut sender) };
    found.then_some((flush, active, sender))
}

#[derive(Clone, Copy, PartialEq)]
enum SlotState {
    Streaming = 1,
    NotStreaming = 2,
    Missing = 3,
}

fn note_state(slot: &CStr, state: SlotState) {
    let Some(s) = shared() else { return };
    if s.logged_state.swap(state as u32, Ordering::Relaxed) != state as u32 {
        let name = slot.to_string_lossy();
        match state {
            SlotState::Streaming => {
                pgrx::log!("delayed_durability: the loss budget is kept against the standby of replication slot \"{name}\"")
            }
            SlotState::NotStreaming => pgrx::log!(
                "delayed_durability: nothing streams from replication slot \"{name}\": the loss budget is kept against \
this server's flush position only until its standby is back"
            ),
            SlotState::Missing => pgrx::log!(
                "delayed_durability: there is no physical replication slot \"{name}\" (delayed_durability.budget_standby_slot): \
the loss budget is kept against this server's flush position only"
            ),
        }
    }
}

/// For a commit the policy delayed, after the local budget: keeps the byte
/// budget, and the time budget when `over_time` is given (whether the
/// oldest acknowledged commit past a position the slot's standby confirmed
/// is `max_loss_time` old), against the standby. Returns true when it
/// flushed and waited.
pub fn keep(commit_end: u64, max_bytes: u64, over_time: Option<&dyn Fn(u64, &mut ScanPlace) -> bool>) -> bool {
    if max_bytes == 0 && over_time.is_none() {
        return false;
    }
    let Some(slot) = crate::guc::read(&BUDGET_STANDBY_SLOT).filter(|s| !s.is_empty()) else {
        return false;
    };
    let count = |c: fn(&Shared) -> &AtomicI64| {
        if let Some(s) = shared() {
            c(s).fetch_add(1, Ordering::Relaxed);
        }
    };
    // Past a budget: bytes first (no scan of the record needed).
    let past_budget = |flush: u64, sender: i32| {
        commit_end > flush
            && ((max_bytes > 0 && commit_end - flush > max_bytes)
                || over_time.is_some_and(|f| over_time_from_place(&slot, sender, flush, f)))
    };
    match confirmed(&slot) {
        Some((flush, true, sender)) => {
            note_state(&slot, SlotState::Streaming);
            if !past_budget(flush, sender) {
                return false;
            }
        }
        Some((flush, false, sender)) => {
            note_state(&slot, SlotState::NotStreaming);
            if past_budget(flush, sender) {
                count(|s| &s.fallbacks);
            }
            return false;
        }
        None => {
            note_state(&slot, SlotState::Missing);
            count(|s| &s.fallbacks);
            return false;
        }
    }
    // A WAL sender sends only flushed WAL.
    let target = crate::flush::insert_end().max(commit_end);
    // SAFETY: as in flush_for_budget(): target was inserted.
    unsafe { pg_sys::XLogFlush(target) };
    // SAFETY: the wait reads shared state and sleeps on the latch; it
    // raises only WARNINGs (interrupts are held at commit), and any error
    // while reporting one (out of memory) crosses back through the guard.
    match unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| dd_wait_slot_flush(slot.as_ptr(), commit_end, pg_sys::PG_WAIT_EXTENSION))
    } {
        0 => count(|s| &s.waited),
        1 => {
            note_state(&slot, SlotState::NotStreaming);
            count(|s| &s.fallbacks);
        }
        _ => count(|s| &s.canceled),
    }
    true
}

/// The standby budget's state, under the view
/// `delayed_durability_standby_budget`: the slot, whether something streams
/// from it, the flush position its standby confirmed (a byte position), the
/// WAL inserted past it, and the commits that waited for it, fell back to
/// the local bound, or had their wait canceled since the server started.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
fn delayed_durability_standby_budget_state() -> TableIterator<
    'static,
    (
        name!(slot_name, Option<String>),
        name!(streaming, Option<bool>),
        name!(confirmed_flush, Option<i64>),
        name!(wal_bytes_past, Option<i64>),
        name!(commits_waited, i64),
        name!(commits_fallen_back, i64),
        name!(waits_canceled, i64),
    ),
> {
    crate::preload::require_preloaded();
    let slot = crate::guc::read(&BUDGET_STANDBY_SLOT).filter(|s| !s.is_empty());
    let state = slot.as_deref().and_then(confirmed).map(|(flush, active, _)| (flush, active));
    let (waited, fallbacks, canceled) = shared().map_or((0, 0, 0), |s| {
        (s.waited.load(Ordering::Relaxed), s.fallbacks.load(Ordering::Relaxed), s.canceled.load(Ordering::Relaxed))
    });
    let past = state.filter(|(f, _)| *f > 0).map(|(f, _)| crate::flush::insert_end().saturating_sub(f) as i64);
    TableIterator::once((
        slot.map(|s| s.to_string_lossy().into_owned()),
        state.map(|(_, active)| active),
        state.filter(|(f, _)| *f > 0).map(|(f, _)| f as i64),
        past,
        waited,
        fallbacks,
        canceled,
    ))
}

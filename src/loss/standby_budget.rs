//! The byte budget kept against a standby, to bound what a failover loses.
//!
//! With `delayed_durability.budget_standby_slot` naming a physical
//! replication slot, a delayed commit whose commit record ends more than
//! `max_loss_bytes` past the flush position that slot's standby confirmed
//! flushes its WAL here (a WAL sender sends only flushed WAL) and waits
//! until the standby confirms its commit record, before its client hears
//! of it. Promoting that standby can then lose at most `max_loss_bytes` of
//! acknowledged WAL, as a crash here can.
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
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

pub static BUDGET_STANDBY_SLOT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

extern "C-unwind" {
    fn dd_slot_confirmed_flush(name: *const std::ffi::c_char, flush: *mut u64, active: *mut bool) -> bool;
    fn dd_wait_slot_flush(name: *const std::ffi::c_char, target: u64, wait_event_info: u32) -> i32;
}

pub fn define_guc() {
    GucRegistry::define_string_guc(
        c"delayed_durability.budget_standby_slot",
        c"Physical replication slot whose standby the byte loss budget is also kept against; empty = none.",
        c"A delayed commit ending more than max_loss_bytes past the flush position this slot's standby \
confirmed waits for the standby to confirm it. When nothing streams from the slot, commits do not wait \
(counted as fallbacks).",
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

/// The slot's confirmed flush position and whether something streams from
/// it; None when there is no physical slot of that name.
fn confirmed(slot: &CStr) -> Option<(u64, bool)> {
    let (mut flush, mut active) = (0u64, false);
    // SAFETY: reads slot state under PostgreSQL's slot lock and spinlock;
    // raises nothing.
    let found = unsafe { dd_slot_confirmed_flush(slot.as_ptr(), &mut flush, &mut active) };
    found.then_some((flush, active))
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
/// budget against the standby. Returns true when it flushed and waited.
pub fn keep(commit_end: u64, max_bytes: u64) -> bool {
    if max_bytes == 0 {
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
    match confirmed(&slot) {
        Some((flush, true)) => {
            note_state(&slot, SlotState::Streaming);
            if commit_end.saturating_sub(flush) <= max_bytes {
                return false;
            }
        }
        Some((flush, false)) => {
            note_state(&slot, SlotState::NotStreaming);
            if commit_end.saturating_sub(flush) > max_bytes {
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
    let state = slot.as_deref().and_then(confirmed);
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

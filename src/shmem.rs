//! The extension's one pair of shared-memory hooks, chained to the previous
//! ones as contrib modules do, and a registry that knows nothing of the
//! capabilities: each one registers, from _PG_init, what it needs
//! (`request`) and how it finds its memory again in every process
//! (`attach`). The dependency is one-way: capabilities use this module,
//! never the other way round.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;
#[cfg(not(any(feature = "pg13", feature = "pg14")))]
static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;

/// A capability's shared memory: what to request, and how to attach.
#[derive(Clone, Copy)]
pub struct Region {
    pub request: fn(),
    pub attach: fn(),
}

const MAX_REGIONS: usize = 8;
struct Registry(std::cell::Cell<[Option<Region>; MAX_REGIONS]>);
// SAFETY: registered in the postmaster's _PG_init and only read afterwards,
// each process on its one thread.
unsafe impl Sync for Registry {}
static REGIONS: Registry = Registry(std::cell::Cell::new([None; MAX_REGIONS]));

/// Called from _PG_init, before install_hooks().
pub fn register(region: Region) {
    let mut regions = REGIONS.0.get();
    let free = regions.iter().position(Option::is_none).expect("more shared-memory regions than MAX_REGIONS");
    regions[free] = Some(region);
    REGIONS.0.set(regions);
}

fn request_all() {
    REGIONS.0.get().iter().flatten().for_each(|r| (r.request)());
}

fn attach_all() {
    REGIONS.0.get().iter().flatten().for_each(|r| (r.attach)());
}

/// Called from _PG_init in the postmaster.
pub fn install_hooks() {
    // SAFETY: _PG_init runs in the postmaster before any backend exists.
    unsafe {
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(shmem_request);
        }
        // Before PostgreSQL 15 add-ins request space directly in _PG_init.
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        request_all();
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    // SAFETY: called by the postmaster when add-ins may request space.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            prev();
        }
    }
    request_all();
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    // SAFETY: chained hook, called once per process that attaches.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            prev();
        }
    }
    attach_all();
}

/// Finds or creates a named shared memory area, zeroed when new (every
/// structure of the extension is valid when zeroed).
pub fn init_struct(name: &CStr, size: usize) -> *mut u8 {
    // SAFETY: the ShmemInitStruct protocol under AddinShmemInitLock
    // (MainLWLockArray[21], as lwlocknames.h defines it).
    unsafe {
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let ptr = pg_sys::ShmemInitStruct(name.as_ptr(), size, &mut found) as *mut u8;
        if !found {
            std::ptr::write_bytes(ptr, 0, size);
        }
        pg_sys::LWLockRelease(lock);
        ptr
    }
}

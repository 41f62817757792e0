//! Knowing whether the library was preloaded, and refusing to run otherwise.
//!
//! Without `shared_preload_libraries` there are no hooks and no shared
//! memory: a commit policy that silently does nothing is worse than an error.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

static PRELOADED: AtomicBool = AtomicBool::new(false);

pub fn mark_preloaded() {
    PRELOADED.store(true, Ordering::Relaxed);
}

/// The library was loaded through shared_preload_libraries.
pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// Raises an error with a hint when the library was loaded on demand (by a
/// function call) instead of through `shared_preload_libraries`.
pub fn require_preloaded() {
    if !PRELOADED.load(Ordering::Relaxed) {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "delayed_durability must be loaded via \"shared_preload_libraries\"",
            "",
        )
        .set_hint(
            "Add delayed_durability to the \"shared_preload_libraries\" setting \
             in postgresql.conf and restart the server.",
        )
        .report(PgLogLevel::ERROR);
    }
}

/// For the C entry point of cached_nextval() (src/c/sequence_call.c).
#[no_mangle]
pub extern "C" fn dd_library_preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

/// require_preloaded() for C callers.
#[no_mangle]
#[pg_guard]
pub extern "C-unwind" fn dd_require_preloaded() {
    require_preloaded();
}

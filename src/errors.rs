//! Errors reach the client as PostgreSQL reports them: never with a Rust
//! backtrace appended.

/// pgrx's panic hook captures `std::backtrace::Backtrace::capture()` for
/// every PostgreSQL error that passes through a Rust frame, and appends it
/// to the error's DETAIL when the server runs with RUST_BACKTRACE (or
/// RUST_LIB_BACKTRACE) set. The standard library reads those variables once
/// per process and caches the answer: read it once with capture disabled,
/// then put the environment back as it was, so that nothing else the server
/// runs (archive_command, other libraries) sees a change. Called from
/// _PG_init, before any other thread or backend exists.
pub fn disable_backtraces() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    std::env::set_var(VAR, "0");
    let _ = std::backtrace::Backtrace::capture();
    match saved {
        Some(value) => std::env::set_var(VAR, value),
        None => std::env::remove_var(VAR),
    }
}

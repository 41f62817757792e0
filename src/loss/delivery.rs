//! A rejoined old primary delivers its saved record to the new primary.
//!
//! A crashed primary's next start (the single-user crash recovery Patroni
//! and `pg_rewind` run first included) saves its record of acknowledged
//! delayed commits in `crash_record_directory` (saved_record.rs). When that
//! server comes back as a standby and streams, its report worker sends the
//! newest saved record to the server it streams from, over libpq
//! (`c/deliver_record.c`), with `delivery_conninfo` or else its own
//! `primary_conninfo` in database `postgres`, naming the timeline the
//! record was written on (from the saved file's name). There
//! `delayed_durability_receive_failover_record()` lists the commits the
//! failover from that timeline lost, as the import does, and the
//! failover's row becomes exact; the same record sent again is answered
//! with the same count. libpq runs asynchronously under the worker's latch:
//! a shutdown or a promotion gives the delivery up at once (the record is
//! kept for the next try), whatever the peer does. The saved file is then renamed
//! `.commits.delivered`, or `.commits.refused` when the new primary
//! refused it for good (a record of another system, older than the
//! failover, torn beyond use) or kept answering that no failover waits for
//! it (30 answers in a row: it was imported by hand, or the crash was not
//! followed by a failover). A primary's records of its own crashes are
//! never sent (saved_record::retire_undelivered).

use super::saved_record;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr, CString};

pub static DELIVERY_CONNINFO: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Seconds between two tries.
const RETRY_SECONDS: i64 = 10;
/// Answers "nothing waits for this record" taken before giving up.
const PATIENCE: u32 = 30;

pub fn define_guc() {
    GucRegistry::define_string_guc(
        c"delayed_durability.delivery_conninfo",
        c"Connection string a rejoined old primary uses to deliver its saved record to the new primary.",
        c"Empty = this standby's primary_conninfo, in database postgres. The role needs EXECUTE on \
delayed_durability_receive_failover_record() there.",
        &DELIVERY_CONNINFO,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

extern "C-unwind" {
    fn dd_deliver_record(
        conninfo: *const c_char,
        record: *const c_char,
        record_len: c_int,
        sender: *const c_char,
        old_timeline: i32,
        give_up: extern "C-unwind" fn() -> bool,
        lost: *mut i64,
        sqlstate: *mut c_char,
        message: *mut c_char,
        message_size: usize,
    ) -> c_int;
    fn dd_wal_receiver_streaming(end: *mut u64, tli: *mut u32) -> bool;
}

const DELIVERED: c_int = 0;
const NO_CONNECTION: c_int = 1;
const ABANDONED: c_int = 3;

thread_local! {
    /// SIGTERM arrived while a delivery waited (its flag is read once).
    static STOPPING: Cell<bool> = const { Cell::new(false) };
}

/// Asked by the delivery at least every second while it waits: it is given
/// up when the worker must stop, or when this server was promoted (the
/// failover must be noted without waiting for an old peer).
extern "C-unwind" fn delivery_should_give_up() -> bool {
    if pgrx::bgworkers::BackgroundWorker::sigterm_received() {
        STOPPING.set(true);
    }
    STOPPING.get() || !crate::flush::in_recovery()
}

/// Whether SIGTERM arrived during a delivery: the worker then exits.
pub fn stopping() -> bool {
    STOPPING.get()
}

thread_local! {
    /// When to try next (µs since the epoch, as stats::now()).
    static NEXT_TRY: Cell<i64> = const { Cell::new(0) };
    /// "Nothing waits for it" answers for the record being delivered.
    static WAITING_ANSWERS: Cell<u32> = const { Cell::new(0) };
    /// Which record those answers are about (a hash of its path).
    static RECORD: Cell<u64> = const { Cell::new(0) };
    /// The last failure said at LOG (the same one is not repeated every 10 s).
    static SAID: Cell<u64> = const { Cell::new(0) };
}

/// Largest record a bytea can carry.
const MAX_RECORD: usize = 0x3fff_ffff - 4;

/// Called every second by the report worker while this server is in
/// recovery: tries, at most every 10 s and only while the WAL receiver
/// streams, to deliver this node's newest saved record.
pub fn tick() {
    let now = crate::stats::now();
    if now < NEXT_TRY.get() {
        return;
    }
    NEXT_TRY.set(now + RETRY_SECONDS * 1_000_000);
    // SAFETY: reads the control data PostgreSQL keeps in shared memory.
    let system_id = unsafe { pg_sys::GetSystemIdentifier() };
    let Some(path) = saved_record::newest_undelivered(system_id) else { return };
    // The count of "nothing waits" answers is the record's own.
    let path_hash = super::fnv1a(path.as_os_str().as_encoded_bytes());
    if RECORD.replace(path_hash) != path_hash {
        WAITING_ANSWERS.set(0);
    }
    let (mut end, mut tli) = (0u64, 0u32);
    // SAFETY: reads the WAL receiver's shared state under its spinlock; raises nothing.
    if !unsafe { dd_wal_receiver_streaming(&mut end, &mut tli) } {
        return;
    }
    // The size first: a file not read whole before it is known to fit.
    let bytes = match std::fs::metadata(&path).map(|m| m.len()) {
        Ok(len) if len > MAX_RECORD as u64 => return give_up(&path, "the record is too large to send"),
        Ok(_) => match std::fs::read(&path) {
            Ok(b) if b.len() <= MAX_RECORD => b,
            Ok(_) => return give_up(&path, "the record is too large to send"),
            Err(e) => return say_once(format!("could not read \"{}\": {e}", path.display())),
        },
        Err(e) => return say_once(format!("could not read \"{}\": {e}", path.display())),
    };
    let conninfo = crate::guc::read(&DELIVERY_CONNINFO).filter(|c| !c.is_empty());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    // SAFETY: a plain read of a GUC variable set at start.
    let port = unsafe { pg_sys::PostPortNumber };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let sender = CString::new(format!("{} port {port} ({name})", host.trim())).unwrap_or_default();
    let (mut lost, mut sqlstate, mut message) = (-1i64, [0 as c_char; 6], vec![0 as c_char; 1024]);
    // SAFETY: every pointer is valid for the call and the lengths are the
    // buffers'; the function copies what it returns into them. libpq
    // reports errors by value; the latch wait can raise one (a failed
    // epoll call), made a Rust panic by the boundary.
    let outcome = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| dd_deliver_record(
            conninfo.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            bytes.as_ptr() as *const c_char,
            bytes.len() as c_int,
            sender.as_ptr(),
            saved_record::timeline_of(&path).map_or(0, |t| t as i32),
            delivery_should_give_up,
            &mut lost,
            sqlstate.as_mut_ptr(),
            message.as_mut_ptr(),
            message.len(),
        ))
    };
    // SAFETY: the function leaves both buffers NUL-terminated.
    let (sqlstate, message) = unsafe {
        (
            CStr::from_ptr(sqlstate.as_ptr()).to_string_lossy().into_owned(),
            CStr::from_ptr(message.as_ptr()).to_string_lossy().trim().to_string(),
        )
    };
    match outcome {
        // Tried again at the next tick, if the worker still runs.
        ABANDONED => {}
        DELIVERED => {
            WAITING_ANSWERS.set(0);
            SAID.set(0);
            match saved_record::mark(&path, saved_record::DELIVERED) {
                Ok(p) => pgrx::log!(
                    "delayed_durability: the record of the crashed run was delivered to the new primary, which lists \
{lost} acknowledged delayed commits as lost in the failover (\"{}\")",
                    p.display()
                ),
                Err(e) => pgrx::warning!(
                    "delayed_durability: the record of the crashed run was delivered, but \"{}\" could not be renamed: {e}",
                    path.display()
                ),
            }
        }
        NO_CONNECTION => {
            WAITING_ANSWERS.set(0);
            say_once(format!(
            "could not deliver the record of the crashed run \"{}\" to the new primary (trying again every \
{RETRY_SECONDS} s): {message}",
            path.display()
        ))
        }
        _ => match sqlstate.as_str() {
            // No failover waits (yet: the promotion is noted within
            // seconds; or it was imported). Other answers of this code
            // (the server is itself a standby, the library is not
            // preloaded there) are retried without counting.
            "55000" if message.starts_with("no failover on this server waits") => {
                let answers = WAITING_ANSWERS.get() + 1;
                WAITING_ANSWERS.set(answers);
                if answers >= PATIENCE {
                    WAITING_ANSWERS.set(0);
                    give_up(&path, &message);
                }
            }
            // The record itself: of another system, older than the
            // failover, holding nothing, torn.
            "22023" | "XX001" => give_up(&path, &message),
            // Privileges, the extension missing there: a DBA can fix it.
            _ => {
                WAITING_ANSWERS.set(0);
                say_once(format!(
                "the new primary refused the record of the crashed run \"{}\" (trying again every {RETRY_SECONDS} s): \
{message} (SQLSTATE {sqlstate})",
                    path.display()
                ))
            }
        },
    }
}

/// Says `text` at LOG unless it was the last thing said.
fn say_once(text: String) {
    let hash = super::fnv1a(text.as_bytes());
    if SAID.replace(hash) != hash {
        pgrx::log!("delayed_durability: {text}");
    }
}

fn give_up(path: &std::path::Path, why: &str) {
    SAID.set(0);
    let renamed = saved_record::mark(path, saved_record::REFUSED);
    pgrx::log!(
        "delayed_durability: the record of the crashed run \"{}\" is not delivered: {why}{}",
        path.display(),
        match renamed {
            Ok(p) => format!(" (kept as \"{}\"; import it by hand if a failover still waits for it)", p.display()),
            Err(e) => format!(" (and it could not be renamed: {e})"),
        }
    );
}

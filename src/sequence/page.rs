//! The sequence relation's page (through src/c/sequence_page.c), the
//! sequence's options and the arithmetic of blocks.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::ffi::CStr;

/// The sequence tuple and what identifies the page's current version
/// (mirrors DdSequencePage in src/c/sequence_page.c).
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct SequencePage {
    pub last_value: i64,
    pub log_cnt: i64,
    pub is_called: bool,
    /// Changes to the relation are WAL-logged.
    pub needs_wal: bool,
    /// The relation's file was created by this transaction: it survives
    /// only if the transaction commits.
    pub new_in_transaction: bool,
    pub page_lsn: u64,
    pub file_number: u32,
}

impl SequencePage {
    /// Whether nobody wrote the sequence between the two reads: every write
    /// changes the tuple, the page LSN (WAL-logged writes) or the file.
    /// Whether the file is new in the current transaction is no part of it:
    /// a block claimed in the transaction that created the file stays valid
    /// for other sessions once that transaction committed (its commit was
    /// made durable, see claim_block), and nobody else can use it before.
    pub fn same_version(&self, other: &SequencePage) -> bool {
        (self.file_number, self.page_lsn, self.last_value, self.log_cnt, self.is_called)
            == (other.file_number, other.page_lsn, other.last_value, other.log_cnt, other.is_called)
    }
}

// Called through pg_guard_ffi_boundary: an error raised in C becomes a Rust
// panic that unwinds this module's frames before PostgreSQL sees it again.
unsafe extern "C-unwind" {
    fn dd_sequence_read(rel: pg_sys::Relation, out: *mut SequencePage);
    fn dd_sequence_lock(rel: pg_sys::Relation, out: *mut SequencePage) -> pg_sys::Buffer;
    fn dd_sequence_write(
        rel: pg_sys::Relation,
        buf: pg_sys::Buffer,
        last_value: i64,
        log_cnt: i64,
        out: *mut SequencePage,
    ) -> u64;
}

/// The page as it is now.
pub fn read(rel: pg_sys::Relation) -> SequencePage {
    let mut page = SequencePage::default();
    // SAFETY: rel is an open sequence; the C function reads block 0 under a
    // share lock exactly as sequence.c does.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_sequence_read(rel, &mut page)) };
    page
}

/// The page's exclusive lock, held until `write` (or transaction abort).
pub struct LockedPage {
    rel: pg_sys::Relation,
    buf: pg_sys::Buffer,
    pub page: SequencePage,
}

pub fn lock(rel: pg_sys::Relation) -> LockedPage {
    let mut page = SequencePage::default();
    // SAFETY: as read(); the buffer stays pinned and locked until write().
    let buf = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_sequence_lock(rel, &mut page)) };
    LockedPage { rel, buf, page }
}

impl LockedPage {
    /// Stores `last_value` (is_called) and `log_cnt`, WAL-logged when the
    /// relation needs it, and releases the lock. Returns the end of the WAL
    /// record (0 when none was written) and the page as written.
    pub fn write(self, last_value: i64, log_cnt: i64) -> (u64, SequencePage) {
        let mut page = SequencePage::default();
        // SAFETY: the buffer was locked by lock() on the same relation.
        let end = unsafe {
            pg_sys::ffi::pg_guard_ffi_boundary(|| dd_sequence_write(self.rel, self.buf, last_value, log_cnt, &mut page))
        };
        (end, page)
    }
}

/// The sequence's options from pg_sequence, as read (and cached per
/// backend) by src/c/sequence_call.c (mirrors DdSequenceOptions there).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Options {
    pub increment: i64,
    pub min: i64,
    pub max: i64,
    pub cache: i64,
    pub cycle: bool,
}

pub fn relation_name(rel: pg_sys::Relation) -> String {
    // SAFETY: rd_rel is valid while the relation is open.
    unsafe { CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned() }
}

fn limit_error(rel: pg_sys::Relation, maximum: bool, value: i64) -> ! {
    pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED,
        format!(
            "cached_nextval: reached {} value of sequence \"{}\" ({})",
            if maximum { "maximum" } else { "minimum" },
            relation_name(rel),
            value
        ),
        "",
    )
    .report(PgLogLevel::ERROR);
    unreachable!()
}

/// The first value after the stored state, as nextval would compute it.
pub fn first_value_after(rel: pg_sys::Relation, o: &Options, last_value: i64, is_called: bool) -> i64 {
    if !is_called {
        return last_value;
    }
    let next = last_value as i128 + o.increment as i128;
    if o.increment > 0 && next > o.max as i128 {
        if !o.cycle {
            limit_error(rel, true, o.max);
        }
        o.min
    } else if o.increment < 0 && next < o.min as i128 {
        if !o.cycle {
            limit_error(rel, false, o.min);
        }
        o.max
    } else {
        next as i64
    }
}

/// The last value of a block of `size` values starting at `first`,
/// stopping at the sequence's limit (the next claim cycles or errors).
pub fn block_end(o: &Options, first: i64, size: i64) -> i64 {
    let end = first as i128 + o.increment as i128 * (size as i128 - 1);
    let end = if o.increment > 0 { end.min(o.max as i128) } else { end.max(o.min as i128) };
    // Stay on the increment's grid when the limit clipped the block.
    let steps = (end - first as i128) / o.increment as i128;
    (first as i128 + steps * o.increment as i128) as i64
}

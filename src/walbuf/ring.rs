//! What happens to a WAL write or a WAL fsync while the buffer is on.
//!
//! PostgreSQL holds WALWriteLock around every WAL write and WAL fsync
//! (XLogWrite), so this state needs no lock of its own: the interposers only
//! call in here with WALWriteLock held. The counters are atomics because the
//! status function reads them without it.
//!
//! Invariant: the buffer only holds WAL of the segment being written
//! (`current`). When PostgreSQL starts writing the next segment, the
//! previous one is complete: it is fsynced (a drain) before the first byte
//! of the next one enters the buffer. Only `current` can have bytes that are
//! neither fsynced in pg_wal nor in the buffer, and then `uncovered` is set
//! and its next fsync is real.
//!
//! PostgreSQL also fsyncs a segment the moment its last page is complete.
//! A write reaching the end of the segment does not say whether that page is
//! complete (the last page is rewritten as it fills), so that fsync is
//! skipped like any other; the drain on the first write of the next segment
//! takes its place.

use super::format::{self, HEADER_SIZE, OFF_SYNCED_LSN, OFF_SYNCED_TLI, OFF_TAIL};
use super::pmem::Mapping;
use super::segment::Segment;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = pgrx::pg_sys::XLOG_BLCKSZ as usize;

/// In PostgreSQL shared memory; valid when zeroed.
#[repr(C)]
pub struct Shared {
    pub enabled: bool,
    pub is_pmem: bool,
    has_current: bool,
    current: SegmentFields,
    /// End of the highest write to `current`.
    written_end: u64,
    /// What was last persisted for the last page written (`shadow_len`
    /// bytes from offset `shadow_start` of `current`). PostgreSQL writes
    /// whole pages and rewrites the last, partial one as it fills, while
    /// other backends may still be copying records into it: a WAL byte
    /// only ever changes from zero to its final value. Bytes equal to what
    /// was persisted for them need not be persisted again; from the first
    /// one that differs, everything is.
    shadow_start: u64,
    shadow_len: usize,
    shadow: [u8; PAGE],
    /// `current` has writes not yet fsynced to pg_wal.
    dirty: bool,
    /// Some of them are not in the buffer (a write too large for it).
    uncovered: bool,
    pub bytes_persisted: AtomicU64,
    pub fsyncs_avoided: AtomicU64,
    pub drains: AtomicU64,
    pub restored_bytes: AtomicU64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentFields {
    tli: u32,
    segno: u64,
}

impl Shared {
    fn current(&self) -> Option<Segment> {
        self.has_current.then_some(Segment { tli: self.current.tli, segno: self.current.segno })
    }

    fn set_current(&mut self, seg: Segment) {
        self.has_current = true;
        self.current = SegmentFields { tli: seg.tli, segno: seg.segno };
        self.written_end = 0;
        self.shadow_len = 0;
        self.dirty = false;
        self.uncovered = false;
    }
}

/// errno of a failed fsync or persist, handed back to PostgreSQL, which
/// PANICs as it would on a failed WAL write or fsync.
pub type Errno = i32;

pub struct Ring<'a> {
    pub shared: &'a mut Shared,
    pub map: Mapping,
    pub segment_size: u64,
}

pub enum SyncDecision {
    /// The buffer holds every byte written since the last real fsync.
    Skip,
    /// Really fsync; `drains` = the fsync empties the buffer.
    Real { drains: bool },
}

impl Ring<'_> {
    fn capacity(&self) -> usize {
        self.map.len - HEADER_SIZE
    }

    /// Drain when the buffer is about three quarters full.
    fn drain_limit(&self) -> usize {
        self.capacity() / 4 * 3
    }

    pub fn tail(&self) -> usize {
        format::get_u64(self.map.bytes(), OFF_TAIL) as usize
    }

    /// Called before PostgreSQL writes `data` at `offset` of segment `seg`
    /// through `fd`: the bytes not yet durable are persisted first.
    pub fn before_write(&mut self, fd: i32, seg: Segment, data: &[u8], offset: u64) -> Result<(), Errno> {
        if let Some(cur) = self.shared.current() {
            if cur != seg {
                if self.shared.dirty {
                    // The previous segment is finished: fsync it and empty
                    // the buffer, which never mixes segments.
                    self.drain(None)?;
                }
                self.shared.has_current = false;
            }
        }
        if self.shared.current().is_none() {
            self.shared.set_current(seg);
        }
        let end = offset + data.len() as u64;
        let from = offset + self.unchanged_prefix(offset, data) as u64;
        if from < end {
            let new_len = (end - from) as usize;
            if format::record_size(new_len) > self.drain_limit() {
                // Too large for the buffer: fsync what it holds and let the
                // next fsync of this segment be real.
                self.drain(Some(fd))?;
                self.shared.uncovered = true;
                self.shared.shadow_len = 0;
            } else {
                if self.tail() + format::record_size(new_len) > self.drain_limit() {
                    self.drain(Some(fd))?;
                }
                let lsn = seg.start_lsn(self.segment_size) + from;
                self.append(lsn, seg.tli, &data[(from - offset) as usize..], from)?;
            }
        }
        self.shared.dirty = true;
        self.shared.written_end = self.shared.written_end.max(end);
        Ok(())
    }

    /// How many leading bytes of a write at `offset` equal what was last
    /// persisted for them.
    fn unchanged_prefix(&self, offset: u64, data: &[u8]) -> usize {
        let sh = &*self.shared;
        let shadow_end = sh.shadow_start + sh.shadow_len as u64;
        if offset < sh.shadow_start || offset >= shadow_end {
            return 0;
        }
        common_prefix(&sh.shadow[(offset - sh.shadow_start) as usize..sh.shadow_len], data)
    }

    /// Decides what an fdatasync of segment `seg` does.
    pub fn on_fsync(&self, seg: Segment) -> SyncDecision {
        match self.shared.current() {
            Some(cur) if cur == seg => {
                if self.shared.uncovered {
                    SyncDecision::Real { drains: true }
                } else {
                    self.shared.fsyncs_avoided.fetch_add(1, Ordering::Relaxed);
                    SyncDecision::Skip
                }
            }
            // Not the segment the buffer tracks: nothing of it is buffered.
            _ => SyncDecision::Real { drains: false },
        }
    }

    /// After a successful real fsync that drains the buffer.
    pub fn drained(&mut self) -> Result<(), Errno> {
        self.shared.drains.fetch_add(1, Ordering::Relaxed);
        self.reset()
    }

    fn drain(&mut self, fd: Option<i32>) -> Result<(), Errno> {
        if self.shared.dirty {
            let err = match (fd, self.shared.current()) {
                // SAFETY: fd is the descriptor PostgreSQL is writing this segment through.
                (Some(fd), _) => match unsafe { libc::fdatasync(fd) } {
                    0 => 0,
                    // SAFETY: reading errno right after the failed call.
                    _ => unsafe { *libc::__errno_location() },
                },
                (None, Some(cur)) => cur.sync_by_name(),
                (None, None) => 0,
            };
            if err != 0 {
                return Err(err);
            }
            self.shared.drains.fetch_add(1, Ordering::Relaxed);
        }
        self.reset()
    }

    /// Empties the buffer: everything written so far is fsynced in pg_wal.
    fn reset(&mut self) -> Result<(), Errno> {
        let mut fields = [0u8; 24];
        if let Some(cur) = self.shared.current() {
            format::put_u64(&mut fields, 8, cur.start_lsn(self.segment_size) + self.shared.written_end);
            format::put_u32(&mut fields, 16, cur.tli);
        }
        // tail (0), synced lsn and its timeline are adjacent header fields.
        debug_assert!(OFF_SYNCED_LSN == OFF_TAIL + 8 && OFF_SYNCED_TLI == OFF_TAIL + 16);
        self.map.write_persist(OFF_TAIL, &fields[..20]).map_err(|_| libc::EIO)?;
        self.shared.dirty = false;
        self.shared.uncovered = false;
        Ok(())
    }

    /// Appends the WAL bytes `source` that PostgreSQL writes at `in_segment`
    /// (WAL position `lsn`). `source` may still be changing (bytes past the
    /// flush request are being filled in by other backends), so everything
    /// (trimming, checksum, shadow) is computed from the copy in the buffer.
    fn append(&mut self, lsn: u64, tli: u32, source: &[u8], in_segment: u64) -> Result<(), Errno> {
        let tail = self.tail();
        let at = HEADER_SIZE + tail;
        let data_at = at + format::RECORD_HEADER_SIZE;
        // Bytes seen as zero here are recorded as zero even if a backend
        // fills them in a moment later: the next write persists them.
        let len = nonzero_len(source);
        // SAFETY: at + record_size(source.len()) <= HEADER_SIZE + drain limit
        // < map.len (checked by the caller); source is a valid slice.
        let data = unsafe {
            std::ptr::copy_nonoverlapping(source.as_ptr(), self.map.addr.add(data_at), len);
            std::slice::from_raw_parts(self.map.addr.add(data_at), len)
        };
        let zeros = (source.len() - len) as u32;
        let header = format::record_header(lsn, tli, data, zeros);
        // SAFETY: the header's 24 bytes precede the data, inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), self.map.addr.add(at), header.len()) };
        let size = format::record_size(len);
        // The record is durable before the tail counts it: a crash in
        // between leaves a torn record past the tail, which is never read.
        self.map.persist(at, size).map_err(|_| libc::EIO)?;
        self.map
            .write_persist(OFF_TAIL, &((tail + size) as u64).to_le_bytes())
            .map_err(|_| libc::EIO)?;
        self.shared.bytes_persisted.fetch_add(len as u64, Ordering::Relaxed);
        // SAFETY: as above; the copy in the buffer does not change any more.
        let data = unsafe { std::slice::from_raw_parts(self.map.addr.add(data_at), len) };
        self.remember_last_page(in_segment, data, zeros as usize);
        Ok(())
    }

    /// Keeps what was persisted for the last page of a write: `data` then
    /// `zeros` zero bytes from `in_segment` on (before them the page equals
    /// the previous shadow, see unchanged_prefix).
    fn remember_last_page(&mut self, in_segment: u64, data: &[u8], zeros: usize) {
        let end = in_segment + (data.len() + zeros) as u64;
        let page_start = (end - 1) / PAGE as u64 * PAGE as u64;
        let sh = &mut *self.shared;
        // Where the page starts in the persisted range, or where the
        // persisted range starts in the page.
        let (skip, at) = if in_segment <= page_start {
            ((page_start - in_segment) as usize, 0)
        } else if sh.shadow_start == page_start && sh.shadow_len >= (in_segment - page_start) as usize {
            (0, (in_segment - page_start) as usize)
        } else {
            sh.shadow_len = 0; // the start of this page is not known
            return;
        };
        let part = data.get(skip..).unwrap_or(&[]);
        let len = (end - page_start) as usize - at;
        sh.shadow_start = page_start;
        sh.shadow[at..at + part.len()].copy_from_slice(part);
        sh.shadow[at + part.len()..at + len].fill(0);
        sh.shadow_len = at + len;
    }
}

fn word(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(data[at..at + 8].try_into().unwrap())
}

/// Length of `data` without its trailing zero bytes.
fn nonzero_len(data: &[u8]) -> usize {
    let mut n = data.len();
    // 32 bytes at a time through the (usually long) zero tail of a page.
    while n >= 32 && (word(data, n - 32) | word(data, n - 24) | word(data, n - 16) | word(data, n - 8)) == 0 {
        n -= 32;
    }
    while n > 0 && data[n - 1] == 0 {
        n -= 1;
    }
    n
}

/// How many leading bytes `a` and `b` have in common.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let diff = word(a, i) ^ word(b, i);
        if diff != 0 {
            return i + (diff.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_zero_tail() {
        let mut a = vec![7u8; 300];
        let b = a.clone();
        assert_eq!(common_prefix(&a, &b), 300);
        a[130] = 0;
        assert_eq!(common_prefix(&a, &b), 130);
        assert_eq!(common_prefix(&a[..10], &b), 10);
        let mut page = vec![0u8; 8192];
        assert_eq!(nonzero_len(&page), 0);
        page[100] = 1;
        page[4000] = 2;
        assert_eq!(nonzero_len(&page), 4001);
        page[8191] = 3;
        assert_eq!(nonzero_len(&page), 8192);
    }
}

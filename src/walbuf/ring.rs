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

/// In PostgreSQL shared memory; valid when zeroed.
#[repr(C)]
pub struct Shared {
    pub enabled: bool,
    pub is_pmem: bool,
    has_current: bool,
    current: SegmentFields,
    /// End of the last non-zero byte written to `current`. PostgreSQL
    /// writes whole pages and rewrites the last, partial one as it fills;
    /// bytes before this point never change again and are already fsynced
    /// or in the buffer, so only what follows is persisted.
    final_end: u64,
    /// End of the highest write to `current` (its zero tail included).
    covered_end: u64,
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
        self.final_end = 0;
        self.covered_end = 0;
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
        let nonzero_end = offset + nonzero_len(data) as u64;
        if nonzero_end > self.shared.final_end || end > self.shared.covered_end {
            let from = offset.max(self.shared.final_end);
            let data_end = nonzero_end.max(from);
            let new_bytes = &data[(from - offset) as usize..(data_end - offset) as usize];
            let size = format::record_size(new_bytes.len());
            if size > self.drain_limit() {
                // Too large for the buffer: fsync what it holds and let the
                // next fsync of this segment be real.
                self.drain(Some(fd))?;
                self.shared.uncovered = true;
            } else {
                if self.tail() + size > self.drain_limit() {
                    self.drain(Some(fd))?;
                }
                let lsn = seg.start_lsn(self.segment_size) + from;
                self.append(lsn, seg.tli, new_bytes, (end - data_end) as u32)?;
            }
        }
        self.shared.dirty = true;
        self.shared.final_end = self.shared.final_end.max(nonzero_end);
        self.shared.covered_end = self.shared.covered_end.max(end);
        Ok(())
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
            format::put_u64(&mut fields, 8, cur.start_lsn(self.segment_size) + self.shared.final_end);
            format::put_u32(&mut fields, 16, cur.tli);
        }
        // tail (0), synced lsn and its timeline are adjacent header fields.
        debug_assert!(OFF_SYNCED_LSN == OFF_TAIL + 8 && OFF_SYNCED_TLI == OFF_TAIL + 16);
        self.map.write_persist(OFF_TAIL, &fields[..20]).map_err(|_| libc::EIO)?;
        self.shared.dirty = false;
        self.shared.uncovered = false;
        Ok(())
    }

    fn append(&mut self, lsn: u64, tli: u32, data: &[u8], zeros: u32) -> Result<(), Errno> {
        let tail = self.tail();
        let at = HEADER_SIZE + tail;
        let size = format::record_size(data.len());
        let header = format::record_header(lsn, tli, data, zeros);
        // SAFETY: at + size <= HEADER_SIZE + drain limit < map.len (checked by the caller).
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), self.map.addr.add(at), header.len());
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.addr.add(at + header.len()),
                data.len(),
            );
        }
        // The record is durable before the tail counts it: a crash in
        // between leaves a torn record past the tail, which is never read.
        self.map.persist(at, size).map_err(|_| libc::EIO)?;
        self.map
            .write_persist(OFF_TAIL, &((tail + size) as u64).to_le_bytes())
            .map_err(|_| libc::EIO)?;
        self.shared.bytes_persisted.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Length of `data` without its trailing zero bytes.
fn nonzero_len(data: &[u8]) -> usize {
    let mut n = data.len();
    // Eight bytes at a time through the (usually long) zero tail of a page.
    while n >= 8 && data[n - 8..n] == [0u8; 8] {
        n -= 8;
    }
    while n > 0 && data[n - 1] == 0 {
        n -= 1;
    }
    n
}

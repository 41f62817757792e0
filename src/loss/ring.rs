//! The ring of acknowledged delayed commits.
//!
//! A file mapped shared by the postmaster before it forks, so the record
//! outlives the crash of any server process (the pages are the kernel's).
//! Writers take no lock: a claim number from one atomic counter picks the
//! slot; the slot's sequence word is set to WRITING, the fields written,
//! then the word set to claim + 1 (a reader that sees the same word before
//! and after reading the fields has a consistent entry). When the ring
//! laps an entry whose WAL is not yet flushed, that entry is folded into a
//! summary (count, LSN and time range) instead of stalling the commit.

use crate::walbuf::pmem::Mapping;
use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

pub const MAGIC: u64 = u64::from_le_bytes(*b"DDACKS01");
const VERSION: u32 = 1;
/// Where the header keeps the boot id of the machine that wrote it (the
/// tests overwrite it to simulate an operating-system restart).
#[allow(dead_code)] // the offset t/021_loss_report.pl writes at
pub const BOOT_ID_OFFSET: usize = 32;
pub const BOOT_ID_LEN: usize = 40;
/// Where the header keeps its `incomplete` word, and its bits. The live
/// record sets only ACKED_WITHOUT_ENTRY; a copy saved after a crash
/// (saved_record.rs) may add the others.
pub const INCOMPLETE_OFFSET: usize = 28;
/// A delayed commit was acknowledged without an entry.
const ACKED_WITHOUT_ENTRY: u32 = 1;
/// The record did not survive the restart of the machine that wrote it
/// (not on persistent memory): its last entries may be gone.
pub const LOST_AT_RESTART: u32 = 2;
/// The record was truncated: the copy holds its whole entries, padded with
/// empty ones to its size.
pub const SALVAGED: u32 = 4;
const CAPACITY_OFFSET: usize = 12;
/// Where a saved copy keeps Header::ended_at and ended_time.
pub const ENDED_AT_OFFSET: usize = 80;
/// The most entries a record holds (lost_commits_ring_size's maximum).
pub const MAX_CAPACITY: u32 = 1 << 24;
const WRITING: u64 = u64::MAX;

/// One acknowledged delayed commit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Acked {
    pub commit_end: u64,
    pub ack_time: i64,
    pub fxid: u64,
    pub datid: u32,
}

#[repr(C, align(64))]
struct Entry {
    /// 0: never written; WRITING; otherwise the claim number + 1.
    seq: AtomicU64,
    commit_end: AtomicU64,
    ack_time: AtomicI64,
    fxid: AtomicU64,
    datid: AtomicU32,
}

/// A hint to load `entry` into the CPU caches; no effect on the ring's
/// contents.
#[inline(always)]
fn prefetch(entry: &Entry) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint neither faults nor changes memory; the address
    // is that of a valid entry of the mapping.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(entry as *const Entry as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = entry;
}

/// Entries lapped by the ring before their WAL was flushed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub min_end: u64,
    pub max_end: u64,
    pub min_time: i64,
    pub max_time: i64,
}

#[repr(C, align(64))]
struct SharedSummary {
    lock: AtomicU32,
    count: AtomicU64,
    min_end: AtomicU64,
    max_end: AtomicU64,
    min_time: AtomicI64,
    max_time: AtomicI64,
}

#[repr(C, align(64))]
struct Counter(AtomicU64);

#[repr(C)]
struct Header {
    magic: u64,
    version: u32,
    capacity: u32,
    system_id: u64,
    /// 1 when the file is on persistent memory and entries are persisted.
    persistent: u32,
    /// ACKED_WITHOUT_ENTRY, LOST_AT_RESTART, SALVAGED: 0 when none.
    incomplete: AtomicU32,
    boot_id: [u8; BOOT_ID_LEN],
    /// A WAL position every commit of the server's earlier runs ends at or
    /// before: the record holds the acknowledgements of this run only, so
    /// a failover whose switch point lies before it may have lost commits
    /// this record does not list. 0: not known yet (set at the format after
    /// a clean shutdown, else at the run's first entry).
    covers_from: AtomicU64,
    /// In a copy saved at a start after the primary's clean shutdown (a
    /// switchover): where its shutdown checkpoint record starts, and that
    /// checkpoint's time (seconds since 1970): the run the record holds
    /// ended there. 0 otherwise (never set in a live record).
    ended_at: u64,
    ended_time: i64,
    /// 1 when the run was a single-user backend's (the crash recovery
    /// pg_rewind and Patroni run): it ends with a shutdown checkpoint, yet
    /// is no clean end of a primary's run.
    single_user_run: u32,
    summary: SharedSummary,
    next_claim: Counter,
    scan_from: Counter,
}

const ENTRIES_OFFSET: usize = std::mem::size_of::<Header>();
/// A file shorter than this holds no header.
pub const HEADER_LEN: usize = ENTRIES_OFFSET;

pub fn file_len(capacity: u32) -> usize {
    ENTRIES_OFFSET + capacity as usize * std::mem::size_of::<Entry>()
}

/// For a copy of a record file of `len` bytes whose header is valid but
/// which is shorter than its capacity says: the length up to its last whole
/// entry, and the length it should have. None otherwise.
pub fn truncated_lengths(header: &[u8], len: u64) -> Option<(u64, u64)> {
    let word = |at: usize, n: usize| header.get(at..at + n);
    let magic = u64::from_ne_bytes(word(0, 8)?.try_into().ok()?);
    let version = u32::from_ne_bytes(word(8, 4)?.try_into().ok()?);
    let capacity = u32::from_ne_bytes(word(CAPACITY_OFFSET, 4)?.try_into().ok()?);
    let full = file_len(capacity) as u64;
    if magic != MAGIC || version != VERSION || capacity == 0 || capacity > MAX_CAPACITY || len < ENTRIES_OFFSET as u64 || len >= full {
        return None;
    }
    let entry = std::mem::size_of::<Entry>() as u64;
    let whole = ENTRIES_OFFSET as u64 + (len - ENTRIES_OFFSET as u64) / entry * entry;
    Some((whole, full))
}

/// What a crashed run left in the ring.
#[derive(Debug)]
pub struct Snapshot {
    pub entries: Vec<Acked>,
    /// A slot was being written at the crash after the ring had lapped:
    /// the entry it replaced may be missing from the record.
    pub torn: bool,
    pub summary: Summary,
    pub incomplete: bool,
    /// A saved copy of a record that did not survive the restart of the
    /// machine that wrote it (also `incomplete`).
    pub lost_at_restart: bool,
    /// A saved copy of a truncated record (also `incomplete`).
    pub salvaged: bool,
    pub boot_id: [u8; BOOT_ID_LEN],
    /// See Header::covers_from.
    pub covers_from: u64,
    /// See Header::ended_at: where the clean shutdown that ended the run
    /// began, and its checkpoint's time (0, 0: not a clean end's copy).
    pub ended_at: (u64, i64),
    pub persistent: bool,
    /// The cluster the record belongs to.
    pub system_id: u64,
    /// The ring went round: older acknowledgements were overwritten (the
    /// unflushed ones summarized, the flushed ones dropped).
    pub lapped: bool,
}

#[derive(Clone, Copy)]
pub struct Ring {
    map: Mapping,
    capacity: u64,
}

impl Ring {
    /// A ring over a mapping of `file_len(capacity)` bytes or more; what is
    /// wrong with it otherwise.
    pub fn new(map: Mapping) -> Result<Ring, String> {
        let ring = Ring { map, capacity: 0 };
        if map.len < ENTRIES_OFFSET {
            return Err(format!("is too short ({} bytes)", map.len));
        }
        let h = ring.header();
        if h.magic != MAGIC || h.version != VERSION || h.capacity == 0 {
            return Err("is not a record of acknowledged commits (its header is not valid)".into());
        }
        if map.len < file_len(h.capacity) {
            return Err(format!(
                "is truncated ({} bytes, {} expected for {} entries)",
                map.len,
                file_len(h.capacity),
                h.capacity
            ));
        }
        Ok(Ring { map, capacity: h.capacity as u64 })
    }

    /// What can still be read of a truncated ring (valid header, fewer
    /// entries than it says): the entries that are there, to be read by
    /// snapshot() only.
    pub fn salvage(map: Mapping) -> Option<Ring> {
        if map.len < ENTRIES_OFFSET {
            return None;
        }
        let whole = Ring { map, capacity: 0 };
        let h = whole.header();
        if h.magic != MAGIC || h.version != VERSION || h.capacity == 0 {
            return None;
        }
        let readable = ((map.len - ENTRIES_OFFSET) / std::mem::size_of::<Entry>()).min(h.capacity as usize);
        Some(Ring { map, capacity: readable as u64 })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping holds at least a header (checked by new() and
        // format()); every field written concurrently is atomic.
        unsafe { &*(self.map.addr as *const Header) }
    }

    fn entry(&self, claim: u64) -> &Entry {
        let i = (claim % self.capacity) as usize;
        // SAFETY: i < capacity and the mapping holds capacity entries.
        unsafe { &*(self.map.addr.add(ENTRIES_OFFSET) as *const Entry).add(i) }
    }

    /// Writes an empty ring of `capacity` entries over the whole mapping
    /// and makes it durable (postmaster only, no other process attached).
    /// `persistent`: the file is on persistent memory, and every entry is
    /// flushed from the CPU caches as it is written.
    pub fn format(
        map: Mapping,
        capacity: u32,
        system_id: u64,
        boot_id: [u8; BOOT_ID_LEN],
        persistent: bool,
        covers_from: u64,
        single_user: bool,
    ) -> Result<Ring, String> {
        let ring = Ring::write_empty(map, capacity, system_id, boot_id, persistent);
        ring.header().covers_from.store(covers_from, Ordering::Relaxed);
        // SAFETY: the postmaster (or the single-user backend) owns the
        // mapping alone while it formats it.
        unsafe { (*(map.addr as *mut Header)).single_user_run = single_user as u32 };
        map.persist(0, file_len(capacity))?;
        // The magic last, once the rest is durable: a file whose formatting
        // did not reach the disk is no ring, never an empty one.
        // SAFETY: the postmaster owns the mapping alone at this point.
        unsafe { std::ptr::write_volatile(&mut (*(map.addr as *mut Header)).magic, MAGIC) };
        map.persist(0, std::mem::size_of::<u64>())?;
        Ok(ring)
    }

    fn write_empty(map: Mapping, capacity: u32, system_id: u64, boot_id: [u8; BOOT_ID_LEN], persistent: bool) -> Ring {
        assert!(map.len >= file_len(capacity));
        // SAFETY: the postmaster owns the mapping alone at this point.
        unsafe {
            std::ptr::write_bytes(map.addr, 0, file_len(capacity));
            let h = &mut *(map.addr as *mut Header);
            h.version = VERSION;
            h.capacity = capacity;
            h.system_id = system_id;
            h.persistent = (persistent && map.is_pmem) as u32;
            h.boot_id = boot_id;
        }
        Ring { map, capacity: capacity as u64 }
    }

    pub fn mapping(&self) -> Mapping {
        self.map
    }

    pub fn system_id(&self) -> u64 {
        self.header().system_id
    }

    pub fn capacity(&self) -> u32 {
        self.capacity as u32
    }

    /// Whether the run that wrote the record was a single-user backend's.
    pub fn single_user_run(&self) -> bool {
        self.header().single_user_run != 0
    }

    /// Every entry and the summary (postmaster only, nobody writing).
    pub fn snapshot(&self) -> Snapshot {
        let h = self.header();
        let entries = (0..self.capacity)
            .map(|i| self.entry(i))
            .filter(|e| !matches!(e.seq.load(Ordering::Acquire), 0 | WRITING))
            .map(|e| Acked {
                commit_end: e.commit_end.load(Ordering::Relaxed),
                ack_time: e.ack_time.load(Ordering::Relaxed),
                fxid: e.fxid.load(Ordering::Relaxed),
                datid: e.datid.load(Ordering::Relaxed),
            })
            .collect();
        // The claim counter is not flushed from the CPU caches on
        // persistent memory: an entry's own claim number (persisted with
        // it) past the capacity also says the ring went round.
        let claimed_after_a_lap = |i: u64| {
            let seq = self.entry(i).seq.load(Ordering::Relaxed);
            seq != WRITING && seq > self.capacity
        };
        let lapped = h.next_claim.0.load(Ordering::Relaxed) > self.capacity || (0..self.capacity).any(claimed_after_a_lap);
        let torn = lapped && (0..self.capacity).any(|i| self.entry(i).seq.load(Ordering::Relaxed) == WRITING);
        Snapshot {
            entries,
            torn,
            summary: self.summary(),
            incomplete: h.incomplete.load(Ordering::Relaxed) != 0,
            lost_at_restart: h.incomplete.load(Ordering::Relaxed) & LOST_AT_RESTART != 0,
            salvaged: h.incomplete.load(Ordering::Relaxed) & SALVAGED != 0,
            boot_id: h.boot_id,
            covers_from: h.covers_from.load(Ordering::Relaxed),
            ended_at: (h.ended_at, h.ended_time),
            persistent: h.persistent != 0,
            system_id: h.system_id,
            lapped,
        }
    }

    /// Records an acknowledged delayed commit and returns its
    /// acknowledgement time, read from `now` once the slot is claimed (so
    /// that claim order and time order agree). `flushed` reads the WAL flush
    /// position; it is called only when an older entry is lapped.
    pub fn record(
        &self,
        commit_end: u64,
        fxid: u64,
        datid: u32,
        now: impl Fn() -> i64,
        flushed: impl Fn() -> u64,
    ) -> i64 {
        let h = self.header();
        let claim = h.next_claim.0.fetch_add(1, Ordering::AcqRel);
        let e = self.entry(claim);
        let old = e.seq.load(Ordering::Acquire);
        // A writer of a later lap got here first, or one of an earlier lap
        // is still writing (the ring lapped during its write): summarize.
        if old == WRITING || (old != 0 && old - 1 > claim) {
            let t = now();
            self.summarize(Acked { commit_end, ack_time: t, fxid, datid }, flushed());
            return t;
        }
        if old != 0 {
            // The lapped entry goes into the summary before its slot is
            // taken: a writer killed in between leaves it counted twice
            // (an overstated "up to"), never lost.
            let lapped_end = e.commit_end.load(Ordering::Relaxed);
            let lapped_time = e.ack_time.load(Ordering::Relaxed);
            // Pairs with the fence(Release) below, in another writer.
            fence(Ordering::Acquire);
            if e.seq.load(Ordering::Relaxed) == old {
                let f = flushed();
                if lapped_end > f {
                    self.summarize(Acked { commit_end: lapped_end, ack_time: lapped_time, fxid: 0, datid: 0 }, f);
                }
            }
        }
        if e.seq.compare_exchange(old, WRITING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            let t = now();
            self.summarize(Acked { commit_end, ack_time: t, fxid, datid }, flushed());
            return t;
        }
        // The WRITING mark is visible before any field stored below (a
        // seqlock writer, as Slot::begin_write in sequence/slots.rs): a
        // reader that sees a new field and then, after its
        // fence(Acquire), reads the sequence word again sees WRITING or a
        // later claim and drops what it read. The CAS's release half orders
        // only what came before it; weak memory models need the fence.
        fence(Ordering::Release);
        let t = now();
        e.commit_end.store(commit_end, Ordering::Relaxed);
        e.ack_time.store(t, Ordering::Relaxed);
        e.fxid.store(fxid, Ordering::Relaxed);
        e.datid.store(datid, Ordering::Relaxed);
        // Pairs with the readers' first Acquire load of the sequence word
        // (oldest_unflushed, snapshot, the lapping check above): who sees
        // claim + 1 sees every field.
        e.seq.store(claim + 1, Ordering::Release);
        if self.header().persistent != 0 {
            let offset = e as *const Entry as usize - self.map.addr as usize;
            // On persistent memory a cache-line flush; cannot fail there.
            let _ = self.map.persist(offset, std::mem::size_of::<Entry>());
        }
        // The next claim's entry was last written a lap ago and has left the
        // CPU caches: reading it is a cache miss that profiles showed to be
        // most of this function's cost. Fetching it now overlaps that miss
        // with the time until the next delayed commit.
        prefetch(self.entry(claim + 1));
        t
    }

    /// On persistent memory, flushes a header field from the CPU caches.
    fn persist_header_field<T>(&self, field: &T) {
        if self.header().persistent != 0 {
            let offset = field as *const T as usize - self.map.addr as usize;
            let _ = self.map.persist(offset, std::mem::size_of::<T>());
        }
    }

    /// Sets covers_from once, before this run's first entry: `run_start`
    /// (called only while it is unset) gives where this run's WAL began.
    pub fn note_covers_from(&self, run_start: impl FnOnce() -> u64) {
        let field = &self.header().covers_from;
        if field.load(Ordering::Relaxed) == 0 {
            let start = run_start();
            if start != 0 && field.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                self.persist_header_field(field);
            }
        }
    }

    /// Whether a delayed commit was acknowledged without an entry since the
    /// record was formatted: counts and ages read from it may miss some.
    pub fn is_incomplete(&self) -> bool {
        self.header().incomplete.load(Ordering::Relaxed) != 0
    }

    /// Notes that a delayed commit was acknowledged without an entry (the
    /// record is off): a report after a crash cannot be exact.
    pub fn mark_incomplete(&self) {
        let flag = &self.header().incomplete;
        if flag.load(Ordering::Relaxed) == 0 {
            // Only this bit in a live record (format() zeroes the word).
            flag.store(ACKED_WITHOUT_ENTRY, Ordering::Relaxed);
            self.persist_header_field(flag);
        }
    }

    /// Writers of the summary (ring overflow only) serialize on a spin lock
    /// in the ring. Its holder can only die by a crash, and the postmaster
    /// then formats the ring without ever taking the lock; readers do not
    /// take it.
    fn with_summary_lock<T>(&self, f: impl FnOnce(&SharedSummary) -> T) -> T {
        let s = &self.header().summary;
        while s.lock.compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        let result = f(s);
        self.persist_header_field(s);
        s.lock.store(0, Ordering::Release);
        result
    }

    fn summarize(&self, acked: Acked, flushed: u64) {
        self.with_summary_lock(|s| {
            // What the summary held is flushed: start over.
            if s.count.load(Ordering::Relaxed) > 0 && s.max_end.load(Ordering::Relaxed) <= flushed {
                s.count.store(0, Ordering::Relaxed);
            }
            if s.count.load(Ordering::Relaxed) == 0 {
                s.min_end.store(acked.commit_end, Ordering::Relaxed);
                s.max_end.store(acked.commit_end, Ordering::Relaxed);
                s.min_time.store(acked.ack_time, Ordering::Relaxed);
                s.max_time.store(acked.ack_time, Ordering::Relaxed);
            } else {
                s.min_end.fetch_min(acked.commit_end, Ordering::Relaxed);
                s.max_end.fetch_max(acked.commit_end, Ordering::Relaxed);
                s.min_time.fetch_min(acked.ack_time, Ordering::Relaxed);
                s.max_time.fetch_max(acked.ack_time, Ordering::Relaxed);
            }
            s.count.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// The summary as it stands, read without the lock: field by field
    /// consistent only when nobody writes (the postmaster after a crash);
    /// good enough for the time budget's age estimate otherwise.
    pub fn summary(&self) -> Summary {
        let s = &self.header().summary;
        Summary {
            count: s.count.load(Ordering::Acquire),
            min_end: s.min_end.load(Ordering::Relaxed),
            max_end: s.max_end.load(Ordering::Relaxed),
            min_time: s.min_time.load(Ordering::Relaxed),
            max_time: s.max_time.load(Ordering::Relaxed),
        }
    }

    /// When the oldest acknowledged commit whose WAL is not flushed up to
    /// `flushed` was acknowledged; None when there is none. An entry being
    /// written right now counts as acknowledged `now`.
    ///
    /// Entries are visited in claim order from where the last visit stopped,
    /// so the cost is the entries flushed since then, plus one.
    pub fn oldest_unflushed(&self, flushed: u64, now: i64) -> Option<i64> {
        let h = self.header();
        let scan = self.first_past(flushed, now, h.scan_from.0.load(Ordering::Relaxed));
        h.scan_from.0.fetch_max(scan.claim, Ordering::Relaxed);
        self.with_summary(scan.found.map(|(time, _)| time), flushed)
    }

    /// When the oldest acknowledged commit ending past `confirmed` (a
    /// standby's flush position) was acknowledged, for the time budget kept
    /// against that standby; None when there is none. `place` is where the
    /// last such scan stopped, moved on: the entry it stopped at may since
    /// have been overwritten (the summary keeps only those unflushed here),
    /// and so may the ones after it, before or while this scan reads them.
    /// Entries it could not read count as acknowledged no earlier than the
    /// place says. A confirmed entry says the ones claimed before it are
    /// confirmed too: claim order is commit order, but for commits a few
    /// microseconds apart (a process descheduled between its commit record
    /// and its claim).
    pub fn oldest_past(&self, confirmed: u64, now: i64, place: &mut ScanPlace) -> Option<i64> {
        // The entry the place stopped at is confirmed: so is every one
        // before it, and those after it came later.
        let from = if confirmed >= place.end {
            ScanPlace { oldest: i64::MAX, unread_since: place.own_time, ..*place }
        } else {
            *place
        };
        let scan = self.first_past(confirmed, now, from.claim);
        let unread_bound = match scan.last_confirmed_time {
            Some(t) => t,
            None => from.oldest.min(from.unread_since),
        };
        let carried = match (scan.unread, scan.last_confirmed_time) {
            (true, _) => unread_bound,
            (false, Some(_)) => i64::MAX,
            (false, None) => from.oldest,
        };
        let found = scan.found.map(|(t, _)| t.min(carried));
        *place = match scan.found {
            Some((own_time, end)) => {
                let answer = own_time.min(carried);
                ScanPlace { claim: scan.claim, oldest: answer, unread_since: answer, end, own_time }
            }
            // Entries claimed from now on are acknowledged now or later.
            None => ScanPlace { claim: scan.claim, oldest: i64::MAX, unread_since: now, end: 0, own_time: now },
        };
        self.with_summary(found, confirmed)
    }

    /// The first entry from claim `from` on (or the oldest kept) that ends
    /// past `lsn`.
    fn first_past(&self, lsn: u64, now: i64, from: u64) -> Scan {
        let next = self.header().next_claim.0.load(Ordering::Acquire);
        let start = from.max(next.saturating_sub(self.capacity));
        let mut scan = Scan { found: None, claim: start, unread: from < start, last_confirmed_time: None };
        while scan.claim < next {
            let claim = scan.claim;
            let e = self.entry(claim);
            let seq = e.seq.load(Ordering::Acquire);
            if seq == claim + 1 {
                let end = e.commit_end.load(Ordering::Relaxed);
                let time = e.ack_time.load(Ordering::Relaxed);
                // Pairs with record()'s fence(Release) after the WRITING
                // mark: fields of a later rewrite imply a changed word here.
                fence(Ordering::Acquire);
                if e.seq.load(Ordering::Relaxed) == claim + 1 {
                    if end > lsn {
                        scan.found = Some((time, end));
                        return scan;
                    }
                    scan.unread = false;
                    scan.last_confirmed_time = Some(time);
                } else {
                    scan.unread = true;
                }
            } else if seq == 0 || seq == WRITING || seq < claim + 1 {
                // Claimed and being written: acknowledged now, its end
                // not known yet.
                scan.found = Some((now, u64::MAX));
                return scan;
            } else {
                // Lapped by a later claim (summarized if unflushed here).
                scan.unread = true;
            }
            scan.claim += 1;
        }
        scan
    }

    /// `oldest`, or the summary's oldest time if overwritten entries it
    /// summarizes end past `lsn`.
    fn with_summary(&self, oldest: Option<i64>, lsn: u64) -> Option<i64> {
        let s = self.summary();
        if s.count > 0 && s.max_end > lsn {
            return Some(oldest.map_or(s.min_time, |t: i64| t.min(s.min_time)));
        }
        oldest
    }
}

/// Where a scan of the record for a standby's time budget stopped: every
/// entry claimed before `claim` ends at or below a position the standby
/// confirmed. `oldest`: no unconfirmed entry from `claim` on was
/// acknowledged before it (i64::MAX: none known); `unread_since`: nor one
/// the next scan cannot read, overwritten first (i64::MIN: unknown, older
/// than any budget). `end` and `own_time`: the entry at `claim`, once the
/// standby confirmed it (u64::MAX: not known).
#[derive(Clone, Copy)]
pub struct ScanPlace {
    pub claim: u64,
    pub oldest: i64,
    pub unread_since: i64,
    pub end: u64,
    pub own_time: i64,
}

impl ScanPlace {
    pub const UNKNOWN: ScanPlace =
        ScanPlace { claim: 0, oldest: i64::MAX, unread_since: i64::MIN, end: u64::MAX, own_time: i64::MIN };

    /// The more careful of two places at the same claim.
    pub fn merge(self, other: ScanPlace) -> ScanPlace {
        ScanPlace {
            claim: self.claim,
            oldest: self.oldest.min(other.oldest),
            unread_since: self.unread_since.min(other.unread_since),
            end: self.end.max(other.end),
            own_time: self.own_time.min(other.own_time),
        }
    }
}

struct Scan {
    /// The first entry past the position: when it was acknowledged, and
    /// where its commit record ends.
    found: Option<(i64, u64)>,
    /// That entry's claim, or the next claim when none was found.
    claim: u64,
    /// Whether entries it could not read (overwritten) come after the last
    /// confirmed one it read, or from its start when it read none.
    unread: bool,
    /// When the last confirmed entry it read was acknowledged.
    last_confirmed_time: Option<i64>,
}

impl Snapshot {
    /// Where the oldest listed entry ends (u64::MAX when none).
    pub fn entries_min_end(&self) -> u64 {
        self.entries.iter().map(|a| a.commit_end).min().unwrap_or(u64::MAX)
    }
}

impl Ring {
    /// How many acknowledged commits recorded now end past `lsn`, and when
    /// the oldest of them was acknowledged (summarized ones count with the
    /// summary's oldest time; entries being written are not counted yet).
    /// Lock-free, read as oldest_unflushed() reads.
    pub fn acknowledged_after(&self, lsn: u64) -> (u64, Option<i64>) {
        let next = self.header().next_claim.0.load(Ordering::Acquire);
        let (mut count, mut oldest) = (0u64, None::<i64>);
        for claim in next.saturating_sub(self.capacity)..next {
            let e = self.entry(claim);
            if e.seq.load(Ordering::Acquire) != claim + 1 {
                continue;
            }
            let end = e.commit_end.load(Ordering::Relaxed);
            let time = e.ack_time.load(Ordering::Relaxed);
            // Pairs with record()'s fence(Release) after the WRITING mark.
            fence(Ordering::Acquire);
            if e.seq.load(Ordering::Relaxed) == claim + 1 && end > lsn {
                count += 1;
                oldest = Some(oldest.map_or(time, |o| o.min(time)));
            }
        }
        let s = self.summary();
        if s.count > 0 && s.max_end > lsn {
            count += s.count;
            oldest = Some(oldest.map_or(s.min_time, |o| o.min(s.min_time)));
        }
        (count, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anonymous(capacity: u32) -> (Ring, Vec<u8>) {
        let mut memory = vec![0u8; file_len(capacity) + 64];
        let offset = memory.as_ptr().align_offset(64);
        // SAFETY: the vector outlives the ring in each test.
        let addr = unsafe { memory.as_mut_ptr().add(offset) };
        let map = Mapping { addr, len: file_len(capacity), is_pmem: false };
        // Heap memory: written like a file, not msync'ed.
        let ring = Ring::write_empty(map, capacity, 0, [0; BOOT_ID_LEN], false);
        // SAFETY: the test owns the memory.
        unsafe { (*(map.addr as *mut Header)).magic = MAGIC };
        (ring, memory)
    }

    impl Ring {
        fn record_at(&self, end: u64, time: i64, flushed: u64) {
            self.record(end, end, 5, || time, || flushed);
        }
    }

    #[test]
    fn covers_from_is_set_once_and_never_to_zero() {
        let (ring, _memory) = anonymous(4);
        assert_eq!(ring.snapshot().covers_from, 0);
        ring.note_covers_from(|| 0);
        assert_eq!(ring.snapshot().covers_from, 0, "no recovery ran: left for the format's value");
        ring.note_covers_from(|| 0x5000);
        ring.note_covers_from(|| panic!("not read again once set"));
        assert_eq!(ring.snapshot().covers_from, 0x5000);
    }

    #[test]
    fn header_layout() {
        assert_eq!(std::mem::offset_of!(Header, boot_id), BOOT_ID_OFFSET);
        assert_eq!(std::mem::offset_of!(Header, incomplete), INCOMPLETE_OFFSET);
        assert_eq!(std::mem::offset_of!(Header, capacity), CAPACITY_OFFSET);
        // covers_from took padding before the summary: records written
        // before it existed read 0 there (not known), and entries did not move.
        assert_eq!(std::mem::offset_of!(Header, covers_from), BOOT_ID_OFFSET + BOOT_ID_LEN);
        assert_eq!(std::mem::offset_of!(Header, ended_at), ENDED_AT_OFFSET);
        assert_eq!(std::mem::offset_of!(Header, ended_time), ENDED_AT_OFFSET + 8);
        assert_eq!(std::mem::offset_of!(Header, single_user_run), ENDED_AT_OFFSET + 16);
        assert_eq!(std::mem::offset_of!(Header, summary), 128);
        assert_eq!(ENTRIES_OFFSET % 64, 0);
        assert_eq!(std::mem::size_of::<Entry>(), 64);
    }

    #[test]
    fn oldest_unflushed_follows_the_flush_position() {
        let (ring, _m) = anonymous(8);
        assert_eq!(ring.oldest_unflushed(0, 99), None);
        ring.record_at(100, 1, 0);
        ring.record_at(200, 2, 0);
        ring.record_at(300, 3, 0);
        assert_eq!(ring.oldest_unflushed(0, 99), Some(1));
        assert_eq!(ring.oldest_unflushed(100, 99), Some(2));
        assert_eq!(ring.oldest_unflushed(300, 99), None);
        assert_eq!(ring.snapshot().entries.len(), 3);
    }

    #[test]
    fn lapped_unflushed_entries_are_summarized() {
        let (ring, _m) = anonymous(4);
        for i in 1..=6u64 {
            ring.record_at(i * 100, i as i64, 0);
        }
        let s = ring.summary();
        assert_eq!((s.count, s.min_end, s.max_end, s.min_time, s.max_time), (2, 100, 200, 1, 2));
        // The summary holds the oldest: it answers for the window.
        assert_eq!(ring.oldest_unflushed(0, 99), Some(1));
        let snap = ring.snapshot();
        assert_eq!(snap.entries.len(), 4);
        assert!(snap.entries.iter().all(|a| a.commit_end >= 300));
        // Lapping flushed entries summarizes nothing; a flushed summary restarts.
        for i in 7..=10u64 {
            ring.record_at(i * 100, i as i64, 650);
        }
        let s = ring.summary();
        assert_eq!((s.count, s.min_end, s.max_end), (2, 100, 200), "{s:?}");
        assert_eq!(ring.oldest_unflushed(700, 99), Some(8));
    }

    #[test]
    fn a_truncated_ring_is_refused_and_its_entries_salvaged() {
        let (ring, _m) = anonymous(8);
        for i in 1..=5u64 {
            ring.record_at(i * 100, i as i64, 0);
        }
        // Cut after the third entry.
        let cut = Mapping { len: ENTRIES_OFFSET + 3 * std::mem::size_of::<Entry>() + 10, ..ring.mapping() };
        let why = Ring::new(cut).err().expect("a truncated ring is refused");
        assert!(why.starts_with("is truncated"), "{why}");
        let salvaged = Ring::salvage(cut).expect("its header is readable").snapshot();
        let ends: Vec<u64> = salvaged.entries.iter().map(|a| a.commit_end).collect();
        assert_eq!(ends, vec![100, 200, 300]);
        // No header: nothing to salvage.
        let short = Mapping { len: ENTRIES_OFFSET - 1, ..ring.mapping() };
        assert!(Ring::new(short).is_err() && Ring::salvage(short).is_none());
    }

    #[test]
    fn a_ring_without_its_magic_is_no_ring() {
        let (ring, _m) = anonymous(8);
        // SAFETY: the test owns the memory.
        unsafe { (*(ring.mapping().addr as *mut Header)).magic = 0 };
        assert!(Ring::new(ring.mapping()).err().unwrap().contains("not a record"));
        assert!(Ring::salvage(ring.mapping()).is_none());
    }

    #[test]
    fn acknowledged_after_a_position() {
        let (ring, _m) = anonymous(4);
        for i in 1..=6u64 {
            ring.record_at(i * 100, i as i64, 0);
        }
        // Two lapped into the summary (100, 200), four listed (300..600).
        assert_eq!(ring.acknowledged_after(350), (3, Some(4)));
        assert_eq!(ring.acknowledged_after(0), (6, Some(1)));
        assert_eq!(ring.acknowledged_after(600), (0, None));
    }

    #[test]
    fn oldest_past_a_standby_position() {
        let (ring, _m) = anonymous(4);
        let mut place = ScanPlace::UNKNOWN;
        // A fresh ring: nothing unread, the first entry's own age.
        ring.record_at(100, 10, 1000);
        assert_eq!(ring.oldest_past(0, 99, &mut place), Some(10));
        // Confirmed: none; an idle hour later a commit's own age counts.
        assert_eq!(ring.oldest_past(100, 99, &mut place), None);
        ring.record_at(200, 5000, 1000);
        assert_eq!(ring.oldest_past(100, 5001, &mut place), Some(5000));
        // Two scans from the same place, no claim between: the age stays.
        assert_eq!(ring.oldest_past(100, 5002, &mut place), Some(5000));
        // Lapped while the standby lacks 200 (flushed here: no summary).
        for i in 3..=8u64 {
            ring.record_at(i * 100, 5000 + i as i64, 1000);
        }
        assert_eq!(ring.summary().count, 0);
        assert_eq!(ring.oldest_past(100, 6000, &mut place), Some(5000), "the age outlives the entry");
        assert_eq!(ring.oldest_past(100, 6001, &mut place), Some(5000), "and stays with the place");
        // The standby confirmed the entry the place stopped at (500, now
        // overwritten too): the age carried goes, that entry's own bounds
        // what could not be read.
        for i in 9..=12u64 {
            ring.record_at(i * 100, 5000 + i as i64, 1000);
        }
        assert_eq!(ring.oldest_past(850, 6002, &mut place), Some(5005));
        // A confirmed entry read: what came before it is confirmed.
        assert_eq!(ring.oldest_past(1000, 6003, &mut place), Some(5011));
        // A fresh place on a ring that went round: unknown, unless a
        // confirmed entry is read first.
        let mut fresh = ScanPlace::UNKNOWN;
        assert_eq!(ring.oldest_past(850, 6004, &mut fresh), Some(i64::MIN));
        let mut fresh = ScanPlace::UNKNOWN;
        assert_eq!(ring.oldest_past(1000, 6005, &mut fresh), Some(5011));
    }

    #[test]
    fn incomplete_flag() {
        let (ring, _m) = anonymous(4);
        assert!(!ring.snapshot().incomplete);
        ring.mark_incomplete();
        assert!(ring.snapshot().incomplete);
        assert!(!ring.snapshot().lost_at_restart && !ring.snapshot().salvaged);
    }

    /// A claim counter that did not reach persistent memory before a power
    /// cut still shows the ring went round, from the entries' own claims.
    #[test]
    fn lapped_from_the_entries_when_the_counter_is_stale() {
        let (ring, _m) = anonymous(4);
        for end in 1..=6 {
            ring.record_at(end * 100, end as i64, 10_000);
        }
        assert!(ring.snapshot().lapped);
        ring.header().next_claim.0.store(2, Ordering::Relaxed);
        assert!(ring.snapshot().lapped);
        let (fresh, _f) = anonymous(4);
        fresh.record_at(100, 1, 0);
        assert!(!fresh.snapshot().lapped);
    }

    /// A saved copy of a truncated record is cut to its whole entries and
    /// padded to its size, marked, and read back whole by Ring::new.
    #[test]
    fn a_truncated_copy_is_padded_and_marked() {
        let (ring, _m) = anonymous(8);
        for end in [100, 200, 300] {
            ring.record_at(end, end as i64, 0);
        }
        // SAFETY: the mapping is file_len(8) bytes of the test's memory.
        let bytes = unsafe { std::slice::from_raw_parts(ring.map.addr, file_len(8)) }.to_vec();
        let path = std::env::temp_dir().join(format!("dd_truncated_copy_{}", std::process::id()));
        // Cut within the third entry.
        std::fs::write(&path, &bytes[..ENTRIES_OFFSET + 2 * 64 + 20]).unwrap();
        crate::loss::saved_record::mark_copy(&path, true, (0, 0)).unwrap();
        let copy = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(copy.len(), file_len(8));
        let (back, memory) = anonymous(8);
        // SAFETY: both are file_len(8) bytes; the ring does not outlive `memory`.
        unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), back.map.addr, copy.len()) };
        let back = Ring::new(back.map).unwrap();
        let s = back.snapshot();
        assert_eq!(s.entries.iter().map(|a| a.commit_end).collect::<Vec<_>>(), vec![100, 200]);
        assert!(s.incomplete && s.salvaged && s.lost_at_restart);
        assert_eq!(s.ended_at, (0, 0));
        drop(memory);
        // A whole record is neither cut nor marked salvaged.
        assert_eq!(truncated_lengths(&bytes[..HEADER_LEN], bytes.len() as u64), None);
    }

    /// A copy saved after a clean shutdown carries where it began and its
    /// time, and nothing else: not incomplete, entries unchanged.
    #[test]
    fn a_clean_end_copy_is_stamped() {
        let (ring, _m) = anonymous(8);
        ring.record_at(100, 1, 0);
        // SAFETY: the mapping is file_len(8) bytes of the test's memory.
        let bytes = unsafe { std::slice::from_raw_parts(ring.map.addr, file_len(8)) }.to_vec();
        let path = std::env::temp_dir().join(format!("dd_clean_end_copy_{}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        crate::loss::saved_record::mark_copy(&path, false, (0x3006CA0, 1_800_000_000)).unwrap();
        let copy = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (back, memory) = anonymous(8);
        // SAFETY: both are file_len(8) bytes; the ring does not outlive `memory`.
        unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), back.map.addr, copy.len()) };
        let s = Ring::new(back.map).unwrap().snapshot();
        assert_eq!(s.ended_at, (0x3006CA0, 1_800_000_000));
        assert!(!s.incomplete);
        assert_eq!(s.entries.iter().map(|a| a.commit_end).collect::<Vec<_>>(), vec![100]);
        drop(memory);
    }
}

//! Reading a buffer back: at startup, before the startup process reads any
//! WAL, the WAL the buffer holds is written back into the segment files of
//! pg_wal and fsynced; crash recovery then replays it as usual. The whole
//! buffer is validated before the first byte is written, so a buffer that is
//! refused leaves pg_wal untouched.

use super::format::{self, ReadError, HEADER_SIZE};
use super::pmem::Mapping;
use super::segment::{self, Segment};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;

/// What the buffer must match: read from pg_control, and the data
/// directory (the server's working directory: its resolved path, device
/// and inode).
pub struct Cluster {
    pub system_id: u64,
    pub segment_size: u64,
    pub timeline: u32,
    pub data_dir: format::Owner,
    /// The data directory holds a backup_label: it was made by a base
    /// backup or rewound by pg_rewind, and has not written any WAL since.
    pub from_backup: bool,
    /// Where the latest checkpoint record starts, and its content as
    /// pg_control keeps it (the CheckPoint the record carries).
    pub checkpoint: u64,
    pub checkpoint_copy: Vec<u8>,
}

pub enum Problem {
    NotABuffer,
    BadHeader(&'static str),
    OtherCluster {
        buffer: u64,
        cluster: u64,
    },
    /// A buffer of this database system formatted by the server of another
    /// data directory (a copy made on the same host, or the original of
    /// this copy): never restored or formatted by this one.
    OtherDataDirectory {
        owner: String,
        empty: bool,
    },
    /// WAL in the buffer of a data directory that a base backup or
    /// pg_rewind has since replaced: not this data directory's any more.
    ReplacedDataDirectory,
    /// The latest checkpoint is not in the WAL the buffer would restore: a
    /// run without the buffer (without the library, or with the path
    /// emptied) wrote WAL over what the buffer holds.
    WrittenWithoutBuffer {
        checkpoint: u64,
    },
    SegmentSize {
        buffer: u64,
        cluster: u64,
    },
    Corrupted {
        offset: usize,
        checksum: bool,
    },
    UnknownTimeline {
        tli: u32,
        timeline: u32,
    },
    MissingSegment {
        name: String,
    },
    Io(String),
}

#[derive(Default)]
pub struct Restored {
    pub bytes: u64,
    pub records: usize,
    pub segments: usize,
    /// An empty buffer that was not this server's, taken over: whose.
    pub taken_over: Option<String>,
    /// The owner field could not be read (a format torn by a crash): why.
    pub owner_unreadable: Option<&'static str>,
}

/// True when the file holds no buffer yet (all zero header).
pub fn is_blank(map: &Mapping) -> bool {
    map.len < HEADER_SIZE || map.bytes()[..64].iter().all(|&b| b == 0)
}

/// Checks the header and every record, then (if `write_back`) writes the
/// records into pg_wal and fsyncs the segments they touch.
pub fn restore(map: &Mapping, cluster: &Cluster, write_back: bool) -> Result<Restored, Problem> {
    if is_blank(map) {
        return Ok(Restored::default());
    }
    let bytes = map.bytes();
    if map.len < HEADER_SIZE || bytes[..8] != format::MAGIC {
        return Err(Problem::NotABuffer);
    }
    if !format::header_crc_ok(bytes) {
        return Err(Problem::BadHeader("header checksum mismatch"));
    }
    if format::get_u32(bytes, format::OFF_VERSION) != format::VERSION {
        return Err(Problem::BadHeader("unknown format version"));
    }
    let capacity = format::get_u64(bytes, format::OFF_CAPACITY) as usize;
    let tail = format::get_u64(bytes, format::OFF_TAIL) as usize;
    if HEADER_SIZE + capacity > map.len || tail > capacity {
        return Err(Problem::BadHeader("record area larger than the file"));
    }
    // An owner field torn by a crash during formatting is not needed to
    // restore: unknown, and said so.
    let (owner, owner_unreadable) = match format::owner(bytes) {
        // Every format since the field exists records one (but for a data
        // directory path too long for the header): none in a buffer that
        // holds WAL is said, not passed over.
        Ok(None) if format::get_u64(bytes, format::OFF_TAIL) > 0 => (None, Some("no owner recorded")),
        Ok(owner) => (owner, None),
        Err(why) => (None, Some(why)),
    };
    let system_id = format::get_u64(bytes, format::OFF_SYSTEM_ID);
    let segment_size = format::get_u32(bytes, format::OFF_SEGMENT_SIZE) as u64;
    let empty = tail == 0;
    let taken_over = |whose: String| Ok(Restored { taken_over: Some(whose), owner_unreadable, ..Restored::default() });
    if system_id != cluster.system_id || segment_size != cluster.segment_size {
        // A buffer that holds nothing (drained at a clean stop, before a
        // re-initdb or pg_upgrade that kept the path) costs nothing to take.
        if empty {
            let dir = owner.as_ref().map(|o| format!(" (data directory \"{}\")", o.path)).unwrap_or_default();
            return taken_over(format!("an empty buffer of database system {system_id}{dir}"));
        }
        if system_id != cluster.system_id {
            return Err(Problem::OtherCluster { buffer: system_id, cluster: cluster.system_id });
        }
        return Err(Problem::SegmentSize { buffer: segment_size, cluster: cluster.segment_size });
    }
    // The same directory: same path and inode (a device number may change
    // across a reboot). A buffer of an earlier version names no owner.
    let ours = owner.as_ref().is_none_or(|o| o.path == cluster.data_dir.path && o.ino == cluster.data_dir.ino);
    if let Some(owner) = owner.filter(|_| !ours) {
        // Same system, another data directory: a copy of one of the two
        // (pg_basebackup on the same host inherits the path). Only an empty
        // buffer whose owner no longer holds this system (a data directory
        // moved after a clean stop) is taken.
        if empty && !holds_system(&owner.path, system_id) {
            return taken_over(format!(
                "the empty buffer of data directory \"{}\", which no longer holds this database system",
                owner.path
            ));
        }
        return Err(Problem::OtherDataDirectory { owner: owner.path, empty });
    }
    // This data directory was replaced by a base backup or rewound since
    // the buffer was written: its WAL is not this data directory's.
    if !empty && cluster.from_backup {
        return Err(Problem::ReplacedDataDirectory);
    }

    // Pass 1: every record is intact, on a timeline of this cluster, and
    // its segment file exists.
    let area = &bytes[HEADER_SIZE..HEADER_SIZE + tail];
    let mut writes: Writes = BTreeMap::new();
    let mut offset = 0;
    let mut restored = Restored { owner_unreadable, ..Restored::default() };
    while offset < tail {
        let (record, next) = format::read_record(area, offset)
            .map_err(|e| Problem::Corrupted { offset, checksum: matches!(e, ReadError::BadChecksum) })?;
        if record.tli != cluster.timeline && !history_file_exists(record.tli) {
            return Err(Problem::UnknownTimeline { tli: record.tli, timeline: cluster.timeline });
        }
        let seg = Segment { tli: record.tli, segno: record.lsn / segment_size };
        let in_segment = record.lsn % segment_size;
        if in_segment + record.data.len() as u64 + record.zeros as u64 > segment_size {
            return Err(Problem::Corrupted { offset, checksum: false });
        }
        writes.entry((seg.tli, seg.segno)).or_default().push((in_segment, record.data, record.zeros));
        restored.bytes += record.data.len() as u64 + record.zeros as u64;
        restored.records += 1;
        offset = next;
    }
    if tail > 0 {
        checkpoint_in_restored_wal(cluster, &writes)?;
    }
    let mut files = Vec::new();
    for &(tli, segno) in writes.keys() {
        let seg = Segment { tli, segno };
        let path = seg.path();
        match std::fs::metadata(&path) {
            Ok(m) if m.len() == segment_size => files.push(path),
            _ => return Err(Problem::MissingSegment { name: seg.file_name(segment_size) }),
        }
    }
    restored.segments = files.len();
    if !write_back {
        return Ok(restored);
    }

    // Pass 2: write back, in buffer order within each segment, and fsync.
    for (path, records) in files.iter().zip(writes.values()) {
        let io = |e: std::io::Error| Problem::Io(format!("\"{path}\": {e}"));
        let file = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
        let zero_page = [0u8; 8192];
        for &(in_segment, data, zeros) in records {
            file.write_all_at(data, in_segment).map_err(io)?;
            let mut at = in_segment + data.len() as u64;
            let end = at + zeros as u64;
            while at < end {
                let n = (end - at).min(zero_page.len() as u64) as usize;
                file.write_all_at(&zero_page[..n], at).map_err(io)?;
                at += n as u64;
            }
        }
        file.sync_data().map_err(io)?;
    }
    Ok(restored)
}

type Writes<'a> = BTreeMap<(u32, u64), Vec<(u64, &'a [u8], u32)>>;

/// The run that wrote the buffer's WAL is the one that wrote the latest
/// checkpoint: every WAL byte of a run that uses the buffer goes through
/// it, and the buffer holds all that run wrote since its last real fsync.
/// So the latest checkpoint lies before the buffer's end, and the WAL as
/// the restore would leave it holds, at that position, the checkpoint
/// pg_control names. A run without the buffer after the buffer was last
/// written (the library not loaded, the path emptied) wrote its own
/// end-of-recovery or shutdown checkpoint at or after where the WAL it
/// found ended, over WAL only the buffer had: restoring the buffer then
/// would write stale WAL over that run's.
fn checkpoint_in_restored_wal(cluster: &Cluster, writes: &Writes) -> Result<(), Problem> {
    let stale = Problem::WrittenWithoutBuffer { checkpoint: cluster.checkpoint };
    let buffer_end = writes
        .iter()
        .flat_map(|(&(_, segno), records)| records.iter().map(move |&(at, data, zeros)| (segno, at + data.len() as u64 + zeros as u64)))
        .map(|(segno, end)| segno * cluster.segment_size + end)
        .max()
        .unwrap_or(0);
    if cluster.checkpoint >= buffer_end {
        return Err(stale);
    }
    // Where recovery would read the checkpoint: its timeline's segment, or
    // (after a promotion) the .partial one, or a newer timeline's copy of
    // it. A refusal here would keep a server down whose buffer is all that
    // holds its acknowledged commits: what cannot be read is not evidence.
    let segno = cluster.checkpoint / cluster.segment_size;
    let candidates = checkpoint_timelines(cluster, writes, segno);
    if candidates.is_empty() {
        return Ok(());
    }
    // Any file recovery may read it from will do: the newest timeline's
    // copy is what recovery reads, an older one may be partly streamed.
    for tli in candidates {
        if holds_checkpoint(cluster, writes, tli)? {
            return Ok(());
        }
    }
    Err(stale)
}

/// Whether the WAL of timeline `tli`'s files, as the restore would leave
/// it, holds at the checkpoint's position the checkpoint pg_control names.
fn holds_checkpoint(cluster: &Cluster, writes: &Writes, tli: u32) -> Result<bool, Problem> {
    use pgrx::pg_sys::{
        CheckPoint, XLogRecord, XLR_BLOCK_ID_DATA_LONG, XLR_BLOCK_ID_DATA_SHORT, XLR_BLOCK_ID_ORIGIN,
        XLR_BLOCK_ID_TOPLEVEL_XID,
    };
    // The record header, the blocks a checkpoint record can carry before
    // its main data (a replication origin, a top-level xid: each once, in
    // that order), the main-data header, the CheckPoint.
    let header = std::mem::size_of::<XLogRecord>();
    let size = cluster.checkpoint_copy.len();
    let record = logical_bytes(cluster, writes, tli, cluster.checkpoint, header + 3 + 5 + 5 + size)?;
    if record[std::mem::offset_of!(XLogRecord, xl_rmid)] != pgrx::pg_sys::RmgrIds::RM_XLOG_ID as u8 {
        return Ok(false);
    }
    let mut at = header;
    if record[at] as u32 == XLR_BLOCK_ID_ORIGIN {
        at += 1 + 2;
    }
    if record[at] as u32 == XLR_BLOCK_ID_TOPLEVEL_XID {
        at += 1 + 4;
    }
    let (from, len) = match record[at] as u32 {
        XLR_BLOCK_ID_DATA_SHORT => (at + 2, record[at + 1] as usize),
        XLR_BLOCK_ID_DATA_LONG => (at + 5, u32::from_ne_bytes(record[at + 1..at + 5].try_into().expect("4 bytes")) as usize),
        // A block reference: not a checkpoint record.
        _ => return Ok(false),
    };
    if len != size || from + len > record.len() {
        return Ok(false);
    }
    // Replay keeps pg_control's nextXid at the latest checkpoint record
    // replayed: every other field is the record's own.
    let next_xid = std::mem::offset_of!(CheckPoint, nextXid);
    let xid_end = next_xid + std::mem::size_of::<pgrx::pg_sys::FullTransactionId>();
    let ours = &record[from..from + len];
    let control = &cluster.checkpoint_copy[..];
    Ok(ours[..next_xid] == control[..next_xid] && ours[xid_end..] == control[xid_end..])
}

/// The timelines whose file of segment `segno` may hold the checkpoint
/// record: the checkpoint's own, every newer one this pg_wal knows (a
/// promotion copies the segment of the switch into the new timeline's
/// file; recovery reads the newest), and u32::MAX for the checkpoint
/// timeline's `.partial` file. Empty when no such file is there.
fn checkpoint_timelines(cluster: &Cluster, writes: &Writes, segno: u64) -> Vec<u32> {
    let mut tlis: Vec<u32> = writes.keys().map(|&(tli, _)| tli).collect();
    if let Ok(dir) = std::fs::read_dir(&segment::wal_dir().path) {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(tli) = name.strip_suffix(".history").and_then(|t| u32::from_str_radix(t, 16).ok()) {
                tlis.push(tli);
            }
        }
    }
    tlis.retain(|&t| t > cluster.timeline);
    tlis.sort_unstable_by(|a, b| b.cmp(a));
    tlis.dedup();
    tlis.push(cluster.timeline);
    let mut found: Vec<u32> = tlis.into_iter().filter(|&tli| std::path::Path::new(&Segment { tli, segno }.path()).exists()).collect();
    if std::path::Path::new(&format!("{}.partial", Segment { tli: cluster.timeline, segno }.path())).exists() {
        found.push(u32::MAX);
    }
    found
}

/// `len` bytes of WAL record data from `lsn`, as the restore would leave
/// them (the segment file of timeline `tli`, the buffer's records over it),
/// skipping the page headers between.
fn logical_bytes(cluster: &Cluster, writes: &Writes, tli: u32, lsn: u64, len: usize) -> Result<Vec<u8>, Problem> {
    use crate::flush::{LONG_PAGE_HEADER, SHORT_PAGE_HEADER};
    let page = pgrx::pg_sys::XLOG_BLCKSZ as u64;
    let mut out = Vec::with_capacity(len);
    let mut at = lsn;
    while out.len() < len {
        if at % page == 0 {
            at += if at % cluster.segment_size == 0 { LONG_PAGE_HEADER } else { SHORT_PAGE_HEADER };
            continue;
        }
        // The rest of this page, as far as needed.
        let n = ((page - at % page) as usize).min(len - out.len());
        out.extend_from_slice(&restored_range(cluster, writes, tli, at, n)?);
        at += n as u64;
    }
    Ok(out)
}

/// `n` bytes from `lsn` within one page: the segment file's (u32::MAX: the
/// checkpoint timeline's .partial file), then every buffer record over
/// them, in buffer order (as the restore writes them). Past the file's end
/// (the record may run into a segment not there), zeros.
fn restored_range(cluster: &Cluster, writes: &Writes, tli: u32, lsn: u64, n: usize) -> Result<Vec<u8>, Problem> {
    let segno = lsn / cluster.segment_size;
    let file_tli = if tli == u32::MAX { cluster.timeline } else { tli };
    let whole = Segment { tli: file_tli, segno }.path();
    // A record running into the next segment: that file may have become
    // the old timeline's .partial one at a promotion.
    let path = if tli != u32::MAX && std::path::Path::new(&whole).exists() { whole } else { format!("{whole}.partial") };
    let in_segment = lsn % cluster.segment_size;
    let mut bytes = vec![0u8; n];
    match std::fs::File::open(&path) {
        Ok(f) => {
            f.read_exact_at(&mut bytes, in_segment)
                .map_err(|e| Problem::Io(format!("could not read the latest checkpoint record in \"{path}\": {e}")))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Problem::Io(format!("could not read the latest checkpoint record in \"{path}\": {e}"))),
    }
    for &(at, data, zeros) in writes.get(&(file_tli, segno)).map(Vec::as_slice).unwrap_or_default() {
        let (from, to) = (in_segment, in_segment + n as u64);
        let data_end = at + data.len() as u64;
        for i in from.max(at)..to.min(data_end + zeros as u64) {
            bytes[(i - from) as usize] = if i < data_end { data[(i - at) as usize] } else { 0 };
        }
    }
    Ok(bytes)
}

/// The server's working directory: its resolved path, device and inode.
fn data_directory() -> Result<format::Owner, String> {
    use std::os::unix::fs::MetadataExt;
    let path = std::fs::canonicalize(".").map_err(|e| format!("could not resolve the data directory: {e}"))?;
    let meta = std::fs::metadata(&path).map_err(|e| format!("could not stat the data directory: {e}"))?;
    Ok(format::Owner { path: path.to_string_lossy().into_owned(), dev: meta.dev(), ino: meta.ino() })
}

/// Whether `dir` is the data directory of database system `system_id`.
fn holds_system(dir: &str, system_id: u64) -> bool {
    std::fs::read(format!("{dir}/global/pg_control"))
        .ok()
        .filter(|b| b.len() >= 8)
        .is_some_and(|b| format::get_u64(&b, 0) == system_id)
}

fn history_file_exists(tli: u32) -> bool {
    std::path::Path::new(&format!("{}/{:08X}.history", segment::wal_dir().path, tli)).exists()
}

/// Writes a fresh header for this cluster: an empty buffer.
pub fn format(map: &Mapping, cluster: &Cluster) -> Result<(), String> {
    let capacity = (map.len - HEADER_SIZE) as u64;
    let header = format::new_header(cluster.segment_size as u32, cluster.system_id, capacity, &cluster.data_dir);
    map.write_persist(0, &header)
}

/// The system identifier and the timeline of the last checkpoint, read from
/// global/pg_control (the postmaster's working directory is the data directory).
pub fn read_control_file(segment_size: u64) -> Result<Cluster, String> {
    use pgrx::pg_sys::{CheckPoint, ControlFileData};
    let bytes = std::fs::read("global/pg_control").map_err(|e| format!("could not read \"global/pg_control\": {e}"))?;
    let tli_offset =
        std::mem::offset_of!(ControlFileData, checkPointCopy) + std::mem::offset_of!(CheckPoint, ThisTimeLineID);
    if bytes.len() < tli_offset + 4 {
        return Err("\"global/pg_control\" is too short".into());
    }
    let copy_offset = std::mem::offset_of!(ControlFileData, checkPointCopy);
    let copy_end = copy_offset + std::mem::size_of::<CheckPoint>();
    if bytes.len() < copy_end {
        return Err("\"global/pg_control\" is too short".into());
    }
    let data_dir = data_directory()?;
    Ok(Cluster {
        system_id: format::get_u64(&bytes, std::mem::offset_of!(ControlFileData, system_identifier)),
        segment_size,
        timeline: format::get_u32(&bytes, tli_offset),
        data_dir,
        from_backup: std::path::Path::new("backup_label").exists(),
        checkpoint: format::get_u64(&bytes, std::mem::offset_of!(ControlFileData, checkPoint)),
        checkpoint_copy: bytes[copy_offset..copy_end].to_vec(),
    })
}

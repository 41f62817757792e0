//! WAL segment files: naming, parsing, positions, syncing by name.

use std::ffi::CString;
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Segment {
    pub tli: u32,
    pub segno: u64,
}

/// The canonical path of pg_wal (it may be a symlink) and the segment size,
/// fixed in the postmaster before any child exists.
pub struct WalDir {
    pub path: String,
    pub segment_size: u64,
}
static WAL_DIR: OnceLock<WalDir> = OnceLock::new();

pub fn set_wal_dir(path: String, segment_size: u64) {
    let _ = WAL_DIR.set(WalDir { path, segment_size });
}

pub fn wal_dir() -> &'static WalDir {
    WAL_DIR.get().expect("pg_wal location set at startup")
}

fn segments_per_log_id(segment_size: u64) -> u64 {
    0x1_0000_0000 / segment_size
}

impl Segment {
    /// WAL position of the segment's first byte.
    pub fn start_lsn(&self, segment_size: u64) -> u64 {
        self.segno * segment_size
    }

    pub fn file_name(&self, segment_size: u64) -> String {
        let per = segments_per_log_id(segment_size);
        format!("{:08X}{:08X}{:08X}", self.tli, self.segno / per, self.segno % per)
    }

    pub fn path(&self) -> String {
        let dir = wal_dir();
        format!("{}/{}", dir.path, self.file_name(dir.segment_size))
    }

    /// Parses a 24-hex-digit segment file name.
    pub fn parse(name: &[u8], segment_size: u64) -> Option<Segment> {
        if name.len() != 24 || !name.iter().all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c)) {
            return None;
        }
        let hex = |s: &[u8]| u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok();
        let tli = hex(&name[0..8])? as u32;
        let log = hex(&name[8..16])?;
        let seg = hex(&name[16..24])?;
        Some(Segment { tli, segno: log * segments_per_log_id(segment_size) + seg })
    }

    /// The segment a resolved file path names, if it is a segment in pg_wal.
    pub fn from_path(path: &[u8]) -> Option<Segment> {
        let dir = WAL_DIR.get()?;
        let rest = path.strip_prefix(dir.path.as_bytes())?.strip_prefix(b"/")?;
        Segment::parse(rest, dir.segment_size)
    }

    /// fdatasync()s the segment's file, opened by name. Returns 0 or an errno.
    pub fn sync_by_name(&self) -> i32 {
        let Ok(path) = CString::new(self.path()) else { return libc::EINVAL };
        // SAFETY: plain libc calls on a NUL-terminated path and the fd they return.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 {
                return *libc::__errno_location();
            }
            let rc = libc::fdatasync(fd);
            let err = if rc != 0 { *libc::__errno_location() } else { 0 };
            libc::close(fd);
            err
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let seg = Segment { tli: 3, segno: 0x1_0000_0005 };
        let size = 16 * 1024 * 1024;
        let name = seg.file_name(size);
        assert_eq!(Segment::parse(name.as_bytes(), size), Some(seg));
        assert_eq!(Segment { tli: 1, segno: 1 }.file_name(size), "000000010000000000000001");
        assert_eq!(Segment::parse(b"000000010000000100000002", size), Some(Segment { tli: 1, segno: 256 + 2 }));
        assert_eq!(Segment::parse(b"xlogtemp.123", size), None);
        assert_eq!(Segment::parse(b"00000001000000000000000g", size), None);
    }
}

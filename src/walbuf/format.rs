//! Layout of the buffer file. Little-endian and fixed, documented in
//! docs/internals.md ("File format") so that tests and tools can
//! read a buffer without this code.
//!
//! A 4 kB header is followed by the record area. Records are appended one
//! after another from the start of the area; `tail` (in the header) says how
//! many bytes of the area are complete. A record is only counted once its
//! bytes are persistent, so bytes past `tail` (a torn last record) are never
//! read. A drain sets `tail` back to 0.

pub const MAGIC: [u8; 8] = *b"DDWALBUF";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 4096;

/// Header fields (byte offsets).
pub const OFF_MAGIC: usize = 0;
pub const OFF_VERSION: usize = 8;
pub const OFF_SEGMENT_SIZE: usize = 12;
pub const OFF_SYSTEM_ID: usize = 16;
pub const OFF_CAPACITY: usize = 24;
/// CRC32C of bytes 0..32 (the fields that never change after formatting).
pub const OFF_HEADER_CRC: usize = 32;
pub const OFF_TAIL: usize = 40;
/// WAL position up to which pg_wal was fsynced at the last drain, and its timeline.
pub const OFF_SYNCED_LSN: usize = 48;
pub const OFF_SYNCED_TLI: usize = 56;
/// The data directory of the server that formatted the buffer (its owner):
/// path length, CRC32C of the device, inode and path, the device and inode
/// of the directory, then the path's bytes. Zero length in a buffer
/// formatted before the field existed: no owner recorded.
pub const OFF_OWNER_LEN: usize = 64;
pub const OFF_OWNER_CRC: usize = 68;
pub const OFF_OWNER_DEV: usize = 72;
pub const OFF_OWNER_INO: usize = 80;
pub const OFF_OWNER: usize = 128;
pub const MAX_OWNER_LEN: usize = HEADER_SIZE - OFF_OWNER;
const FIXED_FIELDS_END: usize = 32;

/// Record header: lsn u64, len u32, tli u32, crc u32, zeros u32; then
/// `len` bytes of WAL, padded to 8 bytes, which are followed in the WAL by
/// `zeros` zero bytes (the unused rest of a page PostgreSQL writes whole).
/// The CRC covers lsn, len, tli, zeros and the data.
pub const RECORD_HEADER_SIZE: usize = 24;

pub fn record_size(data_len: usize) -> usize {
    RECORD_HEADER_SIZE + data_len.div_ceil(8) * 8
}

pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// The data directory a buffer belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct Owner {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
}

fn owner_crc(h: &[u8], path: &[u8]) -> u32 {
    crc32c(crc32c(0, &h[OFF_OWNER_DEV..OFF_OWNER_INO + 8]), path)
}

/// A fresh header: identity fields, their CRC, empty record area, and the
/// owner (a path too long for the header is recorded as none).
pub fn new_header(segment_size: u32, system_id: u64, capacity: u64, owner: &Owner) -> Vec<u8> {
    let path = if owner.path.len() <= MAX_OWNER_LEN { owner.path.as_bytes() } else { &[] };
    let mut h = vec![0u8; OFF_OWNER + path.len()];
    h[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC);
    put_u32(&mut h, OFF_VERSION, VERSION);
    put_u32(&mut h, OFF_SEGMENT_SIZE, segment_size);
    put_u64(&mut h, OFF_SYSTEM_ID, system_id);
    put_u64(&mut h, OFF_CAPACITY, capacity);
    let crc = crc32c(0, &h[..FIXED_FIELDS_END]);
    put_u32(&mut h, OFF_HEADER_CRC, crc);
    if !path.is_empty() {
        put_u32(&mut h, OFF_OWNER_LEN, path.len() as u32);
        put_u64(&mut h, OFF_OWNER_DEV, owner.dev);
        put_u64(&mut h, OFF_OWNER_INO, owner.ino);
        h[OFF_OWNER..].copy_from_slice(path);
        let crc = owner_crc(&h, path);
        put_u32(&mut h, OFF_OWNER_CRC, crc);
    }
    h
}

/// The owner; None when none is recorded. Err when the field does not
/// check out (a format torn by a crash): the owner is then unknown.
pub fn owner(h: &[u8]) -> Result<Option<Owner>, &'static str> {
    let len = get_u32(h, OFF_OWNER_LEN) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > MAX_OWNER_LEN || h.len() < OFF_OWNER + len {
        return Err("invalid owner length");
    }
    let path = &h[OFF_OWNER..OFF_OWNER + len];
    if owner_crc(h, path) != get_u32(h, OFF_OWNER_CRC) {
        return Err("owner checksum mismatch");
    }
    let path = std::str::from_utf8(path).map_err(|_| "owner is not a path")?;
    Ok(Some(Owner { path: path.to_string(), dev: get_u64(h, OFF_OWNER_DEV), ino: get_u64(h, OFF_OWNER_INO) }))
}

pub fn header_crc_ok(h: &[u8]) -> bool {
    crc32c(0, &h[..FIXED_FIELDS_END]) == get_u32(h, OFF_HEADER_CRC)
}

/// The record header for `data` (then `zeros` zero bytes) written at WAL
/// position `lsn` on timeline `tli`.
pub fn record_header(lsn: u64, tli: u32, data: &[u8], zeros: u32) -> [u8; RECORD_HEADER_SIZE] {
    let mut r = [0u8; RECORD_HEADER_SIZE];
    put_u64(&mut r, 0, lsn);
    put_u32(&mut r, 8, data.len() as u32);
    put_u32(&mut r, 12, tli);
    put_u32(&mut r, 20, zeros);
    let crc = record_crc(&r, data);
    put_u32(&mut r, 16, crc);
    r
}

fn record_crc(header: &[u8], data: &[u8]) -> u32 {
    crc32c(crc32c(crc32c(0, &header[..16]), &header[20..24]), data)
}

/// One record read back from the area.
pub struct Record<'a> {
    pub lsn: u64,
    pub tli: u32,
    pub data: &'a [u8],
    pub zeros: u32,
}

pub enum ReadError {
    /// The record claims more bytes than the committed area holds.
    Truncated,
    /// The checksum does not match: the bytes changed after they were persisted.
    BadChecksum,
}

/// Reads the record at `offset` of the committed area `area`; returns it and
/// the offset of the next one.
pub fn read_record(area: &[u8], offset: usize) -> Result<(Record<'_>, usize), ReadError> {
    if offset + RECORD_HEADER_SIZE > area.len() {
        return Err(ReadError::Truncated);
    }
    let h = &area[offset..offset + RECORD_HEADER_SIZE];
    let len = get_u32(h, 8) as usize;
    let next = offset + record_size(len);
    if next > area.len() {
        return Err(ReadError::Truncated);
    }
    let data = &area[offset + RECORD_HEADER_SIZE..offset + RECORD_HEADER_SIZE + len];
    if record_crc(h, data) != get_u32(h, 16) {
        return Err(ReadError::BadChecksum);
    }
    Ok((Record { lsn: get_u64(h, 0), tli: get_u32(h, 12), data, zeros: get_u32(h, 20) }, next))
}

/// CRC-32C (Castagnoli), the checksum PostgreSQL uses for WAL records.
/// `crc` is the running value (0 to start).
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE4.2, checked just above.
            return unsafe { crc32c_sse42(crc, data) };
        }
    }
    crc32c_table(crc, data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = !crc as u64;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        c = _mm_crc32_u64(c, u64::from_le_bytes(chunk.try_into().unwrap()));
    }
    let mut c = c as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

fn crc32c_table(crc: u32, data: &[u8]) -> u32 {
    const fn table() -> [u32; 256] {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    }
    static TABLE: [u32; 256] = table();
    let mut c = !crc;
    for &b in data {
        c = TABLE[((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_table(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(crc32c(0, b"1234"), b"56789"), 0xE306_9283);
    }

    #[test]
    fn owner_round_trip() {
        let me = Owner { path: "/var/lib/postgresql/15/main".into(), dev: 2049, ino: 131_075 };
        let h = new_header(16 << 20, 42, 1 << 20, &me);
        let mut page = vec![0u8; HEADER_SIZE];
        page[..h.len()].copy_from_slice(&h);
        assert!(header_crc_ok(&page));
        assert_eq!(owner(&page), Ok(Some(me.clone())));
        page[OFF_OWNER + 3] ^= 1;
        assert_eq!(owner(&page), Err("owner checksum mismatch"));
        page[OFF_OWNER + 3] ^= 1;
        page[OFF_OWNER_INO] ^= 1;
        assert_eq!(owner(&page), Err("owner checksum mismatch"));
        // A header written before the field existed, or a path too long.
        let none = Owner { path: "x".repeat(MAX_OWNER_LEN + 1), dev: 1, ino: 1 };
        for h in [new_header(16 << 20, 42, 1 << 20, &none)] {
            let mut page = vec![0u8; HEADER_SIZE];
            page[..h.len()].copy_from_slice(&h);
            assert_eq!(owner(&page), Ok(None));
        }
    }

    #[test]
    fn record_round_trip_and_corruption() {
        let data = b"some wal bytes";
        let mut area = Vec::new();
        area.extend_from_slice(&record_header(0x0100_0028, 1, data, 100));
        area.extend_from_slice(data);
        area.resize(record_size(data.len()), 0);
        let (r, next) = read_record(&area, 0).ok().unwrap();
        assert_eq!((r.lsn, r.tli, r.data, r.zeros, next), (0x0100_0028, 1, &data[..], 100, area.len()));
        area[RECORD_HEADER_SIZE + 3] ^= 1;
        assert!(matches!(read_record(&area, 0), Err(ReadError::BadChecksum)));
        assert!(matches!(read_record(&area[..10], 0), Err(ReadError::Truncated)));
    }
}

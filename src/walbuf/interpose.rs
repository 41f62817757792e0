//! Redirecting the postgres executable's calls to `pwrite`, `fdatasync` and
//! `close` to the wrappers below.
//!
//! PostgreSQL has no hook around its WAL writes: XLogWrite calls libc's
//! `pwrite` and `issue_xlog_fsync` calls `fdatasync`, both under
//! WALWriteLock. The executable reaches libc through its global offset
//! table (GOT); rewriting three GOT slots in the postmaster, before any child
//! is forked, redirects those calls in every server process. The wrappers
//! act only on WAL segment files in pg_wal while WALWriteLock is held, and
//! call libc unchanged otherwise.

use super::segment::Segment;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};

#[cfg(target_arch = "x86_64")]
const RELOCATION_TYPES: [u32; 2] = [6 /* R_X86_64_GLOB_DAT */, 7 /* R_X86_64_JUMP_SLOT */];
#[cfg(target_arch = "aarch64")]
const RELOCATION_TYPES: [u32; 2] = [1025 /* R_AARCH64_GLOB_DAT */, 1026 /* R_AARCH64_JUMP_SLOT */];
// Elsewhere nothing matches and install() reports the platform as unsupported.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const RELOCATION_TYPES: [u32; 0] = [];

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;

#[repr(C)]
struct Elf64Dyn {
    tag: i64,
    val: u64,
}
#[repr(C)]
struct Elf64Rela {
    offset: u64,
    info: u64,
    addend: i64,
}
#[repr(C)]
struct Elf64Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Where the main executable's GOT slots for the three functions are.
#[derive(Default)]
struct Slots {
    pwrite: Vec<*mut usize>,
    fdatasync: Vec<*mut usize>,
    close: Vec<*mut usize>,
}

unsafe extern "C" fn visit_main_program(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info for each loaded object,
    // the main program first; data is the &mut Slots given below. The
    // dynamic section and the tables it points to are mapped read-only.
    unsafe {
        let slots = &mut *(data as *mut Slots);
        let info = &*info;
        let base = info.dlpi_addr as usize;
        let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
        let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else { return 1 };
        // glibc may already have relocated the table addresses in place.
        let addr = |v: u64| if (v as usize) < base { base + v as usize } else { v as usize };
        let (mut strtab, mut symtab, mut tables) = (0usize, 0usize, [(0usize, 0usize); 2]);
        let mut d = (base + dynamic.p_vaddr as usize) as *const Elf64Dyn;
        while (*d).tag != DT_NULL {
            match (*d).tag {
                DT_STRTAB => strtab = addr((*d).val),
                DT_SYMTAB => symtab = addr((*d).val),
                DT_JMPREL => tables[0].0 = addr((*d).val),
                DT_PLTRELSZ => tables[0].1 = (*d).val as usize,
                DT_RELA => tables[1].0 = addr((*d).val),
                DT_RELASZ => tables[1].1 = (*d).val as usize,
                _ => {}
            }
            d = d.add(1);
        }
        if strtab == 0 || symtab == 0 {
            return 1;
        }
        for (table, size) in tables {
            if table == 0 {
                continue;
            }
            let relas = std::slice::from_raw_parts(table as *const Elf64Rela, size / size_of::<Elf64Rela>());
            for rela in relas {
                if !RELOCATION_TYPES.contains(&((rela.info & 0xffff_ffff) as u32)) {
                    continue;
                }
                let sym = &*(symtab as *const Elf64Sym).add((rela.info >> 32) as usize);
                let name = CStr::from_ptr((strtab + sym.name as usize) as *const c_char).to_bytes();
                let slot = (base + rela.offset as usize) as *mut usize;
                match name {
                    b"pwrite" | b"pwrite64" => slots.pwrite.push(slot),
                    b"fdatasync" => slots.fdatasync.push(slot),
                    b"close" => slots.close.push(slot),
                    _ => {}
                }
            }
        }
        1 // only the main program
    }
}

/// Points the executable's GOT slots at the wrappers. Returns a message on failure.
pub fn install() -> Result<(), String> {
    let mut slots = Slots::default();
    // SAFETY: the callback only reads the loader's tables (see visit_main_program).
    unsafe { libc::dl_iterate_phdr(Some(visit_main_program), &mut slots as *mut Slots as *mut c_void) };
    if slots.pwrite.is_empty() || slots.fdatasync.is_empty() || slots.close.is_empty() {
        return Err("the postgres executable's calls to pwrite, fdatasync and close were not found".into());
    }
    let targets = [
        (&slots.pwrite, wal_pwrite as *const () as usize),
        (&slots.fdatasync, wal_fdatasync as *const () as usize),
        (&slots.close, tracked_close as *const () as usize),
    ];
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    for (list, target) in targets {
        for &slot in list {
            // SAFETY: each slot is a GOT entry of the main program (found
            // above). Only the postmaster runs this, before forking any child.
            unsafe { write_slot(slot, target, page)? };
        }
    }
    Ok(())
}

/// Stores `target` in the GOT slot `slot`, leaving its page's protection as
/// it was. With full RELRO (BIND_NOW, as in distribution packages) the GOT
/// is read-only after relocation and is made writable for the store only.
/// Without it (a plain source build) the slot is in a writable .got.plt
/// that may share its page with .data: that page is written as it is,
/// since making it read-only afterwards would crash the next lazy binding
/// or write to a global there.
///
/// # Safety
/// `slot` must be a GOT entry of this process and `page` the page size.
unsafe fn write_slot(slot: *mut usize, target: usize, page: usize) -> Result<(), String> {
    let start = (slot as usize) & !(page - 1);
    let prot = page_protection(start)?;
    if prot & libc::PROT_WRITE != 0 {
        // SAFETY: a writable GOT entry (the caller's promise).
        unsafe { std::ptr::write_volatile(slot, target) };
        return Ok(());
    }
    // SAFETY: `start` is the page of a mapped GOT entry; only its write
    // permission is added, and the exact previous protection put back.
    unsafe {
        if libc::mprotect(start as *mut c_void, page, prot | libc::PROT_WRITE) != 0 {
            return Err(format!("mprotect of the GOT failed: {}", std::io::Error::last_os_error()));
        }
        std::ptr::write_volatile(slot, target);
        if libc::mprotect(start as *mut c_void, page, prot) != 0 {
            return Err(format!("restoring the GOT's protection failed: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The current protection (PROT_* bits) of the page at `addr` in this process.
fn page_protection(addr: usize) -> Result<c_int, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| format!("could not read /proc/self/maps: {e}"))?;
    protection_in_maps(&maps, addr).ok_or_else(|| format!("no mapping in /proc/self/maps contains address {addr:#x}"))
}

/// The protection of the mapping that contains `addr`, from the text of
/// /proc/self/maps, whose lines read
/// `55d0c4c10000-55d0c4c20000 rw-p 0040f000 fe:00 1234 /usr/lib/postgresql/15/bin/postgres`
/// (hex range, end excluded; then r/w/x and p(rivate) or s(hared)).
fn protection_in_maps(maps: &str, addr: usize) -> Option<c_int> {
    let parse = |line: &str| -> Option<c_int> {
        let mut fields = line.split_whitespace();
        let (range, perms) = (fields.next()?, fields.next()?.as_bytes());
        let (start, end) = range.split_once('-')?;
        let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
        if !(start..end).contains(&addr) || perms.len() < 3 {
            return None;
        }
        let bit = |i: usize, c: u8, prot: c_int| if perms[i] == c { prot } else { libc::PROT_NONE };
        Some(bit(0, b'r', libc::PROT_READ) | bit(1, b'w', libc::PROT_WRITE) | bit(2, b'x', libc::PROT_EXEC))
    };
    maps.lines().find_map(parse)
}

/// Per-process map from open file descriptors to the WAL segments they
/// are, so that the wrappers resolve a descriptor's path once, not per
/// call. Entries leave when PostgreSQL closes the descriptor.
struct FdCache(Cell<[(c_int, Segment); 4]>);
// SAFETY: a PostgreSQL server process runs this code on one thread only.
unsafe impl Sync for FdCache {}
const NO_FD: (c_int, Segment) = (-1, Segment { tli: 0, segno: 0 });
static FD_CACHE: FdCache = FdCache(Cell::new([NO_FD; 4]));

fn segment_of(fd: c_int) -> Option<Segment> {
    let mut cache = FD_CACHE.0.get();
    if let Some(&(_, seg)) = cache.iter().find(|(f, _)| *f == fd) {
        return Some(seg);
    }
    let link = format!("/proc/self/fd/{fd}\0");
    let mut target = [0u8; 4096];
    // SAFETY: NUL-terminated link path, and a buffer of the given size.
    let n = unsafe { libc::readlink(link.as_ptr() as *const c_char, target.as_mut_ptr() as *mut c_char, target.len()) };
    if n <= 0 {
        return None;
    }
    let seg = Segment::from_path(&target[..n as usize])?;
    cache.rotate_right(1);
    cache[0] = (fd, seg);
    FD_CACHE.0.set(cache);
    Some(seg)
}

fn wal_write_lock_held() -> bool {
    // SAFETY: MainLWLockArray[8] is WALWriteLock (storage/lwlocknames.h);
    // LWLockHeldByMe only scans this process's list of held locks.
    unsafe {
        let array = pgrx::pg_sys::MainLWLockArray;
        !array.is_null() && pgrx::pg_sys::LWLockHeldByMe(&raw mut (*array.add(8)).lock)
    }
}

/// The WAL segment `fd` writes to, when this is a WAL write or fsync.
fn wal_segment(fd: c_int) -> Option<Segment> {
    if !super::active() || !wal_write_lock_held() {
        return None;
    }
    segment_of(fd)
}

fn set_errno(err: i32) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = err };
}

unsafe extern "C" fn wal_pwrite(fd: c_int, buf: *const c_void, count: usize, offset: libc::off_t) -> isize {
    if let Some(seg) = wal_segment(fd) {
        // SAFETY: buf/count are what PostgreSQL passes to pwrite.
        let data = unsafe { std::slice::from_raw_parts(buf as *const u8, count) };
        if let Err(err) = super::with_ring(|ring| ring.before_write(fd, seg, data, offset as u64)) {
            set_errno(err);
            return -1;
        }
    }
    // SAFETY: the call PostgreSQL made, unchanged.
    unsafe { libc::pwrite(fd, buf, count, offset) }
}

unsafe extern "C" fn wal_fdatasync(fd: c_int) -> c_int {
    if let Some(seg) = wal_segment(fd) {
        match super::with_ring(|ring| Ok(ring.on_fsync(seg))) {
            Ok(super::ring::SyncDecision::Skip) => {
                super::uncount_wal_sync();
                return 0;
            }
            Ok(super::ring::SyncDecision::Real { drains: true }) => {
                // SAFETY: the call PostgreSQL made.
                let rc = unsafe { libc::fdatasync(fd) };
                if rc == 0 {
                    if let Err(err) = super::with_ring(|ring| ring.drained()) {
                        set_errno(err);
                        return -1;
                    }
                }
                return rc;
            }
            _ => {}
        }
    }
    // SAFETY: the call PostgreSQL made, unchanged.
    unsafe { libc::fdatasync(fd) }
}

unsafe extern "C" fn tracked_close(fd: c_int) -> c_int {
    let mut cache = FD_CACHE.0.get();
    for entry in cache.iter_mut().filter(|(f, _)| *f == fd) {
        *entry = NO_FD;
    }
    FD_CACHE.0.set(cache);
    // SAFETY: the call PostgreSQL made, unchanged.
    unsafe { libc::close(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE};

    #[test]
    fn protection_from_maps_text() {
        // A lazily bound executable: .got.plt and .data share the rw-p mapping.
        let maps = "\
55d0c4800000-55d0c4a00000 r-xp 00000000 fe:00 1234 /usr/local/pgsql/bin/postgres
55d0c4c00000-55d0c4c10000 r--p 00400000 fe:00 1234 /usr/local/pgsql/bin/postgres
55d0c4c10000-55d0c4c20000 rw-p 00410000 fe:00 1234 /usr/local/pgsql/bin/postgres
55d0c4c20000-55d0c4c21000 ---p 00000000 00:00 0
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(protection_in_maps(maps, 0x55d0_c480_0000), Some(PROT_READ | PROT_EXEC));
        assert_eq!(protection_in_maps(maps, 0x55d0_c4c0_fff8), Some(PROT_READ));
        assert_eq!(protection_in_maps(maps, 0x55d0_c4c1_0000), Some(PROT_READ | PROT_WRITE)); // end excluded
        assert_eq!(protection_in_maps(maps, 0x55d0_c4c1_8010), Some(PROT_READ | PROT_WRITE));
        assert_eq!(protection_in_maps(maps, 0x55d0_c4c2_0000), Some(PROT_NONE));
        assert_eq!(protection_in_maps(maps, 0x7ffd_1c02_0fff), Some(PROT_READ | PROT_WRITE));
        assert_eq!(protection_in_maps(maps, 0x1000), None);
        assert_eq!(protection_in_maps(maps, 0x55d0_c4a0_0000), None); // between mappings
        assert_eq!(protection_in_maps("", 0x1000), None);
    }

    fn anonymous_page(page: usize) -> *mut c_void {
        // SAFETY: a fresh private anonymous mapping, owned by the test.
        let addr = unsafe {
            libc::mmap(std::ptr::null_mut(), page, PROT_READ | PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(addr, libc::MAP_FAILED);
        addr
    }

    /// Against the real /proc/self/maps of this process.
    #[test]
    fn protection_of_a_real_page() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let addr = anonymous_page(page);
        assert_eq!(page_protection(addr as usize), Ok(PROT_READ | PROT_WRITE));
        // SAFETY: the test's own mapping.
        assert_eq!(unsafe { libc::mprotect(addr, page, PROT_READ) }, 0);
        assert_eq!(page_protection(addr as usize + 8), Ok(PROT_READ));
        // SAFETY: as above; not used afterwards.
        unsafe { libc::munmap(addr, page) };
    }

    /// write_slot stores the value and leaves the page's protection as it
    /// found it: a writable page stays writable (the lazily bound case), a
    /// read-only one (full RELRO) is read-only again.
    #[test]
    fn write_slot_keeps_the_page_protection() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let addr = anonymous_page(page);
        let slot = (addr as usize + 16) as *mut usize;
        // SAFETY: the slot lies in the test's own mapping.
        unsafe { write_slot(slot, 0x1234, page) }.unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { slot.read_volatile() }, 0x1234);
        assert_eq!(page_protection(addr as usize), Ok(PROT_READ | PROT_WRITE));
        // SAFETY: the test's own mapping.
        assert_eq!(unsafe { libc::mprotect(addr, page, PROT_READ) }, 0);
        // SAFETY: the slot lies in the test's own mapping.
        unsafe { write_slot(slot, 0x5678, page) }.unwrap();
        // SAFETY: as above (readable).
        assert_eq!(unsafe { slot.read_volatile() }, 0x5678);
        assert_eq!(page_protection(addr as usize), Ok(PROT_READ));
        // SAFETY: as above; not used afterwards.
        unsafe { libc::munmap(addr, page) };
    }
}

//! The few libpmem (PMDK) functions the buffer needs, and a mapping type
//! that persists ranges the right way for the medium it sits on.

use std::ffi::{c_char, c_int, c_void, CStr};

const PMEM_FILE_CREATE: c_int = 1;

#[link(name = "pmem")]
extern "C" {
    fn pmem_map_file(
        path: *const c_char,
        len: usize,
        flags: c_int,
        mode: libc::mode_t,
        mapped_lenp: *mut usize,
        is_pmemp: *mut c_int,
    ) -> *mut c_void;
    fn pmem_unmap(addr: *mut c_void, len: usize) -> c_int;
    fn pmem_persist(addr: *const c_void, len: usize);
    fn pmem_msync(addr: *const c_void, len: usize) -> c_int;
    fn pmem_memcpy_persist(dest: *mut c_void, src: *const c_void, len: usize) -> *mut c_void;
    fn pmem_errormsg() -> *const c_char;
}

/// A mapped buffer file. Created in the postmaster; every server process
/// inherits the mapping (MAP_SHARED) through fork.
#[derive(Clone, Copy)]
pub struct Mapping {
    pub addr: *mut u8,
    pub len: usize,
    /// True on real persistent memory (cache flushes make stores durable);
    /// false elsewhere (msync does).
    pub is_pmem: bool,
}

fn last_error() -> String {
    // SAFETY: pmem_errormsg returns a thread-local NUL-terminated string.
    unsafe { CStr::from_ptr(pmem_errormsg()) }.to_string_lossy().into_owned()
}

/// Maps an existing file at its own size (`create_len` = None) or creates /
/// resizes it to `create_len` bytes with mode 0600.
pub fn map(path: &CStr, create_len: Option<usize>) -> Result<Mapping, String> {
    let (len, flags) = match create_len {
        Some(len) => (len, PMEM_FILE_CREATE),
        None => (0, 0),
    };
    let mut mapped_len = 0usize;
    let mut is_pmem: c_int = 0;
    // SAFETY: path is NUL-terminated; the out-pointers are valid locals.
    let addr = unsafe { pmem_map_file(path.as_ptr(), len, flags, 0o600, &mut mapped_len, &mut is_pmem) };
    if addr.is_null() {
        return Err(last_error());
    }
    Ok(Mapping { addr: addr as *mut u8, len: mapped_len, is_pmem: is_pmem != 0 })
}

impl Mapping {
    pub fn unmap(self) {
        // SAFETY: addr/len come from pmem_map_file and the mapping is not used afterwards.
        unsafe { pmem_unmap(self.addr as *mut c_void, self.len) };
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping stays valid for the life of the process.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// Copies `src` to `offset` and makes it durable before returning.
    pub fn write_persist(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        assert!(offset + src.len() <= self.len);
        // SAFETY: the range lies inside the mapping (asserted); src is a valid slice.
        unsafe {
            let dest = self.addr.add(offset);
            if self.is_pmem {
                pmem_memcpy_persist(dest as *mut c_void, src.as_ptr() as *const c_void, src.len());
            } else {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dest, src.len());
                if pmem_msync(dest as *const c_void, src.len()) != 0 {
                    return Err(last_error());
                }
            }
        }
        Ok(())
    }

    /// Makes an already-written range durable.
    pub fn persist(&self, offset: usize, len: usize) -> Result<(), String> {
        assert!(offset + len <= self.len);
        // SAFETY: the range lies inside the mapping (asserted).
        unsafe {
            let addr = self.addr.add(offset) as *const c_void;
            if self.is_pmem {
                pmem_persist(addr, len);
            } else if pmem_msync(addr, len) != 0 {
                return Err(last_error());
            }
        }
        Ok(())
    }
}

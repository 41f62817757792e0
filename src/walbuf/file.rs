//! The buffer file before it is mapped: the file system it lives on.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// statfs `f_type` of the file systems that keep their files in memory only.
const TMPFS_MAGIC: u32 = 0x0102_1994;
const RAMFS_MAGIC: u32 = 0x8584_58f6;

/// The name of the file system with this statfs `f_type` when its content
/// does not survive a power cut.
pub fn volatile_kind(f_type: u32) -> Option<&'static str> {
    match f_type {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// Whether `path` (followed if a symlink) is on a file system that loses
/// its content at a power cut: Some(its name).
pub fn volatile_file_system(path: &Path) -> Result<Option<&'static str>, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a NUL-terminated path and a buffer of the type statfs fills.
    if unsafe { libc::statfs(c_path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: statfs succeeded, so it filled the buffer.
    let f_type = unsafe { st.assume_init() }.f_type;
    // f_type is a signed long; the magic numbers are 32-bit.
    Ok(volatile_kind(f_type as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_magic_numbers() {
        assert_eq!(volatile_kind(0x0102_1994), Some("tmpfs"));
        assert_eq!(volatile_kind(0x8584_58f6), Some("ramfs"));
        assert_eq!(volatile_kind(0xEF53), None); // ext4
        assert_eq!(volatile_kind(0x5846_5342), None); // xfs
        // A signed f_type (as statfs returns it on 64-bit) still matches.
        assert_eq!(volatile_kind(0x8584_58f6_i64 as u32), Some("ramfs"));
    }

    #[test]
    fn dev_shm_is_volatile_when_mounted_as_tmpfs() {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let shm_is_tmpfs = mounts.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"/dev/shm") && fields.get(2) == Some(&"tmpfs")
        });
        if shm_is_tmpfs {
            assert_eq!(volatile_file_system(Path::new("/dev/shm")), Ok(Some("tmpfs")));
        }
        assert!(volatile_file_system(Path::new("/no/such/directory")).is_err());
    }
}

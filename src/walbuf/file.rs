//! The buffer file before it is mapped: the file system it lives on, and
//! the lock that makes it one server's.
//!
//! The lock is a `flock()` on a descriptor the postmaster opens once and
//! never closes. flock locks belong to the open file description, not to
//! the process: every child forked afterwards shares it, so the lock is
//! held while any process of the server lives, and closing another
//! descriptor of the same file (libpmem opens and closes its own in
//! `pmem_map_file`) does not release it, as it would a POSIX `fcntl` lock.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{Metadata, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, IntoRawFd};
use std::path::Path;
use std::time::{Duration, Instant};

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

/// Who holds the lock, as far as this process can see.
#[derive(Debug)]
pub struct Holder {
    pub pid: i32,
    /// The holder's working directory: a postmaster's is its data directory.
    pub data_dir: Option<String>,
}

#[derive(Debug)]
pub enum LockError {
    /// Another open file description holds the lock (holder if found).
    Held(Option<Holder>),
    Io(String),
}

/// Opens `path` (created empty with mode 0600 when missing) and takes an
/// exclusive flock on it, retrying for `patience`: a server that was just
/// stopped may still have a last process exiting (the logging collector
/// outlives the postmaster by a moment and shares its descriptor). On
/// success the descriptor is deliberately never closed.
pub fn lock(path: &CStr, patience: Duration) -> Result<(), LockError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .open(OsStr::from_bytes(path.to_bytes()))
        .map_err(|e| LockError::Io(format!("could not open it: {e}")))?;
    let deadline = Instant::now() + patience;
    loop {
        // SAFETY: flock on a descriptor owned by `file`.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            // The lock lives as long as this open file description: keep it
            // open for the life of the process (O_CLOEXEC, so programs the
            // server runs, such as archive_command, do not inherit it).
            let _ = file.into_raw_fd();
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EWOULDBLOCK) if Instant::now() >= deadline => {
                return Err(LockError::Held(file.metadata().ok().and_then(|m| holder(&m))));
            }
            Some(libc::EWOULDBLOCK) => std::thread::sleep(Duration::from_millis(100)),
            Some(libc::EINTR) => {}
            _ => return Err(LockError::Io(format!("could not lock it: {err}"))),
        }
    }
}

/// The process holding a flock write lock on the file, from /proc/locks,
/// and its working directory when readable (same user).
fn holder(meta: &Metadata) -> Option<Holder> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let dev = meta.dev();
    let pid = flock_writer(&locks, libc::major(dev), libc::minor(dev), meta.ino())?;
    let data_dir = std::fs::read_link(format!("/proc/{pid}/cwd")).ok().map(|d| d.to_string_lossy().into_owned());
    Some(Holder { pid, data_dir })
}

/// The pid holding a FLOCK WRITE lock on inode `ino` of device
/// `major`:`minor`, from the text of /proc/locks. Its lines read
/// `3: FLOCK  ADVISORY  WRITE 14608 00:1b:189 0 EOF` (id, kind, mode,
/// access, pid, hex major:hex minor:decimal inode, range); a blocked waiter
/// has `->` after the id. A pid of 0 or -1 (not visible from here) is no
/// answer.
pub fn flock_writer(locks: &str, major: u32, minor: u32, ino: u64) -> Option<i32> {
    let matches = |line: &str| -> Option<i32> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || fields[1] != "FLOCK" || fields[3] != "WRITE" {
            return None;
        }
        let pid = fields[4].parse::<i32>().ok().filter(|&p| p > 0)?;
        let mut id = fields[5].split(':');
        let (ma, mi, inode) = (id.next()?, id.next()?, id.next()?);
        let same = u32::from_str_radix(ma, 16).ok()? == major
            && u32::from_str_radix(mi, 16).ok()? == minor
            && inode.parse::<u64>().ok()? == ino;
        same.then_some(pid)
    };
    locks.lines().find_map(matches)
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

    #[test]
    fn flock_writer_from_proc_locks_text() {
        let locks = "\
1: POSIX  ADVISORY  WRITE 700 00:1b:189 0 EOF
2: FLOCK  ADVISORY  READ 701 00:1b:189 0 EOF
3: FLOCK  ADVISORY  WRITE 4792 fe:00:9977905 0 EOF
3: -> FLOCK  ADVISORY  WRITE 5000 00:1b:189 0 EOF
4: FLOCK  ADVISORY  WRITE 0 00:1b:190 0 EOF
5: FLOCK  ADVISORY  WRITE 14608 00:1b:189 0 EOF
";
        assert_eq!(flock_writer(locks, 0, 0x1b, 189), Some(14608));
        assert_eq!(flock_writer(locks, 0xfe, 0, 9977905), Some(4792));
        assert_eq!(flock_writer(locks, 0, 0x1b, 190), None); // pid not visible
        assert_eq!(flock_writer(locks, 0, 0x1c, 189), None);
        assert_eq!(flock_writer("", 0, 0x1b, 189), None);
    }

    /// Against the real kernel: a second open file description is refused
    /// and the holder (this process) is named; closing another descriptor
    /// of the file, as libpmem does, does not release the lock.
    #[test]
    fn lock_is_exclusive_and_names_the_holder() {
        let path = std::env::temp_dir().join(format!("dd_lock_test_{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
        lock(&c_path, Duration::ZERO).expect("first lock");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600, "created with mode 0600");
        drop(std::fs::File::open(&path).unwrap());
        let started = Instant::now();
        let refused = lock(&c_path, Duration::from_millis(300));
        assert!(started.elapsed() >= Duration::from_millis(300), "waited for the holder to go away");
        let _ = std::fs::remove_file(&path);
        match refused {
            Err(LockError::Held(Some(h))) => {
                assert_eq!(h.pid, std::process::id() as i32);
                let cwd = std::env::current_dir().unwrap();
                assert_eq!(h.data_dir.as_deref(), Some(cwd.to_string_lossy().as_ref()));
            }
            other => panic!("expected the lock to be held by this process, got {other:?}"),
        }
    }
}

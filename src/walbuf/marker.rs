//! `delayed_durability/wal_buffer_in_use`: written before the first WAL
//! write through the buffer, removed once the buffer is drained into
//! pg_wal. While it is there the buffer may hold WAL of durable commits
//! that pg_wal lacks, so a start that finds the buffer missing, emptied,
//! zeroed or switched off refuses instead of running recovery without that
//! WAL (which would lose those commits in silence).
//!
//! The file names the data directory that wrote it (its inode, with its
//! path or device, and the machine): a copy of the data directory on
//! another host carries the original's marker, which says nothing about
//! the copy's own buffer. A copy on the same host has another inode; one
//! made by a base backup or rewound by pg_rewind (a backup_label) ignores
//! the marker too (mod.rs).

use super::format::Owner;
use std::io::Write as _;

const MARKER: &str = "delayed_durability/wal_buffer_in_use";

/// The machine, so that a copy of the data directory at the same path on a
/// host provisioned alike (same inode) is not taken for it.
fn machine_id() -> String {
    std::fs::read_to_string("/etc/machine-id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The buffer this data directory last wrote WAL through and has not
/// drained since; None when there is none (or the marker is another data
/// directory's). An unreadable marker is an error: it cannot be ignored.
pub fn buffer_in_use(data_dir: &Owner) -> Result<Option<String>, String> {
    let text = match std::fs::read_to_string(MARKER) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("could not read \"{MARKER}\": {e}")),
    };
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('\t')));
    let (Some(buffer), Some(dir), Some(dev), Some(ino), Some(machine)) =
        (field("buffer"), field("data_directory"), field("device"), field("inode"), field("machine"))
    else {
        // Torn or damaged: the safe reading is that a buffer was in use.
        return Err(format!("\"{MARKER}\" is damaged"));
    };
    // The same directory: its inode, and its path (a device number may
    // change across a reboot) or its device (the directory was moved).
    let same_place = dir == data_dir.path || dev.parse::<u64>().ok() == Some(data_dir.dev);
    if machine != machine_id() || ino.parse::<u64>().ok() != Some(data_dir.ino) || !same_place {
        return Ok(None);
    }
    Ok(Some(buffer.to_string()))
}

/// Says, durably, that WAL of this data directory goes through `buffer`.
pub fn write(buffer: &str, data_dir: &Owner) -> std::io::Result<()> {
    if buffer_in_use(data_dir).ok().flatten().as_deref() == Some(buffer) {
        return Ok(());
    }
    std::fs::create_dir_all("delayed_durability")?;
    // The directory's own entry, when this made it.
    sync_directory(".")?;
    let partial = format!("{MARKER}.partial");
    let mut file = std::fs::File::create(&partial)?;
    write!(
        file,
        "buffer\t{buffer}\ndata_directory\t{}\ndevice\t{}\ninode\t{}\nmachine\t{}\n",
        data_dir.path,
        data_dir.dev,
        data_dir.ino,
        machine_id()
    )?;
    file.sync_all()?;
    std::fs::rename(&partial, MARKER)?;
    sync_directory("delayed_durability")
}

/// fsync of a directory; as PostgreSQL's fsync_fname, a file system that
/// cannot fsync directories (EINVAL, EBADF) is not an error.
fn sync_directory(dir: &str) -> std::io::Result<()> {
    match std::fs::File::open(dir)?.sync_all() {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EBADF)) => Ok(()),
        other => other,
    }
}

/// The buffer is drained (or not used, and empty), or the marker is not
/// this data directory's: nothing of it is needed.
pub fn remove() -> std::io::Result<()> {
    match std::fs::remove_file(MARKER) {
        Ok(()) => sync_directory("delayed_durability"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

pub fn path() -> &'static str {
    MARKER
}

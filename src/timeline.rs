//! This server's timeline history, from PostgreSQL's own history files
//! (`pg_wal/XXXXXXXX.history`): the timelines the current one descends
//! from, and the WAL position where each of them was left. A commit made on
//! an ancestor timeline past the point where that timeline was left is not
//! in this server's WAL: it was lost in a failover (or a point-in-time
//! recovery), whatever WAL the current timeline writes at that position.

use pgrx::pg_sys;

/// The current timeline and, for each ancestor, where it was left.
#[derive(Debug, PartialEq)]
pub struct History {
    pub current: u32,
    /// (timeline, switch point), oldest first.
    pub ancestors: Vec<(u32, u64)>,
}

impl History {
    /// Where `tli` was left for a descendant; None for the current
    /// timeline; Err when it is not in this history at all.
    pub fn end_of(&self, tli: u32) -> Result<Option<u64>, ()> {
        if tli == self.current {
            return Ok(None);
        }
        self.ancestors.iter().find(|(t, _)| *t == tli).map(|(_, end)| Some(*end)).ok_or(())
    }
}

/// Parses a history file: "parentTLI <tab> X/Y <tab> reason" per line,
/// comments (#) and blank lines ignored.
pub fn parse(current: u32, text: &str) -> Result<History, String> {
    let mut ancestors = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let tli = fields.next().and_then(|t| t.parse::<u32>().ok());
        let lsn = fields.next().and_then(parse_lsn);
        match (tli, lsn) {
            (Some(tli), Some(lsn)) => ancestors.push((tli, lsn)),
            _ => return Err(format!("invalid line in the history of timeline {current}: \"{line}\"")),
        }
    }
    Ok(History { current, ancestors })
}

/// "X/Y" as PostgreSQL prints a WAL position.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(((u32::from_str_radix(hi, 16).ok()? as u64) << 32) | u32::from_str_radix(lo, 16).ok()? as u64)
}

/// This server's history: its timeline's history file (none for timeline 1).
pub fn read(current: u32) -> Result<History, String> {
    if current <= 1 {
        return Ok(History { current, ancestors: Vec::new() });
    }
    let path = format!("pg_wal/{current:08X}.history");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("could not read \"{path}\": {e}"))?;
    parse(current, &text)
}

/// The timeline this server is on: the one it writes (a primary), or on a
/// standby the newer of the one it replays and the one it receives (a
/// standby that follows a new primary receives its timeline before it
/// replays it).
pub fn current() -> u32 {
    // SAFETY: reads shared WAL state; raises nothing.
    followed().unwrap_or_else(|| unsafe { insertion_timeline() })
}

/// During recovery, the newest timeline replayed or received; None once
/// recovery ended. Never the timeline a promotion starts: a promotion that
/// completes meanwhile leaves these at the timeline it left.
pub fn followed() -> Option<u32> {
    // SAFETY: reads shared WAL and WAL receiver state; raises nothing.
    unsafe {
        if !pg_sys::RecoveryInProgress() {
            return None;
        }
        let (mut replayed, mut received) = (0, 0);
        pg_sys::GetXLogReplayRecPtr(&mut replayed);
        pg_sys::GetWalRcvFlushRecPtr(std::ptr::null_mut(), &mut received);
        Some(replayed.max(received))
    }
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
unsafe fn insertion_timeline() -> u32 {
    // SAFETY: a plain read of shared WAL state, valid once recovery ended.
    unsafe { pg_sys::GetWALInsertionTimeLine() }
}

#[cfg(any(feature = "pg13", feature = "pg14"))]
unsafe fn insertion_timeline() -> u32 {
    // SAFETY: the backend's copy, set when it first accessed WAL.
    unsafe { pg_sys::ThisTimeLineID }
}

extern "C-unwind" {
    /// src/c/commit_record.c: whether the record ending at `end` is a
    /// shutdown checkpoint, and where it starts and its time; raises only
    /// what is not a read error.
    fn dd_shutdown_checkpoint_at(
        end: u64,
        start: *mut u64,
        time: *mut i64,
        message: *mut std::ffi::c_char,
        message_len: usize,
    ) -> std::ffi::c_int;
}

/// The shutdown checkpoint this server's WAL holds ending exactly at `end`
/// (a timeline's switch point): where it starts and its time; None when
/// another record ends there. Err: the WAL there could not be read, and why.
pub fn shutdown_checkpoint_ending_at(end: u64) -> Result<Option<(u64, i64)>, String> {
    const MATCHES: std::ffi::c_int = 0;
    const OTHER: std::ffi::c_int = 1;
    let mut message = vec![0 as std::ffi::c_char; 512];
    let (mut start, mut time) = (0u64, 0i64);
    // SAFETY: the buffer is valid for its length and left NUL-terminated,
    // the two outputs are this frame's; an error the reader raises (not a
    // read error) reaches PostgreSQL through the boundary.
    let found = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            dd_shutdown_checkpoint_at(end, &mut start, &mut time, message.as_mut_ptr(), message.len())
        })
    };
    match found {
        MATCHES => Ok(Some((start, time))),
        OTHER => Ok(None),
        // SAFETY: NUL-terminated by the function.
        _ => Err(match unsafe { std::ffi::CStr::from_ptr(message.as_ptr()) }.to_string_lossy() {
            m if m.is_empty() => "the WAL after it is not readable yet".into(),
            m => m.into_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_file() {
        let text = "1\t0/3000000\tno recovery target specified\n\n# comment\n2\t0/5A000D8\tafter failover\n";
        let h = parse(3, text).unwrap();
        assert_eq!(h.ancestors, vec![(1, 0x300_0000), (2, 0x5A0_00D8)]);
        assert_eq!(h.end_of(3), Ok(None));
        assert_eq!(h.end_of(1), Ok(Some(0x300_0000)));
        assert_eq!(h.end_of(7), Err(()));
        assert!(parse(3, "1\tnot-an-lsn\n").is_err());
        assert_eq!(parse_lsn("1/A0"), Some((1 << 32) | 0xA0));
        assert_eq!(parse_lsn("100000000/0"), None);
    }
}

"""Experiment 8 (seeds 000/001: what a crash loses): experiment 1's delayed
loop cut by a simulated power cut at several points, with the default
settings and with the loss budget.

The articles say that a crash loses at most one 60 KB log block when the
disk keeps up, and up to the whole log buffer (about 7 MB) when it does
not; they measure nothing. Here each cut is measured without asking the
extension:
- acknowledged: the loop reports every commit that returned with a NOTICE,
  which the server sends to the client at once; the last one the client
  received is the last acknowledged commit;
- the power cut: strace records every WAL write and every WAL fsync of
  every server process; after kill -9 of all of them, each WAL segment is
  zeroed from its first write no later fsync covered (what the disk really
  held), as the TAP tests do (t/DelayedDurabilityTest.pm);
- survived: after recovery, the highest id in the table (the loop's ids
  run 1, 2, 3 ...);
- lost WAL: the insert position of the last acknowledged commit (sent with
  its NOTICE) minus the position where recovery ended (its "redo done at"
  log line: the start of the last record replayed).
"""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from harness import PGBIN, SETUP_SQL, Cluster, Unavailable, has_function, postgres_command
from exp1_loop import SETUP as EXP1_SETUP

DB = "my_dd_crash"
# The loop of experiment 1 (calls of the delayed procedure), reporting each
# acknowledged commit and the WAL insert position right after it.
LOOP = """
DO $$
BEGIN
  FOR i IN 1..{maxcnt} LOOP
    CALL test_insert_delayed(i, 'This is a test');
    RAISE NOTICE 'acked % %', i, pg_current_wal_insert_lsn() - '0/0'::pg_lsn;
  END LOOP;
END $$;
"""
VARIANTS = (("delayed, default settings", ""),
            ("delayed, max_loss_bytes = 64kB", "SET delayed_durability.max_loss_bytes = '64kB';"))
ARTICLE = "at most one 60 KB log block if the disk keeps up; up to the ~7 MB log buffer if it does not"

TRACE_CALL = re.compile(r"^(\d+)\s+(pwrite64|pwritev2?|fsync|fdatasync)\((\d+)<([^>]*)>(.*)$")
TRACE_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (pwrite64|pwritev2?|fsync|fdatasync) resumed>(.*)$")
RESULT = re.compile(r"\)\s+=\s+(-?\d+)")
WAL_SEGMENT = re.compile(r"/pg_wal/([0-9A-F]{24})$")


def parse_trace(path):
    """WAL segment writes and syncs in trace order: [(kind, file, offset,
    length)], kind 'w' or 's'. Calls split across lines are joined."""
    events, pending = [], {}
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TRACE_CALL.match(line)
            if m:
                pid, call, fd_path, rest = m.group(1), m.group(2), m.group(4), m.group(5)
                if rest.endswith("<unfinished ...>"):
                    pending[pid] = (call, fd_path, rest)
                    continue
            else:
                m = TRACE_RESUMED.match(line)
                if not m or m.group(1) not in pending:
                    continue
                call, fd_path, head = pending.pop(m.group(1))
                rest = head.replace("<unfinished ...>", "") + m.group(3)
            if not WAL_SEGMENT.search(fd_path):
                continue
            r = RESULT.search(rest)
            if not r or int(r.group(1)) < 0:
                continue
            if call.startswith("pwrite"):
                # pwrite64(fd, "", len, offset) = n; pwritev(fd, [...], cnt, offset) = n
                args = rest.split(")")[0].split(", ")
                offset = int(args[-1])
                events.append(("w", fd_path, offset, int(r.group(1))))
            else:
                events.append(("s", fd_path, 0, 0))
    return events


def unsynced_ranges(events):
    """Per segment file, the first byte the disk may not hold and the end
    of the furthest write no later sync covered. PostgreSQL rewrites a
    partly filled WAL page with the same beginning and more records, so a
    rewrite does not undo what an earlier sync put on disk: the cut starts
    at the first unsynced write or at the end of what was synced, whichever
    is later."""
    pending, synced_end = {}, {}
    for kind, path, offset, length in events:
        if kind == "w":
            lo, hi = pending.get(path, (offset, offset + length))
            pending[path] = (min(lo, offset), max(hi, offset + length))
        elif path in pending:
            synced_end[path] = max(synced_end.get(path, 0), pending.pop(path)[1])
    return {path: (max(lo, synced_end.get(path, 0)), hi) for path, (lo, hi) in pending.items()
            if hi > synced_end.get(path, 0)}


def kill_server(cl):
    pm = int(open(os.path.join(cl.data, "postmaster.pid")).readline())
    kids = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True).stdout.split()
    pids = [pm] + [int(p) for p in kids]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(500):
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            break
        time.sleep(0.01)
    os.unlink(os.path.join(cl.data, "postmaster.pid"))


def start_trace(cl, out):
    pm = int(open(os.path.join(cl.data, "postmaster.pid")).readline())
    kids = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True).stdout.split()
    args = ["strace", "-f", "-qq", "-y", "-s", "0", "--seccomp-bpf",
            "-e", "trace=pwrite64,pwritev,pwritev2,fsync,fdatasync", "-o", out]
    for p in [str(pm)] + kids:
        args += ["-p", p]
    err = out + ".stderr"
    with open(err, "w") as errf:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
    time.sleep(0.5)
    if proc.poll() is not None or "Operation not permitted" in open(err).read():
        proc.kill()
        raise Unavailable(f"strace cannot trace the server here: {open(err).read().strip()[:300]}")
    return proc


def redo_done_at(cl, log_offset):
    """The 'redo done at X/Y' position of the last recovery, as a byte
    position; None when recovery replayed nothing."""
    with open(os.path.join(cl.dir, "log"), errors="replace") as f:
        f.seek(log_offset)
        found = re.findall(r"redo done at ([0-9A-F]+)/([0-9A-F]+)", f.read())
    if not found:
        return None
    hi, lo = found[-1]
    return (int(hi, 16) << 32) + int(lo, 16)


def one_cut(cl, settings, maxcnt, after, tmp):
    """Runs the loop, cuts the power `after` seconds in, recovers; returns
    the cut's row."""
    cl.psql("TRUNCATE insert_test; CHECKPOINT;", db=DB)
    trace_file = os.path.join(tmp, "trace")
    proc = start_trace(cl, trace_file)
    notices = os.path.join(tmp, "notices")
    with open(notices, "w") as nf:
        # Separate -c options: each its own statement, so the DO block runs
        # outside a transaction block and its procedure may commit.
        args = [f"{PGBIN}/psql", "-XAtq", "-h", cl.dir, "-p", str(cl.port), "-d", DB]
        if settings:
            args += ["-c", settings]
        args, env = postgres_command(args + ["-c", LOOP.format(maxcnt=maxcnt)])
        client = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=nf)
        time.sleep(after)
        kill_server(cl)
        client.wait(timeout=60)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    acked = [line.split() for line in open(notices) if "acked" in line]
    if not acked:
        raise RuntimeError(f"no commit acknowledged before the cut: {open(notices).read()[:300]}")
    last_id, last_lsn = int(acked[-1][-2]), int(acked[-1][-1])
    zeroed = 0
    for path, (lo, hi) in unsynced_ranges(parse_trace(trace_file)).items():
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(lo)
            f.write(b"\0" * (size - lo))
        zeroed += hi - lo
    log_offset = os.path.getsize(os.path.join(cl.dir, "log"))
    cl.start()
    survived = int(cl.value("SELECT coalesce(max(id), 0) FROM insert_test", db=DB))
    redo = redo_done_at(cl, log_offset)
    return dict(acknowledged=last_id, survived=survived, lost_commits=last_id - survived,
                unsynced_kb=round(zeroed / 1024, 1),
                lost_wal_kb=round(max(last_lsn - redo, 0) / 1024, 1) if redo else "")


def exp8_crash_loss(c, scale, log):
    """Experiment 1's delayed loop cut by simulated power cuts."""
    if shutil.which("strace") is None:
        raise Unavailable("needs strace (the power cut is simulated from the traced WAL fsyncs)")
    if not has_function(c, "delayed_durability_status"):
        raise Unavailable("needs the extension")
    cuts = scale["e8"]
    cl = Cluster("crash", c.port + 30)
    tmp = tempfile.mkdtemp(prefix="dd-exp8-")
    rows = []
    try:
        cl.psql(SETUP_SQL)
        cl.psql(f"CREATE DATABASE {DB}; ALTER DATABASE {DB} SET delayed_durability.mode = 'allowed';")
        cl.psql(EXP1_SETUP, db=DB)
        for label, settings in VARIANTS:
            for i, after in enumerate(cuts, 1):
                log(f"exp 8: {label}: power cut {i}/{len(cuts)}, {after} s into the loop")
                r = one_cut(cl, settings, 10_000_000, after, tmp)
                rows.append(dict(variant=label, cut_after_s=after, **r))
    finally:
        cl.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def worst(label, key):
        vals = [r[key] for r in rows if r["variant"] == label and isinstance(r[key], (int, float))]
        return max(vals) if vals else ""

    d, b = VARIANTS[0][0], VARIANTS[1][0]
    notes = [
        f"Worst of {len(cuts)} cuts: default settings lost up to {worst(d, 'lost_commits'):,} acknowledged "
        f"commits and {worst(d, 'lost_wal_kb')} KB of WAL; with max_loss_bytes = 64kB up to "
        f"{worst(b, 'lost_commits'):,} commits and {worst(b, 'lost_wal_kb')} KB. The articles: {ARTICLE}.",
        "How: the loop is experiment 1's delayed one (ALLOWED, commit_delayed() per call); each call's NOTICE "
        "tells the client its commit returned. strace records the server's WAL writes and fsyncs; all server "
        "processes are killed at the cut and each WAL segment is zeroed from its first write no later fsync "
        "covered (unsynced_kb: the bytes written to the OS but never synced, lost with the page cache). "
        "survived is the highest id after recovery; lost_wal_kb is the last acknowledged commit's insert "
        "position minus where recovery ended (its \"redo done at\" line). Nothing here asks the extension.",
        "Why the default loses what it does: PostgreSQL's WAL writer writes delayed commits' WAL every "
        "wal_writer_delay (200 ms) but fsyncs it only when wal_writer_flush_after (1 MB) has accumulated or "
        "the delay passed since its last fsync, so a cut loses up to about that much WAL, more when the disk "
        "falls behind; the loss budget makes the committing backend flush once the unflushed WAL reaches "
        "max_loss_bytes.",
    ]
    return dict(title="8. What a crash loses",
                columns=["variant", "cut_after_s", "acknowledged", "survived", "lost_commits", "unsynced_kb",
                         "lost_wal_kb"],
                rows=rows, notes=notes, chart=("module", "exp8_crash_loss"))


def draw_chart(result, path):
    """Lost commits and lost WAL per cut, both variants, beside the
    articles' 60 KB block."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = result["rows"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {VARIANTS[0][0]: "#cc6677", VARIANTS[1][0]: "#4477aa"}
    for label, _ in VARIANTS:
        rs = [r for r in rows if r["variant"] == label]
        xs = range(len(rs))
        a1.plot(list(xs), [r["lost_commits"] for r in rs], marker="o", color=colors[label], label=label)
        a2.plot(list(xs), [r["lost_wal_kb"] or 0 for r in rs], marker="o", color=colors[label], label=label)
    a2.axhline(60, color="#ddaa33", linestyle="--", label="article: one 60 KB log block")
    a1.set_xlabel("cut")
    a1.set_ylabel("acknowledged commits lost")
    a1.set_title("commits lost per power cut", fontsize=10)
    a2.set_xlabel("cut")
    a2.set_ylabel("WAL lost (KB)")
    a2.set_title("WAL lost per power cut", fontsize=10)
    for a in (a1, a2):
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.suptitle(result["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True

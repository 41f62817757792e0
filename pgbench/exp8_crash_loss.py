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
  every server process; after kill -9 of all of them, each WAL
  segment is zeroed from its first write no later fsync covered (what the
  disk held; a partly synced page rewritten later is zeroed whole, so the
  loss is overstated by less than one 8 KB page, never understated);
- survived: after recovery, the highest id in the table (the loop's ids
  run 1, 2, 3 ...);
- lost WAL: the insert position of the last acknowledged commit (sent with
  its NOTICE) minus the position where recovery ended (the end-of-recovery
  checkpoint's redo position).
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

WAL_CALL = re.compile(r"^(pwrite64|pwritev2?|fsync|fdatasync)\(\d+<([^>]*/pg_wal/[0-9A-F]{24})>")
LINE = re.compile(r"^(\d+)\s+(.*)$")
RESUMED = re.compile(r"^<\.\.\. \w+ resumed>(.*)$")
RESULT = re.compile(r"\)\s+=\s+(-?\d+)(?:\s|$)")
PAGE = 8192  # XLOG_BLCKSZ


def write_offset(call, rest):
    """The file offset of a pwrite64/pwritev (last argument; pwritev2:
    before the flags)."""
    m = (re.search(r",\s*(\d+),\s*\w+\s*(?:\)|$)", rest) if call == "pwritev2"
         else re.search(r",\s*(\d+)\s*(?:\)|$)", rest))
    return int(m.group(1)) if m else None


def unsynced_cuts(path):
    """Reads an strace file; per WAL segment file, where the simulated
    power cut starts: the first byte of the first write no later sync
    covered. A sync covers the writes of its file completed when it
    started. A write cut off by the kill (no result) counts as unsynced.
    PostgreSQL writes whole 8 KB pages and rewrites a partly filled page
    with more records, so a cut at a rewritten page also loses the part
    of it an earlier sync had covered: the loss is overstated by less than
    one page, never understated. Returns ({segment: (cut, end of the
    furthest unsynced write)}, writes, syncs)."""
    pending, unfinished, covers = {}, {}, {}
    writes = syncs = 0

    def add_write(seg, call, rest, result):
        offset = write_offset(call, rest)
        if offset is not None and (result is None or result > 0):
            pending.setdefault(seg, []).append((offset, offset + (result or 0)))

    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            pid, rest = m.groups()
            if rest.endswith("<unfinished ...>"):
                rest = rest[:-len("<unfinished ...>")].rstrip()
                unfinished[pid] = rest
                w = WAL_CALL.match(rest)
                if w and w.group(1) in ("fsync", "fdatasync"):
                    covers[pid] = len(pending.get(w.group(2), []))
                continue
            r = RESUMED.match(rest)
            if r:
                rest = unfinished.pop(pid, "") + r.group(1)
            w = WAL_CALL.match(rest)
            if not w:
                continue
            call, seg = w.groups()
            res = RESULT.search(rest)
            result = int(res.group(1)) if res else None  # "= ?": killed in the call
            covered = covers.pop(pid, None)
            if call.startswith("pwrite"):
                writes += 1
                add_write(seg, call, rest, result)
            elif result == 0:
                syncs += 1
                done = pending.get(seg, [])
                n = len(done) if covered is None else covered
                pending[seg] = done[n:]
    # Writes interrupted by the kill before strace printed their end.
    for rest in unfinished.values():
        w = WAL_CALL.match(rest)
        if w and w.group(1).startswith("pwrite"):
            add_write(w.group(2), w.group(1), rest, None)
    return ({seg: (min(lo for lo, _ in ws), max(hi for _, hi in ws)) for seg, ws in pending.items() if ws},
            writes, syncs)


def kill_server(cl):
    """kill -9 of the whole server: the postmaster first (it forks nothing
    more), then the children listed just before (each runs in a process
    group of its own, so no group kill reaches them all)."""
    pm = int(open(os.path.join(cl.data, "postmaster.pid")).readline())
    pids = [pm] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pm)], capture_output=True,
                                                  text=True).stdout.split()]
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
    lock = os.path.join(cl.dir, f".s.PGSQL.{cl.port}.lock")
    if os.path.exists(lock):
        os.unlink(lock)


def start_traced(cl, out):
    """Starts the (stopped) server under strace, which follows everything it
    forks. Started by strace, the server gets its seccomp filter: only the
    traced calls stop a process, so the loop runs near its untraced speed
    (strace -p, attaching to running processes, cannot use it)."""
    args = ["strace", "-f", "--seccomp-bpf", "-qq", "-y", "-s", "0",
            "-e", "trace=pwrite64,pwritev,pwritev2,fsync,fdatasync", "-o", out]
    if os.geteuid() == 0:
        args += ["-u", "postgres"]  # PostgreSQL refuses to run as root
    args += [f"{PGBIN}/pg_ctl", "-D", cl.data, "-l", os.path.join(cl.dir, "log"), "-w", "start"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUST_") and k != "PGAPPNAME"}
    err = out + ".stderr"
    with open(err, "w") as errf:
        proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf)
    for _ in range(3000):
        if proc.poll() is not None:
            raise Unavailable(f"the server could not be started under strace: {open(err).read().strip()[:300]}")
        try:
            cl.value("SELECT 1")
            return proc
        except RuntimeError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"the server did not start under strace: {open(err).read().strip()[:300]}")


def wait_for_first_ack(notices, client, timeout=60):
    for _ in range(int(timeout / 0.01)):
        with open(notices) as f:
            if "acked" in f.read():
                return True
        if client.poll() is not None:
            return False
        time.sleep(0.01)
    return False


def one_cut(cl, settings, maxcnt, after, tmp):
    """Runs the loop, cuts the power `after` seconds after its first
    acknowledged commit, recovers; returns the cut's row."""
    trace_file = os.path.join(tmp, "trace")
    proc = start_traced(cl, trace_file)
    cl.psql("TRUNCATE insert_test; CHECKPOINT;", db=DB)
    notices = os.path.join(tmp, "notices")
    with open(notices, "w") as nf:
        # Separate -c options: each its own statement, so the DO block runs
        # outside a transaction block and its procedure may commit.
        args = [f"{PGBIN}/psql", "-XAtq", "-h", cl.dir, "-p", str(cl.port), "-d", DB]
        if settings:
            args += ["-c", settings]
        args, env = postgres_command(args + ["-c", LOOP.format(maxcnt=maxcnt)])
        client = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=nf)
        started = wait_for_first_ack(notices, client)
        t0 = time.monotonic()
        if started:
            time.sleep(after)
        kill_server(cl)
        secs = time.monotonic() - t0
        client.wait(timeout=60)
    proc.wait(timeout=60)  # strace ends with the last process it traced
    acked = [line.split() for line in open(notices) if "acked" in line]
    if not acked:
        raise RuntimeError(f"no commit acknowledged before the cut: {open(notices).read()[:300]}")
    last_id, last_lsn = int(acked[-1][-2]), int(acked[-1][-1])
    cuts, writes, syncs = unsynced_cuts(trace_file)
    unsynced = 0
    for path, (lo, hi) in cuts.items():
        size = os.path.getsize(path)
        if lo >= size:
            continue
        with open(path, "r+b") as f:
            f.seek(lo)
            f.write(b"\0" * (size - lo))
        unsynced += max(hi - lo, 0)
    cl.start()
    survived = int(cl.value("SELECT coalesce(max(id), 0) FROM insert_test", db=DB))
    # The end-of-recovery checkpoint's redo position: where the recovered
    # WAL ended (no log line to parse, in any language).
    redo = int(float(cl.value("SELECT redo_lsn - '0/0'::pg_lsn FROM pg_control_checkpoint()")))
    cl.stop(remove=False)
    return dict(acknowledged=last_id, survived=survived, lost_commits=max(last_id - survived, 0),
                commits_per_second=round(last_id / secs) if secs > 0 else "",
                traced_writes=writes, traced_syncs=syncs, unsynced_kb=round(unsynced / 1024, 1),
                lost_wal_kb=round(max(last_lsn - redo, 0) / 1024, 1))


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
        cl.stop(remove=False)  # each cut starts it under strace
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
        "covered, to its end (unsynced_kb: the WAL written to the page cache and never synced). "
        "A partly filled WAL page rewritten after a sync is zeroed whole, so a cut overstates the loss by "
        "less than one 8 KB page, never understates it. survived is the highest id after recovery; "
        "lost_wal_kb is the last acknowledged commit's insert position minus where recovery ended (the "
        "end-of-recovery checkpoint's redo position). Nothing here asks the extension. The server runs "
        "under strace with a seccomp filter (only WAL writes and syncs stop a process); commits_per_second is "
        "the traced loop's rate, to compare with experiment 1's: a delayed commit's loss grows with the rate.",
        "Why the default loses what it does: PostgreSQL's WAL writer writes delayed commits' WAL every "
        "wal_writer_delay (200 ms) but fsyncs it only when wal_writer_flush_after (1 MB) has accumulated or "
        "the delay passed since its last fsync, so a cut loses up to about that much WAL, more when the disk "
        "falls behind; the loss budget makes the committing backend flush once the unflushed WAL reaches "
        "max_loss_bytes.",
    ]
    return dict(title="8. What a crash loses",
                columns=["variant", "cut_after_s", "acknowledged", "survived", "lost_commits",
                         "lost_wal_kb", "commits_per_second", "traced_writes", "traced_syncs", "unsynced_kb"],
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

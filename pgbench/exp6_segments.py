"""Experiment 6 (the VLF article): one big insert, update and delete with
64 MB and 1 MB WAL segments, and where each step's segments came from
(created during the step, or spare ones recycled by an earlier checkpoint).

What PostgreSQL counts about WAL files (xlog.c; PostgreSQL 15 to 17 alike):
- the "checkpoint complete" log line's "N WAL file(s) added" counts only
  the segment the checkpoint itself preallocates (PreallocXlogFiles: at most
  one, and only when the current segment is 75% full). A segment that the
  writing backend or the WAL writer creates when it reaches a segment with
  no file (XLogFileInit -> XLogFileInitInternal, its "added" flag ignored)
  is counted nowhere, so the segments created during a step are found here
  by listing pg_wal before and after it;
- "M removed, K recycled" count RemoveXlogFile at that checkpoint: segments
  older than the new redo pointer are renamed to future segment names while
  the number stays under XLOGfileslop (min_wal_size, max_wal_size and the
  checkpoint distance estimate; never with wal_recycle = off) and deleted
  otherwise;
- pg_stat_wal.wal_sync (the flushes column) counts issue_xlog_fsync: commit
  and WAL writer flushes, and the fsync of each segment when it is full
  (XLogWrite, finishing_seg). Creating a segment also costs, uncounted, the
  zero fill (wal_init_zero), one fsync of the filled file and durable_rename's
  two file fsyncs plus one of pg_wal; recycling at a checkpoint costs a
  durable_rename (three fsyncs), removal an unlink and a pg_wal fsync.
"""
import os
import re
import threading
import time

from harness import SETUP_SQL, Cluster, measure_wal
from wait_events import WAL_WAITS, sample_wait_events

# The working session's application_name, for the wait-event sampler.
WORK_APP = "exp6_work"

# The TPC-C customer table as the article creates it. tinyint -> smallint,
# datetime -> timestamp; the unique clustered index -> a primary key b-tree
# (PostgreSQL has no clustered index: the heap is not kept in key order; it
# is loaded in key order here, so it starts out ordered as the article's).
CUSTOMER_DDL = """
CREATE TABLE customer (
  c_id int, c_d_id smallint, c_w_id int,
  c_first char(16), c_middle char(2), c_last char(16),
  c_street_1 char(20), c_street_2 char(20), c_city char(20),
  c_state char(2), c_zip char(9), c_phone char(16), c_since timestamp,
  c_credit char(2), c_credit_lim numeric(12,2), c_discount numeric(4,4),
  c_balance numeric(12,2), c_ytd_payment numeric(12,2),
  c_payment_cnt smallint, c_delivery_cnt smallint, c_data char(500),
  PRIMARY KEY (c_w_id, c_d_id, c_id));
"""

# TPC-C-like rows: 10 districts of 3,000 customers per warehouse, in key
# order; last names from the TPC-C syllables, c_data 300 to 500 characters
# (upper case, so lower() changes it).
CUSTOMER_FILL = """
INSERT INTO customer
SELECT 1 + (i - 1) % 3000, 1 + ((i - 1) / 3000) % 10, 1 + (i - 1) / 30000,
       substr(md5(i::text), 1, 8 + i % 9), 'OE',
       s[1 + (i / 100) % 10] || s[1 + (i / 10) % 10] || s[1 + i % 10],
       substr(md5('s1' || i), 1, 10 + i % 11), substr(md5('s2' || i), 1, 10 + i % 11),
       substr(md5('c' || i), 1, 10 + i % 11), 'CA', lpad((i % 10000)::text, 4, '0') || '11111',
       lpad(i::text, 16, '0'), now(), CASE WHEN i % 10 = 0 THEN 'BC' ELSE 'GC' END,
       50000, (i % 5000) / 10000.0, -10, 10, 1, 0,
       substr(upper(repeat(md5(i::text) || md5((-i)::text), 8)), 1, 300 + i % 201)
  FROM generate_series(1, {n}) AS i,
       (SELECT ARRAY['BAR','OUGHT','ABLE','PRI','PRES','ESE','ANTI','CALLY','ATION','EING'] AS s) AS syl;
"""

# The article's insert test: an empty copy of the table (SELECT INTO with
# WHERE 1=2), then one INSERT ... SELECT of every row; two statements, two
# transactions, measured apart.
INSERT_PARTS = (("SELECT INTO", "SELECT * INTO customer_tmp FROM customer WHERE 1=2;"),
                ("INSERT SELECT", "INSERT INTO customer_tmp SELECT * FROM customer;"))
STEPS = (("insert", INSERT_PARTS),
         ("update", (("UPDATE", "UPDATE customer SET c_data = lower(c_data);"),)),
         ("delete", (("DELETE", "DELETE FROM customer;"),)))
# The extra row: the same insert on a pg_wal with no spare segments (the
# checkpoint before it ran with wal_recycle = off), so that every segment it
# writes is created, zero-filled and fsynced during the step.
NO_SPARE = "insert, no spare segments"
STEP_ORDER = (NO_SPARE, "insert", "update", "delete")
ARTICLE = {"insert": (281, 1069), "update": (174, 1554), "delete": (193, 936)}  # 16 VLFs, 20,000 VLFs
SIZES = (64, 1)

# wal_buffers is set: its default (shared_buffers / 32) is capped at one
# segment, which would give the 1 MB cluster 1 MB of WAL buffers and the
# 64 MB one 8 MB; both get 8 MB so that only the segment size differs.
CONF = """
max_wal_size = 16GB
wal_buffers = 8MB
log_checkpoints = on
wal_recycle = off
"""

CKPT_RE = re.compile(r"checkpoint complete: wrote (\d+) buffers.*?; (\d+) WAL file\(s\) added, (\d+) removed, "
                     r"(\d+) recycled;")
SEG_RE = "'^[0-9A-F]{24}$'"


def _log_text(cl):
    try:
        with open(os.path.join(cl.dir, "log"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _checkpoints_logged(cl):
    return CKPT_RE.findall(_log_text(cl))


def checkpoint(cl):
    """Runs CHECKPOINT and returns the numbers of its log line (buffers,
    added, removed, recycled); None if the line did not show up."""
    before = len(_checkpoints_logged(cl))
    cl.psql("CHECKPOINT;")
    for _ in range(100):
        done = _checkpoints_logged(cl)
        if len(done) > before:
            return tuple(int(x) for x in done[-1])
        time.sleep(0.05)
    return None


def wal_names(cl):
    return set(cl.psql(f"SELECT name FROM pg_ls_waldir() WHERE name ~ {SEG_RE};"))


def wal_pos(cl):
    return int(float(cl.value("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")))


def run_step(cl, segsize, step, parts, n, before_checkpoint=""):
    """Measures one step (its statements one after another, each its own
    transaction), then checkpoints, and returns its row."""
    seg_bytes = segsize * 1048576
    names0 = wal_names(cl)
    ckpts0 = len(_checkpoints_logged(cl))
    pos0 = wal_pos(cl)
    secs, syncs, writes, part_secs = 0.0, 0, 0, []
    # The wait events of the working backend (the VLF article's comments
    # name LOGWRITE as the top wait of its large transactions).
    waits = {}
    sampler = threading.Thread(target=sample_wait_events, args=(cl, waits),
                               kwargs=dict(app=WORK_APP, idle=2, start_timeout=30), daemon=True)
    sampler.start()
    time.sleep(0.3)  # the sampler is connected and polling
    for label, sql in parts:
        m = measure_wal(cl, sql, setup=f"SET application_name = '{WORK_APP}';")
        s, f = m["seconds"], m["fsyncs"]
        secs += s
        syncs += f
        writes += m["writes"]
        part_secs.append((label, s, f))
    sampler.join(timeout=60)
    pos1 = wal_pos(cl)
    names1 = wal_names(cl)
    ckpts_during = len(_checkpoints_logged(cl)) - ckpts0
    if before_checkpoint:
        cl.psql(before_checkpoint)
    ck = checkpoint(cl)
    wal = pos1 - pos0
    created = len(names1 - names0)
    entered = pos1 // seg_bytes - pos0 // seg_bytes  # segments the step moved into
    row = dict(step=step, wal_segment_mb=segsize, rows=n, seconds=secs,
               article_seconds=ARTICLE[step][0 if segsize == 64 else 1] if step in ARTICLE else "",
               flushes=syncs, wal_writes=writes, wal_mb=round(wal / 1048576, 1), segments_filled=round(wal / seg_bytes, 1),
               segments_created=created, segments_reused=max(entered - created, 0),
               segments_recycled=ck[3] if ck else "", segments_removed=ck[2] if ck else "",
               wal_files=int(cl.value(f"SELECT count(*) FROM pg_ls_waldir() WHERE name ~ {SEG_RE};")))
    row["_parts"] = part_secs
    row["_waits"] = waits
    row["_checkpoints_during"] = ckpts_during
    row["_ckpt_added"] = ck[1] if ck else None
    return row


def exp6_segments(c, scale, log):
    """PostgreSQL's analogue of the VLF article: WAL segment size, and
    segment creation against recycling."""
    n = scale["e6"]
    rows, load_info, wal_buffers = [], {}, {}
    port = c.port + 10
    for segsize in SIZES:
        log(f"exp 6: cluster with {segsize} MB WAL segments, {n} customers")
        cl = Cluster(f"seg{segsize}", port, conf=CONF, wal_segsize_mb=segsize)
        port += 1
        try:
            wal_buffers[segsize] = cl.value("SHOW wal_buffers")
            pos0 = wal_pos(cl)
            cl.psql(SETUP_SQL + CUSTOMER_DDL + CUSTOMER_FILL.format(n=n) + "VACUUM ANALYZE customer;")
            load_wal = wal_pos(cl) - pos0
            # wal_recycle is off for this checkpoint: it removes the load's
            # segments and leaves no spare ones for the next step.
            ck = checkpoint(cl)
            load_info[segsize] = (round(load_wal / 1048576, 1), ck[2] if ck else "?", ck[3] if ck else "?")
            log(f"exp 6: {segsize} MB segments: {NO_SPARE}")
            # From its checkpoint on, recycling is on (the default), so the
            # steps after it find its segments as spare ones.
            rows.append(run_step(cl, segsize, NO_SPARE, INSERT_PARTS, n,
                                 before_checkpoint="ALTER SYSTEM SET wal_recycle = on;\nSELECT pg_reload_conf();\n"
                                                   "SELECT pg_sleep(0.5);"))
            cl.psql("DROP TABLE customer_tmp;")
            for step, parts in STEPS:
                log(f"exp 6: {segsize} MB segments: {step}")
                rows.append(run_step(cl, segsize, step, parts, n))
        finally:
            cl.stop()
    rows.sort(key=lambda r: (STEP_ORDER.index(r["step"]), -r["wal_segment_mb"]))
    by = {(r["step"], r["wal_segment_mb"]): r for r in rows}

    def ratio(a, b):
        return a / b if b else float("nan")

    notes = []
    for step in ("insert", "update", "delete"):
        small, big = by[(step, 1)], by[(step, 64)]
        a16, a20000 = ARTICLE[step]
        notes.append(f"{step}: 1 MB / 64 MB segments duration ratio: ours "
                     f"{ratio(small['seconds'], big['seconds']):.2f}x, article {ratio(a20000, a16):.1f}x "
                     f"(20,000 / 16 VLFs: {a20000} s / {a16} s); WAL fsyncs {small['flushes']} / {big['flushes']} "
                     f"= {ratio(small['flushes'], big['flushes']):.1f}x; segments moved into "
                     f"{small['segments_created'] + small['segments_reused']} / "
                     f"{big['segments_created'] + big['segments_reused']}.")
    for segsize in SIZES:
        parts = by[("insert", segsize)]["_parts"]
        notes.append(f"insert parts, {segsize} MB segments: "
                     + " + ".join(f"{label} {s:.2f} s ({f} WAL fsyncs)" for label, s, f in parts)
                     + " (the SELECT INTO copies no rows: WHERE 1=2, as in the article).")
    for segsize in SIZES:
        fresh, spare = by[(NO_SPARE, segsize)], by[("insert", segsize)]
        notes.append(f"creation vs recycling, {segsize} MB segments: the insert with no spare segments created "
                     f"{fresh['segments_created']} and took {fresh['seconds']:.2f} s; the same insert on "
                     f"recycled segments created {spare['segments_created']}, reused {spare['segments_reused']} "
                     f"and took {spare['seconds']:.2f} s ({ratio(fresh['seconds'], spare['seconds']):.2f}x).")
    for segsize in SIZES:
        wal_mb, removed, recycled = load_info[segsize]
        notes.append(f"load, {segsize} MB segments: {wal_mb} MB of WAL; its checkpoint (wal_recycle = off) removed "
                     f"{removed} segments and recycled {recycled}; wal_buffers = {wal_buffers[segsize]}.")
    during = [f"{r['step']} / {r['wal_segment_mb']} MB" for r in rows if r["_checkpoints_during"]]
    if during:
        notes.append("a checkpoint ran during " + ", ".join(during) + ": those rows' created/reused counts "
                     "mix in that checkpoint's recycling.")
    notes += [
        "Each row is one run of its statement (as in the article); the 1 MB and 64 MB clusters run one after "
        "the other, so differences in seconds of a few tens of percent on short steps can be noise.",
        "Columns: segments_created = new files in pg_wal during the step (the writing process made them: zero "
        "fill, fsync, durable rename); segments_reused = segments the step moved into that were already there "
        "(recycled by an earlier checkpoint); segments_recycled / segments_removed = what the CHECKPOINT after "
        "the step did with the step's old segments (its log line); wal_files = segment files left after it. "
        "flushes counts WAL fsyncs (commit, WAL writer, one per full segment), not the fsyncs of creating, "
        "renaming or removing files.",
        "The checkpoint log's \"WAL file(s) added\" is not the number of segments created since the last "
        "checkpoint: xlog.c counts there only the one segment a checkpoint may preallocate itself "
        f"(this run: {sum(r['_ckpt_added'] or 0 for r in rows)} over {len(rows)} step checkpoints).",
        "What carries over: the article changed one thing, the number of VLFs in an equally sized log; here "
        "one thing changes too, the number of WAL segment files the same WAL is cut into, with the table, the "
        "statements and the WAL volume the same. What does not: a PostgreSQL segment is an ordinary file that "
        "is fsynced once when it is full and that a later checkpoint renames for reuse or deletes; there is no "
        "chain of log units to walk when the log wraps around, at log backups or during crash recovery, and "
        "no per-unit state to manage. SQL Server's VLF management, where the article's slowdowns came from, "
        "has no counterpart here, so whatever difference shows is the cost per file only (creating and "
        "zero-filling it, or renaming it, and one fsync per segment).",
    ]
    wait_rows, wal_shares = [], []
    for r in rows:
        w = r["_waits"]
        total = sum(n for _, _, n in w.get("counts", []))
        wal = sum(n for t, e, n in w.get("counts", []) if (t, e) in WAL_WAITS)
        for typ, event, n in w.get("counts", [])[:4]:
            wait_rows.append(dict(step=r["step"], wal_segment_mb=r["wal_segment_mb"], wait_event_type=typ,
                                  wait_event=event, samples=n, share=f"{100 * n / total:.1f}%"))
        if total:
            wal_shares.append(f"{r['step']} / {r['wal_segment_mb']} MB {100 * wal / total:.0f}% of {total:,}")
        r["wal_wait_share"] = f"{100 * wal / total:.0f}%" if total else ""
    notes.append("Wait events of the working backend (pg_stat_activity every 10 ms, PostgreSQL's "
                 "sys.dm_os_wait_stats; top 4 per step in the table below). Share of samples waiting on the WAL "
                 "(IO WALSync/WALWrite/WALInitSync/WALInitWrite, LWLock WALWrite): " + "; ".join(wal_shares)
                 + ". The article's figure: LOGWRITE (SQL Server's WRITELOG) was the top wait type of its large "
                 "transactions, no numbers given (the author's answer in the comments).")
    for r in rows:
        r.pop("_waits")
        r.pop("_parts")
        r.pop("_checkpoints_during")
        r.pop("_ckpt_added")
    return dict(title="6. WAL segment size (the VLF article's analogue)",
                columns=["step", "wal_segment_mb", "rows", "seconds", "article_seconds", "flushes", "wal_writes", "wal_mb",
                         "segments_filled", "segments_created", "segments_reused", "segments_recycled",
                         "segments_removed", "wal_files", "wal_wait_share"],
                rows=rows, notes=notes, chart=("module", "exp6_segments"),
                extra_tables=[("Wait events of the working backend (pg_stat_activity every 10 ms)",
                               ["step", "wal_segment_mb", "wait_event_type", "wait_event", "samples", "share"],
                               wait_rows)])


def draw_chart(result, path):
    """Left: per step, our 1 MB / 64 MB duration ratio beside the article's
    20,000 / 16 VLF ratio. Right: per step and segment size, segments
    created during the step, reused from earlier recycling, and recycled by
    the checkpoint after it (log scale)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    by = {(r["step"], r["wal_segment_mb"]): r for r in result["rows"]}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw=dict(width_ratios=[1, 1.6]))

    steps = [s for s in ("insert", "update", "delete") if (s, 1) in by and (s, 64) in by]
    ours = [by[(s, 1)]["seconds"] / max(by[(s, 64)]["seconds"], 1e-9) for s in steps]
    art = [ARTICLE[s][1] / ARTICLE[s][0] for s in steps]
    xs = range(len(steps))
    b1 = a1.bar([x - 0.2 for x in xs], ours, width=0.4, color="#4477aa", label="ours: 1 MB / 64 MB segments")
    b2 = a1.bar([x + 0.2 for x in xs], art, width=0.4, color="#cc6677", label="article: 20,000 / 16 VLFs")
    a1.bar_label(b1, [f"{v:.2f}x" for v in ours], fontsize=8)
    a1.bar_label(b2, [f"{v:.1f}x" for v in art], fontsize=8)
    a1.axhline(1, color="grey", linewidth=1, linestyle="--")
    a1.set_xticks(list(xs), steps)
    a1.set_ylabel("duration ratio (many small / few large)")
    a1.set_title("duration ratio per step", fontsize=10)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3, axis="y")

    groups = [s for s in STEP_ORDER if any((s, m) in by for m in SIZES)]
    series = [(m, key, color) for m, shades in ((64, ("#114477", "#4477aa", "#77aadd")),
                                                (1, ("#771122", "#cc6677", "#eeaabb")))
              for key, color in zip(("segments_created", "segments_reused", "segments_recycled"), shades)]
    width = 0.8 / len(series)
    for i, (m, key, color) in enumerate(series):
        vals = [by.get((s, m), {}).get(key, 0) or 0 for s in groups]
        bars = a2.bar([x - 0.4 + width * (i + 0.5) for x in range(len(groups))], [max(v, 0.8) for v in vals],
                      width=width, color=color, label=f"{m} MB: {key.split('_')[1]}")
        a2.bar_label(bars, [str(v) for v in vals], fontsize=7)
    a2.set_yscale("log")
    a2.set_ylim(0.7, None)
    a2.set_xticks(range(len(groups)), [g.replace(", ", ",\n") for g in groups])
    a2.set_ylabel("WAL segments (log scale; 0 drawn at the floor)")
    a2.set_title("segments created during the step, reused (recycled earlier), recycled by the checkpoint after",
                 fontsize=10)
    a2.legend(fontsize=7, ncol=2)
    a2.grid(alpha=0.3, axis="y", which="both")
    fig.suptitle(result["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True

"""Every figure the source articles measured, ours beside it, one table per
seed (pgbench/readme_figures.py's `articles SEED DIR` block).

Each row: the article's figure, ours from the committed results.json, and
whether the two measure the same thing ("like for like"), with what
differs when they do not. SQL Server's "log flushes" are log-block writes,
each write-through, so the counts they correspond to are our WAL writes;
our WAL fsyncs are given beside them.
"""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = ["| article figure | article | ours | like for like | what differs |", "|---|---|---|---|---|"]


def load(path):
    with open(os.path.join(ROOT, path, "results.json")) as f:
        return json.load(f)


def pick(rows, **match):
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def num(v):
    return f"{v:,}" if isinstance(v, int) else str(v)


def secs(v):
    return f"{v:.2f} s" if isinstance(v, (int, float)) else "—"


def flush_cell(r):
    """Our WAL writes (the article's log flushes' counterpart) and fsyncs."""
    if r is None:
        return "not run"
    writes = r.get("wal_writes")
    def plural(n, word):
        return f"{num(n)} {word}" + ("" if n == 1 else "s")
    w = plural(writes, "WAL write") + ", " if writes not in (None, "") else ""
    return w + plural(r["flushes"], "fsync")


def row(figure, article, ours, like, differs=""):
    return f"| {figure} | {article} | {ours} | {like} | {differs} |"


def seed_000(res, scale):
    """Seeds 000/001: the loop of 99,999 procedure calls; what a crash loses."""
    out = list(HEADER)
    e1 = res.get("1", {}).get("rows", [])
    if len(e1) >= 2:
        d, x = e1[0], e1[1]
        machine = "seconds depend on the machine: compare the ratio"
        out.append(row(f"durable loop, {d['transactions']:,} calls", "16 s", secs(d["seconds"]), "yes", machine
                       + "; the article's durable loop also sent a rows-affected message per call (no SET NOCOUNT "
                       "ON), ours sends none"))
        out.append(row("delayed loop (commit opt-in per call)", "3 s", secs(x["seconds"]), "yes",
                       "the article's timer counts whole seconds (3 s is 2.0–4.0 s)"))
        out.append(row("durable / delayed time", f"{16 / 3:.1f}x (whole seconds: {15 / 4:.2f}x to {17 / 2:.1f}x)",
                       f"{d['seconds'] / x['seconds']:.1f}x", "yes",
                       f"per commit, ours costs {d['per_commit_us'] / (16e6 / 99999):.2f} times the article's "
                       f"durable and {x['per_commit_us'] / (3e6 / 99999):.2f} times its delayed one"))
        out.append(row("per commit, durable / delayed", f"{16e6 / 99999:.0f} / {3e6 / 99999:.0f} µs",
                       f"{d['per_commit_us']} / {x['per_commit_us']} µs", "yes", "derived from the seconds above"))
        if "wal_writes" in d:
            out.append(row("log writes (not given by the article)", "—",
                           f"durable {flush_cell(d)}; delayed {flush_cell(x)}", "ours only", ""))
    e8 = res.get("8", {}).get("rows", [])
    loop_rate = round(e1[1]["transactions"] / e1[1]["seconds"]) if len(e1) >= 2 else None
    for label, figure, article, like, differs in (
            ("delayed, default settings", "loss in a crash, disk keeping up", "up to one 60 KB log block", "partly",
             "PostgreSQL has no 60 KB block: its WAL writer fsyncs delayed commits' WAL once 1 MB "
             "(wal_writer_flush_after) has accumulated or 200 ms (wal_writer_delay) passed"),
            ("delayed, max_loss_bytes = 64kB", "loss in a crash with a bound", "— (SQL Server has no bound)",
             "ours only", "the loss budget")):
        cuts = [r for r in e8 if r["variant"] == label]
        if cuts:
            worst_kb = max(r["lost_wal_kb"] or 0 for r in cuts)
            worst_c = max(r["lost_commits"] for r in cuts)
            rates = [r["commits_per_second"] for r in cuts if isinstance(r.get("commits_per_second"), (int, float))]
            rate = (f"; the loop ran at {min(rates):,}–{max(rates):,} commits/s under strace"
                    + (f", {loop_rate:,}/s untraced (experiment 1): a faster loop loses more commits for the "
                       "same WAL" if loop_rate else "")) if rates else ""
            out.append(row(figure, article, f"up to {worst_kb} KB of WAL, {worst_c:,} commits ({len(cuts)} "
                           "simulated power cuts, experiment 8)", like, differs + rate))
    if e8:
        out.append(row("loss in a crash, disk falling behind", "up to the ~7 MB log buffer", "not measured",
                       "no", "our disk kept up; when it falls behind, PostgreSQL's WAL written and not yet fsynced "
                       "grows until the WAL writer's next fsync, a finished segment's fsync or a flush forced by "
                       "writing out a dirty page (max_loss_bytes bounds it)"))
    return out


E2_LABELS = {("permanent", "durable"): "user database, full durability", ("permanent", "delayed"):
             "user database, delayed (FORCED)", ("temporary", "durable"): "tempdb, full durability",
             ("temporary", "delayed"): "tempdb, delayed (FORCED)"}
E3_DB = {"permanent": "user database", "temporary": "tempdb"}


def seed_002(res, scale):
    """Seed 002: small vs big transactions, user database vs tempdb; the
    sequences' table; log records per transaction."""
    out = list(HEADER)
    e2 = res.get("2", {}).get("rows", [])
    n = max((r["rows"] for r in e2), default=0)
    for (table, mode), label in E2_LABELS.items():
        for shape, txns in (("1,000,000 transactions", n), ("1 transaction", 1)):
            r = pick(e2, table=table, durability=mode, transactions=txns)
            if not r:
                continue
            differs = "seconds depend on the machine"
            if n != 1_000_000:
                differs = f"ours {n:,} rows (this scale)"
            if table == "temporary":
                differs += ("; a PostgreSQL temporary table writes no WAL for its rows, where tempdb logs them "
                            "(minimally) and flushes when its log buffer fills")
            if table == "permanent" and txns == 1:
                differs += ("; SQL Server writes a big transaction's log in blocks of at most 60 KB as its log "
                            "buffer fills, PostgreSQL in 8 KB pages, up to wal_buffers at a time")
            like = "yes" if table == "permanent" else "partly"
            out.append(row(f"{label}, {shape if txns != 1 else '1 transaction'}: log flushes, time",
                           f"{r['article_flushes']:,} flushes, {r['article_seconds']} s",
                           f"{flush_cell(r)}, {secs(r['seconds'])}", like, differs))
    big = pick(e2, table="permanent", durability="durable", transactions=1)
    if big and "wal_records" in big:
        out.append(row(f"log records of the one big transaction ({n:,} rows)", "a bit over 1,000,000",
                       f"{big['wal_records']:,} WAL records", "yes", "one per row and the commit"))
    small = pick(e2, table="permanent", durability="durable", transactions=n)
    if small and "wal_records_per_row" in small:
        out.append(row("log records per small transaction", "about 3 (begin, insert, commit)",
                       f"{small['wal_records_per_row']} WAL records", "yes",
                       "PostgreSQL writes no begin record: the insert and the commit"))
    e3 = res.get("3", {}).get("rows", [])
    for mode in ("durable", "delayed"):
        for kind in ("permanent", "temporary"):
            for cache in (1, 50, 10000):
                r = pick(e3, durability=mode, sequence=kind, cache=cache, function="cached_nextval")
                if not r:
                    continue
                cache_name = "NO CACHE" if cache == 1 else f"CACHE {cache:,}"
                asec = "<1 s" if r["article_seconds"] == 0.5 else f"{r['article_seconds']} s"
                differs = "CACHE 1 stands for NO CACHE" if cache == 1 else ""
                if cache == 10000 and kind == "permanent":
                    differs = ("each recovery-value flush writes all WAL pending at once, rows included (ours fit "
                               "in wal_buffers between two flushes), so ours is about one write per flush; SQL "
                               "Server also wrote the rows' log each time its 60 KB buffer filled; our nextval() "
                               "rows, with no flush, write the same WAL in thousands of writes")
                if kind == "temporary":
                    differs = "temporary sequence and table write no WAL"
                if r["values"] != 1_000_000:
                    differs = (differs + "; " if differs else "") + f"ours {r['values']:,} values"
                out.append(row(f"sequence, {cache_name}, {E3_DB[kind]}, {'full' if mode == 'durable' else 'delayed'}"
                               " durability: log flushes, time",
                               f"{r['article_flushes']:,} flushes, {asec}", f"{flush_cell(r)}, {secs(r['seconds'])}",
                               "yes" if kind == "permanent" else "partly", differs))
    return out


WAL_WAITS = {("IO", "WALSync"), ("IO", "WALWrite"), ("LWLock", "WALWrite"), ("IO", "WALInitSync"),
             ("IO", "WALInitWrite")}


def wal_wait_share(w):
    counts = (w or {}).get("counts") or []
    total = sum(n for _, _, n in counts)
    return (100 * sum(n for t, e, n in counts if (t, e) in WAL_WAITS) / total, counts[0][1]) if total else None


def seed_003(res, scale):
    """Seed 003: 5 clients x 200 iterations under SQLQueryStress."""
    out = list(HEADER)
    e4 = res.get("4", {}).get("rows", [])
    art = [r for r in e4 if (r.get("case") or "").startswith("article")]
    ours = [r for r in e4 if (r.get("case") or "ours").startswith("ours")]
    if len(art) >= 2:
        d, x = art[0], art[1]
        rows_per = d.get("rows_per_commit", "")
        out.append(row("durable, 5 threads x 200 iterations", "54 s", secs(d["seconds"]), "partly",
                       f"the article gives no query text; ours is its reading: each iteration one transaction of "
                       f"{num(rows_per)} single-row inserts (row count chosen by us)"))
        out.append(row("delayed (ALLOWED + COMMIT WITH (DELAYED_DURABILITY = ON))", "48 s", secs(x["seconds"]),
                       "partly", "as above; commit_delayed() is the per-commit opt-in"))
        out.append(row("durable / delayed time", f"{54 / 48:.3f}x", f"{d['seconds'] / x['seconds']:.2f}x", "partly",
                       "as above"))
        if d.get("min_flushes_per_second") != "" and "wal_writes" in d:
            out.append(row("lowest Log Flushes/sec, durable run", "20",
                           f"{d['wal_writes'] / d['seconds']:,.0f} WAL writes/s over the run ({d['wal_writes']:,} "
                           f"writes, {d['flushes']:,} fsyncs in {secs(d['seconds'])})", "partly",
                           "the article's lowest one-second value; ours is the run's average (it lasts too few "
                           "seconds for a per-second minimum)"))
            out.append(row("delayed run: \"the log flush number has reduced\"", "a Perfmon graph, no numbers",
                           f"WAL fsyncs {d['flushes']:,} → {x['flushes']:,}; WAL writes {d['wal_writes']:,} → "
                           f"{x['wal_writes']:,}", "partly",
                           "the article's counter counts writes; ours fall in fsyncs only: the WAL writer writes "
                           "each page as it fills"))
    ww = res.get("4", {}).get("wal_writes") or {}
    if "durable" in ww and len(ww) >= 2:
        dl = [k for k in ww if k != "durable"][0]
        out.append(row("log writes (Process Monitor): durable at each commit's size, delayed in fewer random-sized "
                       "chunks", "pictures, no numbers",
                       f"durable {ww['durable']['writes_per_commit']} writes per commit, median "
                       f"{ww['durable']['median_bytes'] / 1024:g} KiB; delayed {ww[dl]['writes_per_commit']}, median "
                       f"{ww[dl]['median_bytes'] / 1024:g} KiB", "partly",
                       "strace of WAL segment writes in a separate phase (5 clients x 20 iterations); with "
                       "transactions this large the delayed writes are barely fewer than the durable ones"))
    waits = res.get("4", {}).get("wait_events") or {}
    shares = {k: wal_wait_share(v) for k, v in waits.items()}
    if shares.get("durable") and len(shares) >= 2:
        parts = "; ".join(f"{k}: {v[0]:.0f}% (top: {v[1]})" for k, v in shares.items() if v)
        out.append(row("WRITELOG waits, which delayed durability \"might resolve\"", "no numbers",
                       "samples of the clients' backends waiting on the WAL: " + parts, "yes",
                       "pg_stat_activity sampled every 10 ms (sys.dm_os_wait_stats)"))
    if len(ours) >= 2:
        d, x = ours[0], ours[1]
        out.append(row(f"many small commits ({d['commits']:,}), durable / delayed time", "— (not the article's)",
                       f"{d['seconds'] / x['seconds']:.1f}x ({secs(d['seconds'])} / {secs(x['seconds'])})",
                       "ours only", "each iteration a loop of committed single-row inserts"))
    return out


def seed_004(res, scale):
    """Seed 004: the VLF article (insert, update, delete with 16 vs 20,000
    VLFs), and LOGWRITE as the top wait (its comments)."""
    out = list(HEADER)
    e6 = res.get("6", {}).get("rows", [])
    for step, (a16, a20000) in (("insert", (281, 1069)), ("update", (174, 1554)), ("delete", (193, 936))):
        small, big = pick(e6, step=step, wal_segment_mb=1), pick(e6, step=step, wal_segment_mb=64)
        if small and big:
            out.append(row(f"{step} of {big['rows']:,} rows: 16 / 20,000 VLFs (our 64 MB / 1 MB segments)",
                           f"{a16} s / {a20000} s ({a20000 / a16:.1f}x)",
                           f"{secs(big['seconds'])} / {secs(small['seconds'])} "
                           f"({small['seconds'] / big['seconds']:.2f}x)", "no",
                           "PostgreSQL has no VLFs: the analogue cuts the same WAL into more segment files"))
    shares = [f"{r['step']} / {r['wal_segment_mb']} MB {r['wal_wait_share']}" for r in e6 if r.get("wal_wait_share")]
    tops = {}
    for t in res.get("6", {}).get("extra_tables", []):
        for w in t[2]:
            tops.setdefault((w["step"], w["wal_segment_mb"]), w["wait_event"])
    if shares:
        top = sorted(set(tops.values()))
        out.append(row("top wait type: LOGWRITE (WRITELOG)", "top, no numbers",
                       "share of the working backend's samples waiting on the WAL: " + "; ".join(shares)
                       + (f"; our top wait of each step: {', '.join(top)}" if top else ""), "partly",
                       "pg_stat_activity sampled every 10 ms (experiment 6's wait table); a WAL wait is never "
                       "our top one here" if not any(t.startswith("WAL") for t in top) else
                       "pg_stat_activity sampled every 10 ms (experiment 6's wait table)"))
    return out


SEEDS = {"000": seed_000, "002": seed_002, "003": seed_003, "004": seed_004}


def articles(seed, path):
    data = load(path)
    return SEEDS[seed](data["results"], data["scale"])

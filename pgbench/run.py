#!/usr/bin/env python3
"""Reproduces the delayed-durability articles' experiments on PostgreSQL.

Creates throwaway clusters (as the postgres user, the extension preloaded),
runs each experiment, and writes report.md plus one PNG chart per
experiment. Durations are the server clock around the work only; "log
flushes" are WAL fsyncs, the delta of PostgreSQL's count (pg_stat_wal.wal_sync;
pg_stat_io from 18).

    python3 pgbench/run.py [--scale tiny|quick|full] [--out DIR] [--only 1,2,...]
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, Progress, Unavailable, measure, as_postgres, wal_sync_total  # noqa: E402
import harness  # noqa: E402
from exp_loss_budget import exp7_loss_budget  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_SQL = open(os.path.join(HERE, "setup.sql")).read()

SCALES = {
    # rows for exp 1, rows for exp 2, values for exp 3, (clients, iterations,
    # rows per iteration) for exp 4, pgbench seconds for exps 3 and 5, rounds
    # of exp 5's interleaved loop runs, rows for exp 6, (rounds, seconds of
    # the server loop, pgbench seconds) per variant and round for exp 7
    "tiny": dict(e1=300, e2=1000, e3=1000, e4=(5, 4, 20), e5=2, e5_rounds=1, e6=2000, e7=(1, 0.2, 1)),
    "quick": dict(e1=100000, e2=200000, e3=200000, e4=(5, 100, 100), e5=5, e5_rounds=3, e6=300000, e7=(6, 0.5, 1)),
    "full": dict(e1=100000, e2=1000000, e3=1000000, e4=(5, 200, 100), e5=30, e5_rounds=3, e6=3000000,
                 e7=(15, 5, 10)),
}


def has_function(cluster, name):
    return cluster.value(f"SELECT count(*) FROM pg_proc WHERE proname = '{name}'") != "0"


def fmt_secs(s):
    return f"{s:.2f}" if s < 100 else f"{s:.0f}"


# ---------------------------------------------------------------- experiments

def exp1_loop(c, scale, log):
    """Loop of single-row inserts, each its own transaction."""
    n = scale["e1"]
    c.psql("ALTER SYSTEM SET delayed_durability.mode = 'allowed'; SELECT pg_reload_conf();")
    rows = []
    for label, delayed, article in (("traditional (durable)", "false", 16), ("delayed (commit_delayed())", "true", 3)):
        log(f"exp 1: {label}, {n} transactions")
        c.psql("TRUNCATE t1; CHECKPOINT;")
        secs, syncs = measure(c, f"CALL insert_loop({n}, {delayed});")
        rows.append(dict(variant=label, transactions=n, seconds=secs, flushes=syncs, article_seconds=article))
    c.psql("ALTER SYSTEM RESET delayed_durability.mode; SELECT pg_reload_conf();")
    ratio = rows[0]["seconds"] / max(rows[1]["seconds"], 1e-9)
    return dict(
        title="1. Loop of single-row inserts",
        columns=["variant", "transactions", "seconds", "flushes", "article_seconds"],
        rows=rows,
        notes=[f"durable/delayed duration ratio: ours {ratio:.1f}x, article {16 / 3:.1f}x (100,000 rows: 16 s vs 3 s)."],
        chart=("bars", "variant"),
    )


def exp2_small_big(c, scale, log):
    """Small vs big transactions, permanent vs temporary table."""
    n = scale["e2"]
    article = {  # (flushes, seconds) for 1,000,000 rows
        ("permanent", "durable", "per-row"): (1000036, 193), ("permanent", "durable", "one"): (1758, 7),
        ("permanent", "delayed", "per-row"): (95407, 22), ("permanent", "delayed", "one"): (1759, 8),
        ("temporary", "durable", "per-row"): (5095, 19), ("temporary", "durable", "one"): (1228, 9),
        ("temporary", "delayed", "per-row"): (5091, 18), ("temporary", "delayed", "one"): (1226, 9),
    }
    rows = []
    for table in ("permanent", "temporary"):
        for mode in ("durable", "delayed"):
            for shape in ("per-row", "one"):
                log(f"exp 2: {table} table, {mode}, {'%d transactions' % n if shape == 'per-row' else '1 transaction'}")
                setup = "SET delayed_durability.mode = '%s';" % ("forced" if mode == "delayed" else "disabled")
                if table == "permanent":
                    c.psql("TRUNCATE t1; CHECKPOINT;")
                    work = (f"CALL insert_loop({n});" if shape == "per-row" else
                            f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO t1 VALUES (i); END LOOP; END $$;")
                else:
                    c.psql("CHECKPOINT;")
                    setup += "\nCREATE TEMP TABLE t1_temp (col1 int);"
                    work = (f"CALL insert_loop_temp({n});" if shape == "per-row" else
                            f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO t1_temp VALUES (i); END LOOP; END $$;")
                secs, syncs = measure(c, work, setup=setup)
                af, asec = article[(table, mode, shape)]
                rows.append(dict(table=table, durability=mode,
                                 transactions=n if shape == "per-row" else 1, rows=n,
                                 seconds=secs, flushes=syncs,
                                 article_flushes=af, article_seconds=asec))
    perm = {(r["durability"], r["transactions"]): r for r in rows if r["table"] == "permanent"}
    dur, dly = perm[("durable", n)], perm[("delayed", n)]
    notes = [
        f"permanent, {n} transactions: durable/delayed duration {dur['seconds'] / max(dly['seconds'], 1e-9):.1f}x "
        f"(article {193 / 22:.1f}x), flushes {dur['flushes']} vs {dly['flushes']} "
        f"(article 1,000,036 vs 95,407 for 1,000,000).",
        "Temporary tables write no WAL for their rows, so their commits never wait for a flush: "
        "PostgreSQL's counterpart of tempdb's lazy commit.",
    ]
    return dict(title="2. Small vs big transactions",
                columns=["table", "durability", "transactions", "rows", "seconds", "flushes",
                         "article_seconds", "article_flushes"],
                rows=rows, notes=notes, chart=("bars", ("table", "durability", "transactions")))


def exp3_sequences(c, scale, log):
    if not has_function(c, "cached_nextval"):
        raise Unavailable("needs cached_nextval(), not in this build")
    n = scale["e3"]
    article = {  # (flushes, seconds) for 1,000,000 values
        ("durable", "permanent", 1): (1000047, 171), ("durable", "permanent", 50): (20008, 4),
        ("durable", "permanent", 10000): (339, 0.5), ("durable", "temporary", 1): (96, 4),
        ("durable", "temporary", 50): (74, 1), ("durable", "temporary", 10000): (8, 0.5),
        ("delayed", "permanent", 1): (1000045, 166), ("delayed", "permanent", 50): (20011, 4),
        ("delayed", "permanent", 10000): (334, 0.5), ("delayed", "temporary", 1): (91, 4),
        ("delayed", "temporary", 50): (74, 1), ("delayed", "temporary", 10000): (8, 0.5),
    }
    rows = []
    for mode in ("durable", "delayed"):
        for kind in ("permanent", "temporary"):
            for cache in (1, 50, 10000):
                for fn in ("cached_nextval", "nextval"):
                    log(f"exp 3: {mode}, {kind} sequence, CACHE {cache}, {fn}, {n} values")
                    temp = "TEMP " if kind == "temporary" else ""
                    setup = ("SET delayed_durability.mode = '%s';\n" % ("forced" if mode == "delayed" else "disabled")
                             + f"DROP TABLE IF EXISTS seq_out; DROP SEQUENCE IF EXISTS s;\n"
                             f"CREATE {temp}SEQUENCE s CACHE {cache};")
                    secs, syncs = measure(c, f"SELECT {fn}('s') AS v INTO seq_out FROM generate_series(1, {n});",
                                          setup=setup)
                    af, asec = article[(mode, kind, cache)] if fn == "cached_nextval" else ("", "")
                    rows.append(dict(durability=mode, sequence=kind, cache=cache, function=fn, values=n,
                                     seconds=secs, flushes=syncs, flushes_per_row=round(syncs / n, 4),
                                     article_flushes=af, article_seconds=asec))
    # Throughput against native nextval at CACHE 10000, one call per
    # transaction and a million calls in one statement, side by side.
    c.psql("DROP SEQUENCE IF EXISTS tput_cached, tput_native; "
           "CREATE SEQUENCE tput_cached CACHE 10000; CREATE SEQUENCE tput_native CACHE 10000;")
    tput = []
    for fn, seq in (("nextval", "tput_native"), ("cached_nextval", "tput_cached")):
        script = os.path.join(c.dir, f"{fn}.sql")
        with open(script, "w") as f:
            f.write(f"SELECT {fn}('{seq}');\n")
        os.chmod(script, 0o644)
        for clients in (1, 4):
            log(f"exp 3: throughput, {fn}, {clients} client(s)")
            tps, _ = c.pgbench(script, clients, seconds=scale["e5"])
            tput.append(dict(function=fn, workload=f"pgbench, {clients} client(s), 1 call per transaction",
                             calls_per_second=round(tps)))
        log(f"exp 3: throughput, {fn}, {n} calls in one statement")
        secs, _ = measure(c, f"SELECT count({fn}('{seq}')) FROM generate_series(1, {n});")
        tput.append(dict(function=fn, workload=f"{n} calls in one statement", calls_per_second=round(n / secs)))
    by = {(r["function"], r["workload"]): r["calls_per_second"] for r in tput}
    ratio_notes = []
    for workload in dict.fromkeys(r["workload"] for r in tput):
        ratio = by[("cached_nextval", workload)] / max(by[("nextval", workload)], 1)
        ratio_notes.append(f"cached_nextval / nextval throughput, {workload}: {ratio:.2f}x (goal 0.9x).")
    scaling = by[("cached_nextval", "pgbench, 4 client(s), 1 call per transaction")] / max(
        by[("cached_nextval", "pgbench, 1 client(s), 1 call per transaction")], 1)
    ratio_notes.append(f"cached_nextval scaling from 1 to 4 clients: {scaling:.2f}x.")
    return dict(title="3. Sequences",
                columns=["durability", "sequence", "cache", "function", "values", "seconds", "flushes",
                         "flushes_per_row", "article_seconds", "article_flushes"],
                rows=rows,
                notes=["cached_nextval() writes a recovery value and flushes once per CACHE values in every mode "
                       "(the article's SQL Server behaviour); native nextval() never flushes, which is why it can "
                       "hand a value out twice after a crash under asynchronous commit. Temporary sequences "
                       "never flush. Article seconds shown as 0.5 mean '<1'."] + ratio_notes,
                extra_tables=[("Throughput at CACHE 10000", ["function", "workload", "calls_per_second"], tput)],
                chart=("bars", ("durability", "sequence", "cache", "function")))


def sample_wal_syncs(c, stop, samples, t0):
    while not stop.is_set():
        try:
            samples.append((time.monotonic() - t0, int(c.value("SELECT delayed_durability_wal_fsyncs()"))))
        except RuntimeError:
            pass
        stop.wait(1.0)


def exp4_concurrent(c, scale, log):
    clients, iterations, rows_per = scale["e4"]
    script = os.path.join(c.dir, "insert_loop.sql")
    shutil.copy(os.path.join(HERE, "insert_loop.sql"), script)
    os.chmod(script, 0o644)
    results, series = [], {}
    for label, mode, article in (("durable", "disabled", 54), ("delayed", "forced", 48)):
        log(f"exp 4: {label}, {clients} clients x {iterations} iterations x {rows_per} rows")
        c.psql(f"TRUNCATE t1; CHECKPOINT; ALTER SYSTEM SET delayed_durability.mode = '{mode}'; SELECT pg_reload_conf();")
        time.sleep(0.2)
        before = wal_sync_total(c)
        stop, samples = threading.Event(), []
        t0 = time.monotonic()
        sampler = threading.Thread(target=sample_wal_syncs, args=(c, stop, samples, t0))
        sampler.start()
        tps, done = c.pgbench(script, clients, transactions=iterations,
                              defines=(f"rows={rows_per}", "delayed=false"))
        secs = time.monotonic() - t0
        time.sleep(1.1)  # let backends publish their last WAL statistics
        stop.set()
        sampler.join()
        after = wal_sync_total(c)
        commits = clients * iterations * rows_per
        results.append(dict(variant=label, clients=clients, commits=commits, seconds=round(secs, 2),
                            flushes=after - before, commits_per_second=round(commits / secs),
                            article_seconds=article))
        rates = []
        for (ta, a), (tb, b) in zip(samples, samples[1:]):
            if tb > ta:
                rates.append((round(tb, 2), round((b - a) / (tb - ta), 1)))
        series[label] = rates
    c.psql("ALTER SYSTEM RESET delayed_durability.mode; SELECT pg_reload_conf();")
    return dict(title="4. Concurrent workload",
                columns=["variant", "clients", "commits", "seconds", "flushes", "commits_per_second",
                         "article_seconds"],
                rows=results,
                notes=[f"durable/delayed duration ratio: ours {results[0]['seconds'] / max(results[1]['seconds'], 1e-9):.1f}x, "
                       f"article {54 / 48:.2f}x.",
                       f"Group commit: the durable run needed {results[0]['flushes']:,} WAL flushes for "
                       f"{results[0]['commits']:,} commits ({results[0]['commits'] / max(results[0]['flushes'], 1):.1f} "
                       "commits per flush), since concurrent commits share one fsync.",
                       "Log flushes per second are sampled from PostgreSQL's WAL fsync count once a second; backends publish "
                       "their counters at most once a second, so the line is coarse."],
                chart=("lines", series))


PMEM_NOTE = ("/dev/shm is DRAM standing in for persistent memory (PMEM_IS_PMEM_FORCE=1 makes libpmem use "
             "cache-flush persistence there, as on a DAX device): it proves the speed and the crash path "
             "(TAP test 014), but a real power cut needs a real persistent-memory (DAX) device.")


def counts_absorbed_fsyncs(cl):
    """PostgreSQL 18 counts WAL fsyncs in pg_stat_io after the call, so an
    fsync the WAL buffer absorbed is counted there; up to 17 the extension
    takes it back from pg_stat_wal before it is published."""
    return int(cl.value("SHOW server_version_num")) >= 180000


def buffer_counters(cl):
    return [int(x) for x in cl.value(
        "SELECT wal_buffer_fsyncs_avoided || ' ' || wal_buffer_drains FROM delayed_durability_status()").split()]


def exp5_pmem(c, scale, log):
    """Durable commits with the persistent WAL buffer, against WAL fsync and delayed durability."""
    if not has_function(c, "delayed_durability_wal_buffer_state"):
        raise Unavailable("needs the persistent WAL buffer (delayed_durability.wal_buffer_path), not in this build")
    n, seconds, rounds = scale["e1"], scale["e5"], scale["e5_rounds"]
    buffer_path = f"/dev/shm/dd-experiment5-{os.getpid()}.buf"
    # /dev/shm is tmpfs: accepted only with the explicit opt-in.
    b = Cluster("pmem", c.port + 20, conf=f"delayed_durability.wal_buffer_path = '{buffer_path}'\n"
                "delayed_durability.wal_buffer_allow_volatile = on\n",
                server_env={"PMEM_IS_PMEM_FORCE": "1"})
    fsync, pmem, delayed = "durable, WAL fsync", "durable, WAL buffer on /dev/shm", "delayed (forced)"
    variants = ((fsync, c, "disabled"), (pmem, b, "disabled"), (delayed, c, "forced"))
    try:
        b.psql(SETUP_SQL)
        is_pmem = b.value("SELECT wal_buffer_is_pmem FROM delayed_durability_status()") == "t"
        absorbed_counted = counts_absorbed_fsyncs(b)
        runs = {label: [] for label, _, _ in variants}
        for r in range(rounds):
            # Interleaved, so that the VM's swings hit every variant alike.
            for label, cl, mode in variants:
                log(f"exp 5: round {r + 1}/{rounds}: {label}, {n} transactions")
                cl.psql("TRUNCATE t1; CHECKPOINT;")
                avoided0, drains0 = buffer_counters(cl)
                secs, syncs = measure(cl, f"CALL insert_loop({n});", setup=f"SET delayed_durability.mode = '{mode}';")
                avoided1, drains1 = buffer_counters(cl)
                if absorbed_counted:
                    # Counters read outside the measured window: a few
                    # either way, never below zero.
                    syncs = max(syncs - (avoided1 - avoided0), 0)
                runs[label].append(dict(variant=label, transactions=n, seconds=secs, flushes=syncs,
                                        fsyncs_avoided=avoided1 - avoided0, buffer_drains=drains1 - drains0))
        # The median run of each variant (the middle one of an odd count).
        rows = [sorted(runs[label], key=lambda x: x["seconds"])[(len(runs[label]) - 1) // 2]
                for label, _, _ in variants]
        tput = []
        for cl in (c, b):
            shutil.copy(os.path.join(HERE, "insert_single.sql"), os.path.join(cl.dir, "insert_single.sql"))
            os.chmod(os.path.join(cl.dir, "insert_single.sql"), 0o644)
        for clients in (1, 4):
            for label, cl, mode in variants:
                log(f"exp 5: pgbench single-row inserts, {clients} client(s), {label}")
                cl.psql(f"ALTER SYSTEM SET delayed_durability.mode = '{mode}'; SELECT pg_reload_conf();")
                time.sleep(0.2)
                before, avoided0 = wal_sync_total(cl), buffer_counters(cl)[0]
                tps, done = cl.pgbench(os.path.join(cl.dir, "insert_single.sql"), clients, seconds=seconds)
                time.sleep(1.1)  # let backends publish their last WAL statistics
                after = wal_sync_total(cl)
                if absorbed_counted:
                    after = max(after - (buffer_counters(cl)[0] - avoided0), before)
                cl.psql("ALTER SYSTEM RESET delayed_durability.mode; SELECT pg_reload_conf();")
                tput.append(dict(variant=label, clients=clients, transactions=done, tps=round(tps),
                                 flushes=after - before))
    finally:
        b.stop()
        if os.path.exists(buffer_path):
            os.unlink(buffer_path)
    def median_ratio(other):
        # Per round, so that each ratio compares runs made moments apart.
        ratios = sorted(o["seconds"] / max(p["seconds"], 1e-9) for o, p in zip(runs[other], runs[pmem]))
        return ratios[(len(ratios) - 1) // 2], ratios[0], ratios[-1]

    vs_delayed, vs_fsync = median_ratio(delayed), median_ratio(fsync)
    notes = [
        f"Server-side loop, throughput of durable commits with the buffer: {vs_delayed[0]:.2f}x the delayed "
        f"throughput (goal at least 0.8x) and {vs_fsync[0]:.1f}x the WAL-fsync throughput (goal at least 5x). "
        f"Median of the per-round ratios over {rounds} interleaved round(s) (range {vs_delayed[1]:.2f}-"
        f"{vs_delayed[2]:.2f}x and {vs_fsync[1]:.1f}-{vs_fsync[2]:.1f}x); the table shows each variant's median run.",
    ]
    tp = {(r["variant"], r["clients"]): r["tps"] for r in tput}
    for clients in (1, 4):
        notes.append(f"pgbench, {clients} client(s): buffer {tp[(pmem, clients)] / max(tp[(delayed, clients)], 1):.2f}x "
                     f"delayed, {tp[(pmem, clients)] / max(tp[(fsync, clients)], 1):.1f}x WAL fsync.")
    notes += [
        "With the buffer every commit is durable (its WAL is in the buffer before the commit returns); "
        "pg_wal is fsynced only when a segment is finished or the buffer is three quarters full, "
        "so `flushes` (real WAL fsyncs) stays near zero while fsyncs_avoided counts one per commit. "
        "(PostgreSQL 18 counts the absorbed calls in pg_stat_io too; they are subtracted here.)",
        f"libpmem reported the buffer as {'persistent memory' if is_pmem else 'not persistent memory (msync)'}.",
        PMEM_NOTE,
    ]
    return dict(title="5. Persistent WAL buffer (SQL Server's persisted log buffer)",
                columns=["variant", "transactions", "seconds", "flushes", "fsyncs_avoided", "buffer_drains"],
                rows=rows, notes=notes,
                extra_tables=[("pgbench single-row inserts", ["variant", "clients", "transactions", "tps", "flushes"],
                               tput)],
                chart=("bars", "variant"))


CUSTOMER_DDL = """
CREATE TABLE {name} (
  c_id int NOT NULL, c_d_id smallint NOT NULL, c_w_id int NOT NULL,
  c_first varchar(16), c_middle char(2), c_last varchar(16),
  c_street_1 varchar(20), c_street_2 varchar(20), c_city varchar(20),
  c_state char(2), c_zip char(9), c_phone char(16), c_since timestamp,
  c_credit char(2), c_credit_lim numeric(12,2), c_discount numeric(4,4),
  c_balance numeric(12,2), c_ytd_payment numeric(12,2),
  c_payment_cnt smallint, c_delivery_cnt smallint, c_data varchar(500));
"""

CUSTOMER_FILL = """
INSERT INTO customer_src
SELECT i, 1 + i % 10, 1 + i / 30000, md5(i::text)::varchar(16), 'OE', 'BAR' || (i % 1000),
       md5('s1' || i)::varchar(20), md5('s2' || i)::varchar(20), md5('c' || i)::varchar(20),
       'CA', '123411111', '0123456789012345', now(), CASE WHEN i % 10 = 0 THEN 'BC' ELSE 'GC' END,
       50000, (i % 5000) / 10000.0, -10, 10, 1, 0,
       upper(repeat(md5(i::text), 10))::varchar(500)
  FROM generate_series(1, {n}) AS i;
"""


def exp6_segments(c, scale, log):
    """PostgreSQL's analogue of the VLF article: WAL segment size."""
    n = scale["e6"]
    article = {"insert": (281, 1069), "update": (174, 1554), "delete": (193, 936)}
    rows = []
    port = c.port + 10
    for segsize in (64, 1):
        log(f"exp 6: cluster with {segsize} MB WAL segments, {n} customers")
        cl = Cluster(f"seg{segsize}", port, conf="max_wal_size = 8GB\n", wal_segsize_mb=segsize)
        port += 1
        try:
            cl.psql(SETUP_SQL + CUSTOMER_DDL.format(name="customer_src") + CUSTOMER_DDL.format(name="customer")
                    + CUSTOMER_FILL.format(n=n) + "CHECKPOINT;")
            for step, sql in (("insert", "INSERT INTO customer SELECT * FROM customer_src;"),
                              ("update", "UPDATE customer SET c_data = lower(c_data);"),
                              ("delete", "DELETE FROM customer;")):
                log(f"exp 6: {segsize} MB segments: {step}")
                lsn0 = cl.value("SELECT pg_current_wal_insert_lsn()")
                secs, syncs = measure(cl, sql)
                wal = int(float(cl.value(f"SELECT pg_current_wal_insert_lsn() - '{lsn0}'::pg_lsn")))
                a16, a20000 = article[step]
                rows.append(dict(step=step, wal_segment_mb=segsize, rows=n, seconds=secs, flushes=syncs,
                                 wal_mb=round(wal / 1048576, 1),
                                 segments_filled=round(wal / (segsize * 1048576), 1),
                                 article_seconds=a16 if segsize == 64 else a20000))
                cl.psql("CHECKPOINT;")
        finally:
            cl.stop()
    by = {(r["step"], r["wal_segment_mb"]): r for r in rows}
    notes = []
    for step in ("insert", "update", "delete"):
        small, big = by[(step, 1)], by[(step, 64)]
        a16, a20000 = article[step]
        notes.append(f"{step}: 1 MB / 64 MB segments duration ratio ours {small['seconds'] / max(big['seconds'], 1e-9):.2f}x, "
                     f"article (20,000 / 16 VLFs) {a20000 / a16:.1f}x.")
    notes.append("PostgreSQL has no VLFs: its WAL is a sequence of fixed-size segment files, each fsynced once "
                 "when full and recycled after checkpoints. Small segments mean more files and more (smaller) "
                 "fsyncs, but no per-file scan at recovery or log-reuse bookkeeping like SQL Server's VLF "
                 "chain, so whatever effect shows here is the per-file cost only.")
    return dict(title="6. WAL segment size (the VLF article's analogue)",
                columns=["step", "wal_segment_mb", "rows", "seconds", "flushes", "wal_mb", "segments_filled",
                         "article_seconds"],
                rows=rows, notes=notes, chart=("bars", ("step", "wal_segment_mb")))


EXPERIMENTS = [
    ("1", exp1_loop), ("2", exp2_small_big), ("3", exp3_sequences),
    ("4", exp4_concurrent), ("5", exp5_pmem), ("6", exp6_segments),
    ("7", exp7_loss_budget),
]


# ------------------------------------------------------------------- reports

def label_of(row, key):
    if isinstance(key, tuple):
        return " / ".join(str(row[k]) for k in key)
    return str(row[key])


def draw_chart(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kind, key = result["chart"]
    if kind == "module":  # an experiment module that draws its own chart
        return __import__(key).draw_chart(result, path)
    if kind == "lines":
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for label, pts in key.items():
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("WAL flushes per second")
        ax.set_title(result["title"] + ": Log Flushes/sec")
        ax.legend()
        ax.grid(alpha=0.3)
    else:
        rows = result["rows"]
        labels = [label_of(r, key) for r in rows]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.45 * len(rows) + 1.5)))
        ys = range(len(rows))
        a1.barh(ys, [r["seconds"] for r in rows], color="#4477aa")
        a1.set_yticks(list(ys), labels, fontsize=8)
        a1.invert_yaxis()
        a1.set_xlabel("seconds (server clock)")
        a1.set_title("duration")
        a2.barh(ys, [max(r["flushes"], 0.5) for r in rows], color="#cc6677")
        a2.set_yticks(list(ys), [""] * len(rows))
        a2.invert_yaxis()
        a2.set_xscale("log")
        a2.set_xlabel("WAL flushes (log scale)")
        a2.set_title("log flushes")
        fig.suptitle(result["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def markdown_table(result):
    cols = result["columns"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        cells = []
        for col in cols:
            v = r.get(col, "")
            if col == "seconds" and isinstance(v, float):
                v = fmt_secs(v)
            elif isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
                v = f"{v:,}"
            cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_description():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(open("/proc/meminfo").readline().split()[1])
        mem = f", {kb // 1048576} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    pg = subprocess.run([os.path.join(harness.PGBIN, "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} x {cpu}{mem}, {platform.platform()}, {pg}"


def write_report(out, scale_name, results, skipped, elapsed, server_version):
    md = [f"# Delayed durability experiments ({scale_name} scale)", "",
          f"Machine: {machine_description()}. Server: PostgreSQL {server_version}.", "",
          f"Run took {elapsed:.0f} s. Durations are the server clock around the work only; flushes are WAL "
          "fsyncs (PostgreSQL's own count: the `pg_stat_wal.wal_sync` delta, `pg_stat_io`'s WAL fsyncs "
          "from 18). Absolute seconds on a shared VM move with load: compare "
          "the ratios, measured side by side in one run.", ""]
    if scale_name != "full":
        md += [f"Counts are scaled down ({scale_name} scale: {SCALES[scale_name]}); the article figures are "
               "for the articles' full sizes, so compare ratios, not absolute values. "
               "`python3 pgbench/run.py --scale full` runs the articles' sizes.", ""]
    for exp_id, res in results:
        md += [f"## {res['title']}", "", markdown_table(res), ""]
        for title, cols, rows in res.get("extra_tables", []):
            md += [f"### {title}", "", markdown_table(dict(columns=cols, rows=rows)), ""]
        md += [f"- {n}" for n in res.get("notes", [])]
        if res.get("chart_file"):
            md += ["", f"![{res['title']}]({res['chart_file']})"]
        md.append("")
    for exp_id, reason in skipped:
        md += [f"## Experiment {exp_id}: not available", "", reason, ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"scale": scale_name, "server_version": server_version, "results": {k: v for k, v in results},
                   "skipped": dict(skipped)}, f, indent=1, default=str)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=SCALES, default="quick")
    ap.add_argument("--out", default=os.path.join(HERE, "report"))
    ap.add_argument("--only", default="", help="comma-separated experiment numbers")
    ap.add_argument("--port", type=int, default=55432)
    args = ap.parse_args()
    scale = SCALES[args.scale]
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    log = Progress()
    log(f"scale {args.scale}; report in {args.out}")
    c = Cluster("experiments", args.port)
    results, skipped = [], []
    try:
        server_version = c.value("SHOW server_version")
        log(f"PostgreSQL {server_version} ({harness.PGBIN})")
        c.psql(SETUP_SQL)
        for exp_id, fn in EXPERIMENTS:
            if only and exp_id not in only:
                continue
            try:
                res = fn(c, scale, log)
            except Unavailable as e:
                log(f"exp {exp_id}: not available: {e}")
                skipped.append((exp_id, str(e)))
                continue
            chart = f"experiment{exp_id}.png"
            if draw_chart(res, os.path.join(args.out, chart)):
                res["chart_file"] = chart
            results.append((exp_id, res))
            extra = "".join(f"\n### {t}\n{markdown_table(dict(columns=cl, rows=rw))}\n"
                            for t, cl, rw in res.get("extra_tables", []))
            print(f"\n## {res['title']}\n{markdown_table(res)}\n{extra}" + "\n".join(f"- {n}" for n in res["notes"])
                  + "\n", flush=True)
    finally:
        c.stop()
    write_report(args.out, args.scale, results, skipped, time.monotonic() - log.start, server_version)
    log(f"done: {os.path.join(args.out, 'report.md')}")


if __name__ == "__main__":
    main()

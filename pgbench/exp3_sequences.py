"""Experiment 3 (the sequences article): cached_nextval() against nextval()
by CACHE size, permanent and temporary sequences, durable and delayed;
throughput at CACHE 10000 in interleaved pairs.
"""
import os
import statistics

from harness import Unavailable, has_function, measure, measure_wal
from paired import fmt_interval, ratio_summary, run_pairs

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
    # The article's "tempdb" case has both the sequence and the SELECT INTO
    # target in tempdb: here both temporary. Unlogged is PostgreSQL's other
    # analogue (no WAL for the rows either, but the objects survive a clean
    # restart); the article has no such case.
    kinds = (("permanent", "", "permanent"), ("temporary", "TEMP ", "tempdb"), ("unlogged", "UNLOGGED ", None))
    for mode in ("durable", "delayed"):
        # The database's setting, as the article's ALTER DATABASE ... SET
        # DELAYED_DURABILITY (each measurement is a new session).
        c.psql("ALTER DATABASE postgres SET delayed_durability.mode = '%s';"
               % ("forced" if mode == "delayed" else "disabled"))
        for kind, prefix, article_db in kinds:
            for cache in (1, 50, 10000):
                for fn in ("cached_nextval", "nextval"):
                    log(f"exp 3: {mode}, {kind} sequence and table, CACHE {cache}, {fn}, {n} values")
                    setup = (f"DROP TABLE IF EXISTS seq_out; DROP SEQUENCE IF EXISTS s;\n"
                             f"CREATE {prefix}SEQUENCE s CACHE {cache};")
                    m = measure_wal(c, f"SELECT {fn}('s') AS v INTO {prefix}seq_out FROM generate_series(1, {n});",
                                    setup=setup)
                    secs, syncs = m["seconds"], m["fsyncs"]
                    af, asec = ("", "")
                    if fn == "cached_nextval" and article_db:
                        af, asec = article[(mode, kind, cache)]
                    rows.append(dict(durability=mode, sequence=kind, cache=cache, function=fn, values=n,
                                     seconds=secs, flushes=syncs, wal_writes=m["writes"],
                                     wal_mb=round(m["bytes"] / 2**20, 1), flushes_per_row=round(syncs / n, 4),
                                     article_flushes=af, article_seconds=asec,
                                     article_database=article_db if fn == "cached_nextval" and article_db else ""))
    c.psql("ALTER DATABASE postgres RESET delayed_durability.mode;")
    # The CACHE 10000 cell: how its flushes split, from the data.
    cell = next(r for r in rows if (r["durability"], r["sequence"], r["cache"], r["function"])
                == ("durable", "permanent", 10000, "cached_nextval"))
    recovery_flushes = -(-n // 10000)
    native = next(r for r in rows if (r["durability"], r["sequence"], r["cache"], r["function"])
                  == ("durable", "permanent", 10000, "nextval"))
    cache_note = (
        f"The CACHE 10000 cell: ours {cell['flushes']:,} WAL fsyncs and {cell['wal_writes']:,} WAL writes for "
        f"{n:,} values, of which {recovery_flushes:,} are the recovery-value flushes (one per 10,000 values). Each "
        "such flush writes all the WAL pending at once, the SELECT INTO's rows included (they fit in wal_buffers "
        f"between two flushes), so the writes are about one per flush; native nextval() writes the same "
        f"{native['wal_mb']:,} MB of WAL in {native['wal_writes']:,} writes, with no flush to gather them. The "
        "article's 339 (for 1,000,000 values) are log-block writes: its 100 recovery-value flushes plus the "
        "writes of its 60 KB log buffer each time the rows filled it.")
    # Throughput against native nextval at CACHE 10000, one call per
    # transaction (pgbench) and many calls in one statement, in interleaved
    # pairs: the median of the per-pair ratios with its 95% interval.
    c.psql("DROP SEQUENCE IF EXISTS tput_cached, tput_native; "
           "CREATE SEQUENCE tput_cached CACHE 10000; CREATE SEQUENCE tput_native CACHE 10000;")
    pairs, seconds = scale["e3_pairs"]
    for fn, seq in (("nextval", "tput_native"), ("cached_nextval", "tput_cached")):
        script = os.path.join(c.dir, f"{fn}.sql")
        with open(script, "w") as f:
            f.write(f"SELECT {fn}('{seq}');\n")
        os.chmod(script, 0o644)

    def pgbench(fn, clients):
        return c.pgbench(os.path.join(c.dir, f"{fn}.sql"), clients, seconds=seconds)[0]

    def bulk(fn, seq):
        return n / measure(c, f"SELECT count({fn}('{seq}')) FROM generate_series(1, {n});")[0]

    tput, ratio_notes, per_client = [], [], {}
    workloads = [(f"pgbench, {k} client(s), 1 call per transaction", (lambda k: lambda fn, seq: pgbench(fn, k))(k), 0.95)
                 for k in (1, 4)] + [(f"{n} calls in one statement", bulk, 0.9)]
    for workload, run, goal in workloads:
        cached, native = run_pairs(pairs, lambda: run("cached_nextval", "tput_cached"),
                                   lambda: run("nextval", "tput_native"), log, f"exp 3: throughput, {workload}")
        per_client[workload] = (cached, native)
        for fn, xs in (("nextval", native), ("cached_nextval", cached)):
            tput.append(dict(function=fn, workload=workload, calls_per_second=round(statistics.median(xs))))
        s = ratio_summary(cached, native)
        ratio_notes.append(f"cached_nextval / nextval throughput, {workload}: {s['median']:.2f}x, 95% interval "
                           f"{fmt_interval(s, 2)}, {s['pairs']} interleaved pairs (goal {goal}x).")
    one, four = (per_client[f"pgbench, {k} client(s), 1 call per transaction"] for k in (1, 4))
    ratio_notes.append("Scaling from 1 to 4 clients (median throughput ratio): cached_nextval "
                       f"{statistics.median(four[0]) / statistics.median(one[0]):.2f}x, nextval "
                       f"{statistics.median(four[1]) / statistics.median(one[1]):.2f}x.")
    return dict(title="3. Sequences",
                columns=["durability", "sequence", "cache", "function", "values", "seconds", "flushes",
                         "wal_writes", "flushes_per_row", "article_database", "article_seconds", "article_flushes"],
                rows=rows,
                headers=dict(article_flushes="article_log_flushes (log-block writes: beside wal_writes)"),
                notes=["cached_nextval() writes a recovery value and flushes once per CACHE values in every mode "
                       "(the article's SQL Server behaviour); native nextval() never flushes, which is why it can "
                       "hand a value out twice after a crash under asynchronous commit. Temporary sequences "
                       "never flush. Article seconds shown as 0.5 mean '<1'.",
                       "The twelve cells of the article's table (NO CACHE = CACHE 1, 50, 10000 x its user "
                       "database and tempdb x full and delayed durability) are the cached_nextval rows of the "
                       "permanent and temporary kinds; 'temporary' makes both the sequence and the SELECT INTO "
                       "target temporary, as tempdb holds both in the article. The unlogged rows (sequence and "
                       "table UNLOGGED) have no article figure. The article's figures are for 1,000,000 values: "
                       "at another scale compare flushes per value and the shape, not seconds.",
                       cache_note] + ratio_notes,
                extra_tables=[("Throughput at CACHE 10000", ["function", "workload", "calls_per_second"], tput)],
                chart=("bars", ("durability", "sequence", "cache", "function")))

"""Experiment 2 (the tempdb article): small vs big transactions, permanent
vs temporary table, durable and delayed.

As the article: the durability is the database's setting (ALTER DATABASE
... SET DELAYED_DURABILITY = Disabled / Forced; here ALTER DATABASE ... SET
delayed_durability.mode = 'disabled' / 'forced', read by each new session),
and T1 has one NOT NULL int column (pgbench/setup.sql).
"""
from harness import measure_wal

# The article: a small transaction writes about three log records (begin,
# the insert, commit), about 3,000,000 for its 1,000,000 transactions.
ARTICLE_RECORDS_PER_TRANSACTION = 3

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
                c.psql("ALTER DATABASE postgres SET delayed_durability.mode = '%s';"
                       % ("forced" if mode == "delayed" else "disabled"))
                setup = ""
                if table == "permanent":
                    c.psql("TRUNCATE t1; CHECKPOINT;")
                    work = (f"CALL insert_loop({n});" if shape == "per-row" else
                            f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO t1 VALUES (i); END LOOP; END $$;")
                else:
                    c.psql("CHECKPOINT;")
                    setup += "\nCREATE TEMP TABLE t1_temp (col1 int NOT NULL);"
                    work = (f"CALL insert_loop_temp({n});" if shape == "per-row" else
                            f"DO $$ BEGIN FOR i IN 1..{n} LOOP INSERT INTO t1_temp VALUES (i); END LOOP; END $$;")
                m = measure_wal(c, work, setup=setup)
                db_mode = c.value("SHOW delayed_durability.mode")
                af, asec = article[(table, mode, shape)]
                transactions = n if shape == "per-row" else 1
                rows.append(dict(table=table, durability=mode, database_mode=db_mode,
                                 transactions=transactions, rows=n,
                                 seconds=m["seconds"], flushes=m["fsyncs"], wal_writes=m["writes"],
                                 wal_records=m["records"], wal_mb=round(m["bytes"] / 2**20, 1),
                                 wal_records_per_row=round(m["records"] / n, 2),
                                 article_flushes=af, article_seconds=asec))
    c.psql("ALTER DATABASE postgres RESET delayed_durability.mode;")
    perm = {(r["durability"], r["transactions"]): r for r in rows if r["table"] == "permanent"}
    dur, dly = perm[("durable", n)], perm[("delayed", n)]
    notes = [
        f"permanent, {n} transactions: durable/delayed duration {dur['seconds'] / max(dly['seconds'], 1e-9):.1f}x "
        f"(article {193 / 22:.1f}x), flushes {dur['flushes']} vs {dly['flushes']} "
        f"(article 1,000,036 vs 95,407 for 1,000,000); WAL writes {dur['wal_writes']} vs {dly['wal_writes']}.",
        "Flush counts, like for like: SQL Server's log flushes are log-block writes, each write-through "
        "(durable at once), so the article's flush column counts writes. wal_writes is PostgreSQL's count "
        "of WAL writes (pg_stat_wal.wal_write; pg_stat_io from 18), the column to read beside the article's; "
        "flushes are WAL fsyncs, which a durable commit waits for. A durable commit writes and fsyncs; a "
        "delayed one leaves both to the WAL writer, which writes what is there each time it wakes but "
        "fsyncs only once wal_writer_flush_after (1 MB by default) has accumulated or wal_writer_delay "
        f"has passed: ours, delayed, {dly['wal_mb'] / max(dly['flushes'], 1):.2f} MB of WAL per fsync "
        f"({dly['wal_mb']:,} MB, {dly['flushes']:,} fsyncs) and {dly['wal_mb'] * 1024 / max(dly['wal_writes'], 1):.0f} "
        "KB per write.",
        f"WAL records per row: {dur['wal_records_per_row']} for the durable small transactions (article about "
        f"{ARTICLE_RECORDS_PER_TRANSACTION} log records per small transaction: begin, insert, commit). "
        "PostgreSQL logs no begin record: a small transaction writes the insert and the commit record.",
        "Durability set per database as the article did (ALTER DATABASE ... SET delayed_durability.mode, "
        "database_mode column); T1 has one NOT NULL int column as the article's.",
        "Temporary tables write no WAL for their rows, so their commits never wait for a flush: "
        "PostgreSQL's counterpart of tempdb's lazy commit.",
    ]
    return dict(title="2. Small vs big transactions",
                columns=["table", "durability", "database_mode", "transactions", "rows", "seconds", "flushes",
                         "wal_writes", "wal_records_per_row", "article_seconds", "article_flushes"],
                headers=dict(article_flushes="article_log_flushes (log-block writes: beside wal_writes)"),
                rows=rows, notes=notes, chart=("bars", ("table", "durability", "transactions")))

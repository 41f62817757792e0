"""Experiment 2 (the tempdb article): small vs big transactions, permanent
vs temporary table, durable and delayed.
"""
from harness import measure

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

"""Experiment 1 (the delayed-durability article): a loop of single-row
inserts, each its own transaction, durable and delayed.
"""
from harness import measure

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

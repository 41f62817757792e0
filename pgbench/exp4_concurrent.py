"""Experiment 4 (the concurrency article): several clients committing
small transactions, durable and delayed, with the WAL flush rate over time.
"""
import os
import shutil
import threading
import time

from harness import HERE, wal_sync_total

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

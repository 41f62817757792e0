#!/usr/bin/env python3
"""What the extension costs: each setting against its native counterpart.

Two throwaway clusters: one that is restarted with delayed_durability
preloaded (the extension side) or without it (the native side) before each
side of each pair, and one preloaded with the persistent WAL buffer on
/dev/shm. Each comparison runs as interleaved pairs (paired.py):
per pair, the same work on both sides, the order alternating. Reported per
comparison and workload: the median of the per-pair time ratios with its
95% interval and the number of pairs, and for the server-side loop the
backend's CPU time per commit (from /proc/self/schedstat, nanoseconds, read
by the backend itself around the loop: the deterministic cost measure next
to the wall clock; hardware instruction counters are not available in this
VM). Goal: every extension/native ratio at most 1.02.

Workloads: a procedure loop of individually committed single-row inserts
(server side, no client round trips), and pgbench single-row inserts with 1
and 4 clients. The class lookup at commit: FORCED with 10 and 1,000
classified tables against none (the loop and pgbench with 1 client).
cached_nextval() against nextval() at CACHE 10000: calls in
one statement, and one call per transaction with pgbench at 1 and 4 clients.

    python3 pgbench/overhead.py [--rounds 12] [--out pgbench/results/overhead]
                                [--only forced,table_classes,sequences,...]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instructions  # noqa: E402
from harness import Cluster, Progress  # noqa: E402
from paired import coverage, fmt_interval, ratio_summary, run_pairs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# The native cluster's copy of setup.sql has no extension: its loops commit
# asynchronously through synchronous_commit instead of commit_delayed().
NATIVE_EXTRA_SQL = """
CREATE OR REPLACE PROCEDURE insert_loop_async(n int)
LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO t1 VALUES (i);
    COMMIT;
  END LOOP;
END $$;
"""

LOOP_TEMPLATE = """
SELECT clock_timestamp() AS t0, split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint AS c0 \\gset
{work};
SELECT 'result ' || extract(epoch FROM clock_timestamp() - :'t0') || ' '
       || (split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint - :c0);
"""

# (key, title, durable?, side A, side B); a side is (cluster key, settings,
# loop call[, pgbench script]). Settings are applied with ALTER SYSTEM
# before every run; the pgbench script is insert_single.sql unless given.
SCRIPTS = ("insert_single.sql", "insert_single_delayed.sql", "insert_single_async.sql")
COMPARISONS = [
    ("control", "control: native off vs native off (the method's own noise)", False,
     ("native", {"synchronous_commit": "off"}, "CALL insert_loop({n})"),
     ("native", {"synchronous_commit": "off"}, "CALL insert_loop({n})")),
    ("forced", "forced vs native synchronous_commit = off", False,
     ("ext", {"delayed_durability.mode": "forced", "synchronous_commit": "on"}, "CALL insert_loop({n})"),
     ("native", {"synchronous_commit": "off"}, "CALL insert_loop({n})")),
    ("allowed_optin", "allowed + commit_delayed() vs native set_config('synchronous_commit', 'off', true)", False,
     ("ext", {"delayed_durability.mode": "allowed", "synchronous_commit": "on"}, "CALL insert_loop({n}, true)",
      "insert_single_delayed.sql"),
     ("native", {"synchronous_commit": "on"}, "CALL insert_loop_async({n})", "insert_single_async.sql")),
    ("disabled", "disabled vs native synchronous_commit = on", True,
     ("ext", {"delayed_durability.mode": "disabled", "synchronous_commit": "on"}, "CALL insert_loop({n})"),
     ("native", {"synchronous_commit": "on"}, "CALL insert_loop({n})")),
    ("allowed", "allowed (no opt-in) vs native synchronous_commit = on", True,
     ("ext", {"delayed_durability.mode": "allowed", "synchronous_commit": "on"}, "CALL insert_loop({n})"),
     ("native", {"synchronous_commit": "on"}, "CALL insert_loop({n})")),
    ("disabled_async", "disabled overriding synchronous_commit = off vs native synchronous_commit = on", True,
     ("ext", {"delayed_durability.mode": "disabled", "synchronous_commit": "off"}, "CALL insert_loop({n})"),
     ("native", {"synchronous_commit": "on"}, "CALL insert_loop({n})")),
    ("wal_buffer", "durable with the WAL buffer (/dev/shm) vs delayed (forced)", False,
     ("buffer", {"delayed_durability.mode": "disabled", "synchronous_commit": "on"}, "CALL insert_loop({n})"),
     ("ext", {"delayed_durability.mode": "forced", "synchronous_commit": "on"}, "CALL insert_loop({n})")),
]


def apply_settings(cl, settings):
    cl.psql("".join(f"ALTER SYSTEM SET {k} = '{v}';\n" for k, v in settings.items()) + "SELECT pg_reload_conf();")
    # New sessions must see the reloaded file: give the postmaster a moment.
    time.sleep(0.1)


def run_loop(cl, settings, call, n):
    """(seconds per commit, backend CPU nanoseconds per commit)."""
    apply_settings(cl, settings)
    cl.psql("TRUNCATE t1;")
    out = cl.psql(LOOP_TEMPLATE.format(work=call.format(n=n)))
    _, secs, cpu_ns = out[-1].split()
    return float(secs) / n, int(cpu_ns) / n


def run_pgbench(cl, settings, script, clients, seconds):
    """Seconds per commit (1 / tps)."""
    apply_settings(cl, settings)
    tps, _ = cl.pgbench(os.path.join(cl.dir, script), clients, seconds=seconds)
    return 1.0 / tps


def row(title, workload, s, unit_a=None, unit_b=None, cpu=None):
    return dict(comparison=title, workload=workload, pairs=s["pairs"], median_ratio=round(s["median"], 4),
                interval_low=None if s["low"] is None else round(s["low"], 4),
                interval_high=None if s["high"] is None else round(s["high"], 4),
                a_median=unit_a, b_median=unit_b, cpu=cpu, ratios=[round(x, 4) for x in s["ratios"]])


def ensure_library(clusters, side_key):
    """The extension and native sides are one cluster: restarted with the
    library preloaded ("ext") or without it ("native") before each side of
    each pair, so that neither side keeps a memory placement, cache or WAL
    writer state of its own (two clusters differ by a few percent on their
    own). Other clusters ("buffer") are used as they are."""
    if side_key in ("ext", "native"):
        clusters["ext"].restart_with(preload=side_key == "ext")
        return clusters["ext"]
    return clusters[side_key]


def run_side(clusters, side, n, args):
    """One side of a pair: the loop and pgbench at 1 and 4 clients, after one
    restart. Returns {workload: (seconds per commit, cpu ns or None)}."""
    key, settings, loop, *script = side
    script = (script or ["insert_single.sql"])[0]
    cl = ensure_library(clusters, key)
    out = {"loop": run_loop(cl, settings, loop, n)}
    for clients in (1, 4):
        out[clients] = (run_pgbench(cl, settings, script, clients, args.pgbench_seconds), None)
    return out


def loop_row(title, n, a, b, args):
    """The procedure loop's row: wall clock and backend CPU per commit."""
    la, lb = [x["loop"] for x in a], [x["loop"] for x in b]
    wall = ratio_summary([x[0] for x in la], [x[0] for x in lb])
    cpu = ratio_summary([x[1] for x in la], [x[1] for x in lb])
    return row(title, f"procedure loop, {n} commits per run", wall,
               statistics.median(x[0] for x in la) * 1e6, statistics.median(x[0] for x in lb) * 1e6,
               dict(pairs=cpu["pairs"], median_ratio=round(cpu["median"], 4),
                    interval_low=None if cpu["low"] is None else round(cpu["low"], 4),
                    interval_high=None if cpu["high"] is None else round(cpu["high"], 4),
                    a_ns=round(statistics.median(x[1] for x in la)),
                    b_ns=round(statistics.median(x[1] for x in lb)),
                    commits=n * args.rounds))


def compare(clusters, key, title, durable, side_a, side_b, args, log):
    n = args.durable_loop_commits if durable else args.loop_commits
    a, b = run_pairs(args.rounds, lambda: run_side(clusters, side_a, n, args),
                     lambda: run_side(clusters, side_b, n, args), log, key)
    rows = [loop_row(title, n, a, b, args)]
    for clients in (1, 4):
        pa, pb = [x[clients][0] for x in a], [x[clients][0] for x in b]
        rows.append(row(title, f"pgbench, {clients} client(s)", ratio_summary(pa, pb),
                        statistics.median(pa) * 1e6, statistics.median(pb) * 1e6))
    return rows


def sequences(clusters, args, log):
    """cached_nextval() against nextval() at CACHE 10000 (throughput ratios)."""
    c = ensure_library(clusters, "ext")
    apply_settings(c, {"delayed_durability.mode": "allowed", "synchronous_commit": "on"})
    c.psql("DROP SEQUENCE IF EXISTS tput_cached, tput_native; "
           "CREATE SEQUENCE tput_cached CACHE 10000; CREATE SEQUENCE tput_native CACHE 10000;")
    for fn, seq in (("nextval", "tput_native"), ("cached_nextval", "tput_cached")):
        path = os.path.join(c.dir, f"{fn}.sql")
        with open(path, "w") as f:
            f.write(f"SELECT {fn}('{seq}');\n")
        os.chmod(path, 0o644)
    n = args.bulk_calls

    def bulk(fn, seq):
        out = c.psql(LOOP_TEMPLATE.format(work=f"SELECT count({fn}('{seq}')) FROM generate_series(1, {n});"))
        _, secs, cpu_ns = out[-1].split()
        return float(secs) / n, int(cpu_ns) / n

    rows = []
    a, b = run_pairs(args.rounds, lambda: bulk("cached_nextval", "tput_cached"), lambda: bulk("nextval", "tput_native"),
                     log, f"sequences: {n} calls in one statement")
    # Throughput ratio cached/native = native time / cached time.
    wall = ratio_summary([x[0] for x in b], [x[0] for x in a])
    cpu = ratio_summary([x[1] for x in a], [x[1] for x in b])
    rows.append(row("cached_nextval / nextval throughput", f"{n} calls in one statement", wall,
                    n / statistics.median(x[0] * n for x in a), n / statistics.median(x[0] * n for x in b),
                    dict(pairs=cpu["pairs"], median_ratio=round(cpu["median"], 4),
                         interval_low=None if cpu["low"] is None else round(cpu["low"], 4),
                         interval_high=None if cpu["high"] is None else round(cpu["high"], 4),
                         a_ns=round(statistics.median(x[1] for x in a)),
                         b_ns=round(statistics.median(x[1] for x in b)), commits=n * args.rounds)))
    tps = {}
    for clients in (1, 4):
        def bench(fn):
            t, _ = c.pgbench(os.path.join(c.dir, f"{fn}.sql"), clients, seconds=args.pgbench_seconds)
            return t
        a, b = run_pairs(args.rounds, lambda: bench("cached_nextval"), lambda: bench("nextval"), log,
                         f"sequences: pgbench {clients} client(s)")
        tps[("cached_nextval", clients)], tps[("nextval", clients)] = a, b
        rows.append(row("cached_nextval / nextval throughput", f"pgbench, {clients} client(s), 1 call per transaction",
                        ratio_summary(a, b), statistics.median(a), statistics.median(b)))
    scaling = {fn: statistics.median(x / y for x, y in zip(tps[(fn, 4)], tps[(fn, 1)]))
               for fn in ("cached_nextval", "nextval")}
    return rows, scaling


CLASS_TABLES_SQL = """
DO $$ BEGIN
  FOR g IN 1..999 LOOP EXECUTE format('CREATE TABLE IF NOT EXISTS cls_%s (i int)', g); END LOOP;
END $$;
"""


def set_table_classes(cl, count):
    """`count` classified tables: t1 (class delayed, so that forced commits
    to it stay delayed) and count - 1 others, alternately durable and delayed."""
    sql = "DELETE FROM delayed_durability_table_class_config;\n"
    if count:
        sql += ("SELECT delayed_durability_set_table_class('t1', 'delayed');\n"
                "SELECT count(delayed_durability_set_table_class(format('cls_%s', g)::regclass, "
                "CASE WHEN g % 2 = 0 THEN 'durable' ELSE 'delayed' END)) "
                f"FROM generate_series(1, {count - 1}) AS g;\n")
    cl.psql(sql)


def table_classes(clusters, args, log):
    """The class lookup at commit (FORCED): 10 and 1,000 classified tables
    against none, on the same cluster and library; the procedure loop (wall
    clock and backend CPU) and pgbench with 1 client, and the instructions
    per commit."""
    c = ensure_library(clusters, "ext")
    c.psql(CLASS_TABLES_SQL)
    settings = {"delayed_durability.mode": "forced", "synchronous_commit": "on"}
    n = args.loop_commits

    def side(count):
        set_table_classes(c, count)
        return {"loop": run_loop(c, settings, "CALL insert_loop({n})", n),
                1: (run_pgbench(c, settings, "insert_single.sql", 1, args.pgbench_seconds), None)}

    def instr_side(count):
        set_table_classes(c, count)
        with instructions.CallgrindServer(c, True, settings) as srv:
            srv.session("TRUNCATE t1;")
            return srv.per_unit("CALL insert_loop({n})", *args.instr_loop_commits)

    rows, instr_rows = [], []
    for count in (10, 1000):
        title = f"forced, {count:,} classified tables vs none"
        a, b = run_pairs(args.rounds, lambda: side(count), lambda: side(0), log, f"table classes: {count}")
        rows.append(loop_row(title, n, a, b, args))
        pa, pb = [x[1][0] for x in a], [x[1][0] for x in b]
        rows.append(row(title, "pgbench, 1 client(s)", ratio_summary(pa, pb),
                        statistics.median(pa) * 1e6, statistics.median(pb) * 1e6))
        if args.instr_rounds:
            ia, ib = run_pairs(args.instr_rounds, lambda: instr_side(count), lambda: instr_side(0), log,
                               f"table classes: {count} (instructions)")
            instr_rows.append(row(title, f"procedure loop, {args.instr_loop_commits[1]} - "
                                  f"{args.instr_loop_commits[0]} commits", ratio_summary(ia, ib),
                                  round(statistics.median(ia)), round(statistics.median(ib))))
    set_table_classes(c, 0)
    return rows, instr_rows


def instruction_side(clusters, side, args, all_processes=False):
    """Instructions per commit of one side: the procedure loop and the
    pgbench script's statements sent by a client (psql), on the cluster
    restarted under callgrind."""
    key, settings, loop, *script = side
    script = (script or ["insert_single.sql"])[0]
    cl = clusters["ext" if key in ("ext", "native") else key]
    with open(os.path.join(HERE, script)) as f:
        text = f.read()
    with instructions.CallgrindServer(cl, key != "native", settings) as srv:
        srv.session("TRUNCATE t1;")
        out = {"loop": srv.per_unit(loop, *args.instr_loop_commits),
               "client": srv.per_unit_sql(lambda n: instructions.client_statements(text, n),
                                          *args.instr_client_commits)}
    if all_processes:
        out["server"] = instructions.all_processes_per_unit(cl, key != "native", settings, loop,
                                                            *args.instr_loop_commits)
    return out


def instruction_rows(title, a, b, args):
    rows = []
    for workload, label in (("loop", f"procedure loop, {args.instr_loop_commits[1]} - "
                             f"{args.instr_loop_commits[0]} commits"),
                            ("client", f"client statements (the pgbench script), {args.instr_client_commits[1]} - "
                             f"{args.instr_client_commits[0]} transactions"),
                            ("server", f"procedure loop, all server processes, {args.instr_loop_commits[1]} - "
                             f"{args.instr_loop_commits[0]} commits")):
        if workload not in a[0]:
            continue
        xa, xb = [x[workload] for x in a], [x[workload] for x in b]
        s = ratio_summary(xa, xb)
        rows.append(row(title, label, s, round(statistics.median(xa)), round(statistics.median(xb))))
    return rows


def compare_instructions(clusters, key, title, side_a, side_b, args, log):
    # The WAL buffer moves the WAL write from the WAL writer to the
    # committing backend: only the sum over all processes compares like with like.
    every = key == "wal_buffer"
    a, b = run_pairs(args.instr_rounds, lambda: instruction_side(clusters, side_a, args, every),
                     lambda: instruction_side(clusters, side_b, args, every), log, f"{key} (instructions)")
    return instruction_rows(title, a, b, args)


def sequence_instructions(clusters, args, log):
    """cached_nextval() against nextval(): instructions per call in one
    statement and per one-call transaction sent by a client."""
    c = ensure_library(clusters, "ext")
    c.psql("CREATE SEQUENCE IF NOT EXISTS tput_cached CACHE 10000; "
           "CREATE SEQUENCE IF NOT EXISTS tput_native CACHE 10000;")
    bulk = "SELECT count({fn}('{seq}')) FROM generate_series(1, {{n}});"

    def side(fn, seq):
        with instructions.CallgrindServer(c, True, {"delayed_durability.mode": "allowed"}) as srv:
            return {"loop": srv.per_unit(bulk.format(fn=fn, seq=seq), *args.instr_bulk_calls),
                    "client": srv.per_unit_sql(lambda n: f"SELECT {fn}('{seq}');\n" * n,
                                               *args.instr_client_commits)}
    a, b = run_pairs(args.instr_rounds, lambda: side("cached_nextval", "tput_cached"),
                     lambda: side("nextval", "tput_native"), log, "sequences (instructions)")
    rows = []
    for workload, label in (("loop", f"calls in one statement, {args.instr_bulk_calls[1]} - "
                             f"{args.instr_bulk_calls[0]} calls"),
                            ("client", f"one call per transaction from a client, {args.instr_client_commits[1]} - "
                             f"{args.instr_client_commits[0]} transactions")):
        xa, xb = [x[workload] for x in a], [x[workload] for x in b]
        rows.append(row("cached_nextval / nextval instructions", label, ratio_summary(xa, xb),
                        round(statistics.median(xa)), round(statistics.median(xb))))
    return rows


def write_report(out, rows, instr_rows, scaling, args, server_version, elapsed):
    os.makedirs(out, exist_ok=True)
    cov = coverage(args.rounds)
    md = ["# What the extension costs (overhead benchmark)", "",
          f"Server: {server_version}. Machine: {os.cpu_count()} CPUs, {platform.platform()}. Run took {elapsed:.0f} s.",
          "",
          f"Method: {args.rounds} interleaved pairs per comparison and workload (the order alternates); each pair "
          "gives one ratio measured under the same conditions; shown is the median of those ratios and its "
          f"distribution-free interval from order statistics (exact coverage {cov:.1%} for {args.rounds} pairs). "
          "Time ratios are extension / native time per commit: 1.02 means 2% slower. CPU is the backend's own "
          "CPU time per commit in the procedure loop (/proc/self/schedstat, nanoseconds), the same ratio. "
          f"Loops: {args.loop_commits} commits per run ({args.durable_loop_commits} for the durable comparisons, "
          f"which wait for fsync); pgbench runs {args.pgbench_seconds} s per side and pair.", "",
          "| comparison | workload | pairs | time ratio (median) | 95% interval | per commit, µs (A / B) | "
          "CPU ratio (median) | CPU 95% interval | CPU per commit, ns (A / B) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["comparison"].startswith("cached_nextval"):
            continue
        s = dict(low=r["interval_low"], high=r["interval_high"])
        cpu = r["cpu"]
        cpu_cols = ("| | |" if cpu is None else
                    f"| {cpu['median_ratio']:.3f} | {fmt_interval(dict(low=cpu['interval_low'], high=cpu['interval_high']))} "
                    f"| {cpu['a_ns']:,} / {cpu['b_ns']:,} |")
        md.append(f"| {r['comparison']} | {r['workload']} | {r['pairs']} | {r['median_ratio']:.3f} | "
                  f"{fmt_interval(s)} | {r['a_median']:.1f} / {r['b_median']:.1f} {cpu_cols}")
    md += ["", "## cached_nextval() against nextval() (CACHE 10000)", "",
           "Throughput ratio cached_nextval / nextval (1.0 = as fast as native; goals: at least 0.9 in one "
           "statement, 0.95 per transaction). CPU ratio: cached_nextval / nextval backend CPU per call.", "",
           "| workload | pairs | throughput ratio (median) | 95% interval | calls/s (cached / native) | "
           "CPU ratio | CPU 95% interval | CPU per call, ns (cached / native) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r["comparison"].startswith("cached_nextval"):
            continue
        s = dict(low=r["interval_low"], high=r["interval_high"])
        cpu = r["cpu"]
        cpu_cols = ("| | |" if cpu is None else
                    f"| {cpu['median_ratio']:.3f} | {fmt_interval(dict(low=cpu['interval_low'], high=cpu['interval_high']))} "
                    f"| {cpu['a_ns']:,} / {cpu['b_ns']:,} |")
        md.append(f"| {r['workload']} | {r['pairs']} | {r['median_ratio']:.3f} | {fmt_interval(s)} | "
                  f"{r['a_median']:,.0f} / {r['b_median']:,.0f} {cpu_cols}")
    if scaling:
        md += ["", "Scaling from 1 to 4 pgbench clients (median of per-pair ratios of 4-client to 1-client "
               "throughput): " + ", ".join(f"{fn} {v:.2f}x" for fn, v in scaling.items()) + "."]
    if instr_rows:
        md += ["", "## Instructions per commit (callgrind)", "",
               f"The deterministic cost measure: user-space instructions the backend executes per commit (per call "
               f"for the sequences), counted by valgrind's callgrind with the server started under it, as the "
               f"difference between two work sizes run in two sessions (startup cancels out). "
               f"{args.instr_rounds} interleaved pairs, median ratio and its order-statistics interval (exact "
               f"coverage {coverage(args.instr_rounds):.1%}). Kernel time (fsync, waking the WAL writer) is not "
               "in these counts.", "",
               "| comparison | workload | pairs | instruction ratio (median) | 95% interval | "
               "instructions per commit (A / B) |",
               "|---|---|---|---|---|---|"]
        for r in instr_rows:
            s = dict(low=r["interval_low"], high=r["interval_high"])
            md.append(f"| {r['comparison']} | {r['workload']} | {r['pairs']} | {r['median_ratio']:.4f} | "
                      f"{fmt_interval(s, 4)} | {r['a_median']:,} / {r['b_median']:,} |")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(dict(server_version=server_version, rounds=args.rounds, coverage=cov,
                       loop_commits=args.loop_commits, durable_loop_commits=args.durable_loop_commits,
                       pgbench_seconds=args.pgbench_seconds, bulk_calls=args.bulk_calls,
                       rows=rows, scaling=scaling, instr_rounds=args.instr_rounds,
                       instruction_rows=instr_rows), f, indent=1)
    print("\n".join(md))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="pairs per comparison and workload (at least 6)")
    ap.add_argument("--loop-commits", type=int, default=20000, help="commits per loop run (delayed comparisons)")
    ap.add_argument("--durable-loop-commits", type=int, default=2000,
                    help="commits per loop run for the durable comparisons (fsync-bound)")
    ap.add_argument("--pgbench-seconds", type=int, default=1)
    ap.add_argument("--bulk-calls", type=int, default=200000, help="cached_nextval()/nextval() calls per statement")
    ap.add_argument("--instr-rounds", type=int, default=6,
                    help="pairs for the instruction counts under callgrind (0: skip them; at least 6 otherwise)")
    ap.add_argument("--instr-loop-commits", type=int, nargs=2, default=(1000, 5000), metavar=("SMALL", "LARGE"),
                    help="loop sizes whose difference gives instructions per commit")
    ap.add_argument("--instr-client-commits", type=int, nargs=2, default=(200, 1000), metavar=("SMALL", "LARGE"),
                    help="client transactions, likewise")
    ap.add_argument("--instr-bulk-calls", type=int, nargs=2, default=(20000, 100000), metavar=("SMALL", "LARGE"),
                    help="calls in one statement, likewise")
    ap.add_argument("--only", default="", help="comma-separated keys: "
                    + ",".join(k for k, *_ in COMPARISONS) + ",table_classes,sequences")
    ap.add_argument("--out", default=os.path.join(HERE, "report", "overhead"))
    args = ap.parse_args()
    if args.rounds < 6:
        ap.error("--rounds must be at least 6 for a 95% interval")
    if 0 < args.instr_rounds < 6:
        ap.error("--instr-rounds must be 0 or at least 6")
    if args.instr_rounds and not instructions.available():
        ap.error("the instruction counts need valgrind (apt-get install valgrind), or --instr-rounds 0")
    only = set(filter(None, args.only.split(",")))
    log = Progress()
    setup = open(os.path.join(HERE, "setup.sql")).read()
    buffer_path = f"/dev/shm/dd-overhead-{os.getpid()}.buf"
    clusters = {}
    try:
        clusters["ext"] = Cluster("overhead-ext", 55501, preload=True)
        clusters["buffer"] = Cluster("overhead-buffer", 55503, preload=True,
                                     conf=f"delayed_durability.wal_buffer_path = '{buffer_path}'\n"
                                     "delayed_durability.wal_buffer_allow_volatile = on\n",
                                     server_env={"PMEM_IS_PMEM_FORCE": "1"})
        clusters["ext"].psql(setup)
        clusters["buffer"].psql(setup)
        # The native side runs on the same cluster without the library: its
        # procedures never call the extension (insert_loop(n) without the
        # opt-in, insert_loop_async).
        clusters["ext"].psql(NATIVE_EXTRA_SQL)
        for cl in set(clusters.values()):
            for script in SCRIPTS:
                shutil.copy(os.path.join(HERE, script), os.path.join(cl.dir, script))
                os.chmod(os.path.join(cl.dir, script), 0o644)
        server_version = clusters["ext"].value("SELECT version()")
        rows, scaling, instr_rows = [], {}, []
        for key, title, durable, side_a, side_b in COMPARISONS:
            if not only or key in only:
                rows += compare(clusters, key, title, durable, side_a, side_b, args, log)
                if args.instr_rounds:
                    instr_rows += compare_instructions(clusters, key, title, side_a, side_b, args, log)
        if not only or "table_classes" in only:
            class_rows, class_instr_rows = table_classes(clusters, args, log)
            rows += class_rows
            instr_rows += class_instr_rows
        if not only or "sequences" in only:
            seq_rows, scaling = sequences(clusters, args, log)
            rows += seq_rows
            if args.instr_rounds:
                instr_rows += sequence_instructions(clusters, args, log)
    finally:
        for cl in set(clusters.values()):
            cl.stop()
        if os.path.exists(buffer_path):
            os.unlink(buffer_path)
    write_report(args.out, rows, instr_rows, scaling, args, server_version, time.monotonic() - log.start)


if __name__ == "__main__":
    main()

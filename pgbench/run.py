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
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import HERE, SETUP_SQL, Cluster, Progress, Unavailable  # noqa: E402
import harness  # noqa: E402
from report import draw_chart, machine_description, markdown_table, write_report  # noqa: E402
from exp1_loop import exp1_loop  # noqa: E402
from exp2_small_big import exp2_small_big  # noqa: E402
from exp3_sequences import exp3_sequences  # noqa: E402
from exp4_concurrent import exp4_concurrent  # noqa: E402
from exp5_wal_buffer import exp5_pmem  # noqa: E402
from exp6_segments import exp6_segments  # noqa: E402
from exp_loss_budget import exp7_loss_budget  # noqa: E402
from exp8_crash_loss import exp8_crash_loss  # noqa: E402

SCALES = {
    # rows for exp 1, rows for exp 2, values for exp 3, (interleaved pairs,
    # pgbench seconds) of exp 3's throughput comparison, (clients,
    # iterations, committed rows per iteration) for exp 4's second case,
    # rows of each iteration's one transaction in its primary case, pgbench seconds for exp 5,
    # rounds of exp 5's interleaved loop runs, rows for exp 6, (rounds,
    # seconds of the server loop, pgbench seconds) per variant and round for
    # exp 7, seconds into the loop of each power cut of exp 8. "full" is the articles' sizes (exp 1: 100,000 rows; exps 2, 3:
    # 1,000,000; exp 4: 5 clients x 200 iterations, as SQLQueryStress ran).
    "tiny": dict(e1=300, e2=1000, e3=1000, e3_pairs=(2, 1), e4=(5, 4, 20), e4_article_rows=50, e5=2, e5_rounds=1, e6=2000,
                 e7=(1, 0.2, 1), e8=(1.0,)),
    "quick": dict(e1=100000, e2=200000, e3=200000, e3_pairs=(6, 2), e4=(5, 100, 100), e4_article_rows=1000, e5=5, e5_rounds=3,
                  e6=300000, e7=(6, 0.5, 1), e8=(0.5, 1.0, 2.0)),
    "full": dict(e1=100000, e2=1000000, e3=1000000, e3_pairs=(12, 5), e4=(5, 200, 100), e4_article_rows=1000, e5=30, e5_rounds=3,
                 e6=3000000, e7=(15, 5, 10), e8=(0.5, 1.0, 1.5, 2.0, 3.0)),
}


EXPERIMENTS = [
    ("1", exp1_loop), ("2", exp2_small_big), ("3", exp3_sequences),
    ("4", exp4_concurrent), ("5", exp5_pmem), ("6", exp6_segments),
    ("7", exp7_loss_budget), ("8", exp8_crash_loss),
]


def earlier_results(out, scale_name):
    """The report already in `out`, for --keep: checked before anything
    runs, so that a mismatch costs no experiment's results."""
    try:
        with open(os.path.join(out, "results.json")) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return None
    if earlier.get("scale") != scale_name or not earlier.get("server_version"):
        sys.exit(f"--keep: {out}/results.json is of another scale or names no server version")
    return earlier


def keep_earlier(earlier, server_version, rerun):
    """The results of experiments not rerun (same server version only)."""
    if earlier is None:
        return []
    if earlier["server_version"] != server_version:
        print(f"--keep: the earlier report is of server {earlier['server_version']}: nothing kept", flush=True)
        return []
    return [(k, v) for k, v in earlier["results"].items() if k not in rerun]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=SCALES, default="quick")
    ap.add_argument("--out", default=os.path.join(HERE, "report"))
    ap.add_argument("--only", default="", help="comma-separated experiment numbers")
    ap.add_argument("--port", type=int, default=55432)
    ap.add_argument("--keep", action="store_true",
                    help="with --only: keep the other experiments' results already in --out (same scale), "
                         "so that a report can be completed one experiment at a time")
    args = ap.parse_args()
    scale = SCALES[args.scale]
    only = set(filter(None, args.only.split(",")))
    earlier = earlier_results(args.out, args.scale) if args.keep and only else None
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
            # Each experiment names its machine: --keep can gather runs of
            # several hosts into one report.
            res["machine"] = machine_description()
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
    kept = []
    if args.keep and only:
        kept = keep_earlier(earlier, server_version, {k for k, _ in results} | {k for k, _ in skipped})
        results = sorted(results + kept, key=lambda r: [e for e, _ in EXPERIMENTS].index(r[0]))
    write_report(args.out, args.scale, scale, results, skipped, time.monotonic() - log.start, server_version,
                 kept=[k for k, _ in kept])
    log(f"done: {os.path.join(args.out, 'report.md')}")


if __name__ == "__main__":
    main()

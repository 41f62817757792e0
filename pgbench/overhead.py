#!/usr/bin/env python3
"""Cost of the commit policy: the extension against native PostgreSQL.

Two clusters run side by side: one with delayed_durability preloaded, one
without. In one run, interleaved round by round (order alternating), it
compares
  forced    vs native synchronous_commit = off   (delayed commits)
  disabled  vs native synchronous_commit = on    (durable commits)
with pgbench single-row inserts (1 and 4 clients) and a server-side
procedure loop of individually committed inserts. It prints the median
throughput ratio of each pair; the goal is within 2% (ratio >= 0.98).

    python3 pgbench/overhead.py [--rounds 5] [--seconds 10] [--loop-rows 100000]
"""
import argparse
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, Progress, measure  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

PAIRS = [
    ("forced vs native off", "SET delayed_durability.mode = 'forced';", "SET synchronous_commit = off;",
     "ALTER SYSTEM SET delayed_durability.mode = 'forced'", "ALTER SYSTEM SET synchronous_commit = off"),
    ("disabled vs native on", "SET delayed_durability.mode = 'disabled';", "SET synchronous_commit = on;",
     "ALTER SYSTEM SET delayed_durability.mode = 'disabled'", "ALTER SYSTEM SET synchronous_commit = on"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10, help="per pgbench run")
    ap.add_argument("--loop-rows", type=int, default=100000, help="commits per procedure loop (delayed pair)")
    ap.add_argument("--durable-loop-rows", type=int, default=5000,
                    help="commits per procedure loop for the durable pair (fsync-bound)")
    args = ap.parse_args()
    log = Progress()
    ext = Cluster("overhead-ext", 55501, preload=True)
    native = Cluster("overhead-native", 55502, preload=False)
    setup = open(os.path.join(HERE, "setup.sql")).read()
    ext.psql(setup)
    native.psql(setup.replace("IF delayed THEN PERFORM commit_delayed(); END IF;", "")
                .replace("CREATE EXTENSION IF NOT EXISTS delayed_durability;", ""))
    script = os.path.join(ext.dir, "insert_single.sql")
    shutil.copy(os.path.join(HERE, "insert_single.sql"), script)
    os.chmod(script, 0o644)
    ratios = {}
    try:
        for rnd in range(args.rounds):
            for name, ext_set, nat_set, ext_sys, nat_sys in PAIRS:
                ext.psql(f"{ext_sys}; SELECT pg_reload_conf();")
                native.psql(f"{nat_sys}; SELECT pg_reload_conf();")
                durable = "on" in name.split()[-1]
                rows = args.durable_loop_rows if durable else args.loop_rows
                order = [("ext", ext, ext_set), ("native", native, nat_set)]
                if rnd % 2:
                    order.reverse()
                tput = {}
                for clients in (1, 4):
                    for who, cl, _ in order:
                        log(f"round {rnd + 1}/{args.rounds}: {name}: {who}, pgbench {clients} client(s)")
                        tps, _ = cl.pgbench(script, clients, seconds=args.seconds)
                        tput[(who, f"pgbench {clients} client(s)")] = tps
                for who, cl, set_sql in order:
                    log(f"round {rnd + 1}/{args.rounds}: {name}: {who}, procedure loop of {rows} commits")
                    cl.psql("TRUNCATE t1; CHECKPOINT;")
                    secs, _ = measure(cl, f"CALL insert_loop({rows});", setup=set_sql)
                    tput[(who, f"procedure loop {rows}")] = rows / secs
                for (who, workload), v in tput.items():
                    if who == "ext":
                        ratios.setdefault((name, workload), []).append(v / tput[("native", workload)])
    finally:
        ext.stop()
        native.stop()
    print("\n| pair | workload | median throughput ratio (extension / native) | rounds | within 2% |")
    print("|---|---|---|---|---|")
    for (name, workload), rs in ratios.items():
        med = statistics.median(rs)
        print(f"| {name} | {workload} | {med:.3f} | {len(rs)} | {'yes' if med >= 0.98 else 'no'} |")


if __name__ == "__main__":
    main()

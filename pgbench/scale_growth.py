#!/usr/bin/env python3
"""How each experiment's time grows from one scale to another.

Reads two results.json files written by run.py (for example the committed
quick and full runs) and prints, per experiment, the work factor between
the scales (rows, values or commits), the factor of the summed server-clock
seconds of the experiment's rows, and their quotient: 1.0 means linear.

    python3 pgbench/scale_growth.py pgbench/results/quick/results.json pgbench/results/full/results.json
"""
import json
import sys

# What grows with the scale, per experiment: the row field that counts work.
WORK = {"1": "transactions", "2": "rows", "3": "values", "4": "commits", "5": "transactions", "6": "rows"}


def totals(results, exp_id):
    res = results["results"].get(exp_id)
    if not res:
        return None
    rows = [r for r in res["rows"] if isinstance(r.get("seconds"), (int, float))]
    if not rows or exp_id not in WORK:
        return None
    return (sum(r["seconds"] for r in rows), sum(r.get(WORK[exp_id], 0) for r in rows), res["title"])


def table(small, big):
    """Markdown lines: per experiment, work and time factors between the scales."""
    out = [f"| experiment | work ({small['scale']}) | work ({big['scale']}) | work factor | seconds ({small['scale']}) "
           f"| seconds ({big['scale']}) | time factor | time factor / work factor |",
           "|---|---|---|---|---|---|---|---|"]
    for exp_id in sorted(WORK):
        a, b = totals(small, exp_id), totals(big, exp_id)
        if not a or not b:
            continue
        wf = b[1] / max(a[1], 1)
        tf = b[0] / max(a[0], 1e-9)
        out.append(f"| {a[2]} | {a[1]:,} | {b[1]:,} | {wf:.1f} | {a[0]:.1f} | {b[0]:.1f} | {tf:.1f} | {tf / wf:.2f} |")
    return out


def main(small_path, big_path):
    small, big = (json.load(open(p)) for p in (small_path, big_path))
    print("\n".join(table(small, big)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

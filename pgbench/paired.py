"""Paired, interleaved measurements and their summary.

A comparison of A against B on a shared 2-core VM is only as good as its
method: the machine's speed drifts by more than the differences looked for.
So A and B run as many short pairs (A, B, B, A, A, B ... the order alternates
so neither side always runs first), each pair gives one ratio A/B measured
under the same conditions, and the summary is the median of those ratios
with a distribution-free 95% interval from order statistics (the interval of
ranks the binomial distribution gives for the median), plus the number of
pairs.
"""
import math
import statistics


def median_interval(values, confidence=0.95):
    """(median, low, high): the sample median and the order-statistics
    interval that covers the true median with at least `confidence`
    (None, None for fewer than 6 values, where no such interval exists)."""
    xs = sorted(values)
    n = len(xs)
    med = statistics.median(xs)
    # Largest k with P(Bin(n, 1/2) <= k - 1) <= (1 - confidence) / 2: the
    # interval [x_(k), x_(n-k+1)] then covers the median with >= confidence.
    k = 0
    cdf = 0.0
    for j in range(n):
        cdf += math.comb(n, j) / 2 ** n
        if cdf > (1 - confidence) / 2:
            break
        k = j + 1
    if k == 0:
        return med, None, None
    return med, xs[k - 1], xs[n - k]


def coverage(n, confidence=0.95):
    """The exact coverage of median_interval's interval for n values."""
    k = 0
    cdf = 0.0
    for j in range(n):
        cdf += math.comb(n, j) / 2 ** n
        if cdf > (1 - confidence) / 2:
            break
        k = j + 1
    if k == 0:
        return None
    return 1 - 2 * sum(math.comb(n, j) for j in range(k)) / 2 ** n


def run_pairs(rounds, run_a, run_b, log=None, label=""):
    """Runs A and B `rounds` times each, alternating which goes first, and
    returns the two lists of results (whatever the callables return)."""
    a, b = [], []
    for r in range(rounds):
        order = [("A", run_a, a), ("B", run_b, b)]
        if r % 2:
            order.reverse()
        for side, fn, out in order:
            if log:
                log(f"{label}: pair {r + 1}/{rounds}, {side}")
            out.append(fn())
    return a, b


def ratio_summary(a, b):
    """Median and interval of the per-pair ratios a[i] / b[i]."""
    ratios = [x / y for x, y in zip(a, b)]
    med, lo, hi = median_interval(ratios)
    return dict(pairs=len(ratios), median=med, low=lo, high=hi, ratios=ratios)


def fmt_interval(s, digits=3):
    if s["low"] is None:
        return "n/a (too few pairs)"
    return f"{s['low']:.{digits}f}-{s['high']:.{digits}f}"

"""Experiment 6 (the VLF article): one big insert, update and delete with
64 MB and 1 MB WAL segments.
"""
from harness import SETUP_SQL, Cluster, measure

CUSTOMER_DDL = """
CREATE TABLE {name} (
  c_id int NOT NULL, c_d_id smallint NOT NULL, c_w_id int NOT NULL,
  c_first varchar(16), c_middle char(2), c_last varchar(16),
  c_street_1 varchar(20), c_street_2 varchar(20), c_city varchar(20),
  c_state char(2), c_zip char(9), c_phone char(16), c_since timestamp,
  c_credit char(2), c_credit_lim numeric(12,2), c_discount numeric(4,4),
  c_balance numeric(12,2), c_ytd_payment numeric(12,2),
  c_payment_cnt smallint, c_delivery_cnt smallint, c_data varchar(500));
"""

CUSTOMER_FILL = """
INSERT INTO customer_src
SELECT i, 1 + i % 10, 1 + i / 30000, md5(i::text)::varchar(16), 'OE', 'BAR' || (i % 1000),
       md5('s1' || i)::varchar(20), md5('s2' || i)::varchar(20), md5('c' || i)::varchar(20),
       'CA', '123411111', '0123456789012345', now(), CASE WHEN i % 10 = 0 THEN 'BC' ELSE 'GC' END,
       50000, (i % 5000) / 10000.0, -10, 10, 1, 0,
       upper(repeat(md5(i::text), 10))::varchar(500)
  FROM generate_series(1, {n}) AS i;
"""


def exp6_segments(c, scale, log):
    """PostgreSQL's analogue of the VLF article: WAL segment size."""
    n = scale["e6"]
    article = {"insert": (281, 1069), "update": (174, 1554), "delete": (193, 936)}
    rows = []
    port = c.port + 10
    for segsize in (64, 1):
        log(f"exp 6: cluster with {segsize} MB WAL segments, {n} customers")
        cl = Cluster(f"seg{segsize}", port, conf="max_wal_size = 8GB\n", wal_segsize_mb=segsize)
        port += 1
        try:
            cl.psql(SETUP_SQL + CUSTOMER_DDL.format(name="customer_src") + CUSTOMER_DDL.format(name="customer")
                    + CUSTOMER_FILL.format(n=n) + "CHECKPOINT;")
            for step, sql in (("insert", "INSERT INTO customer SELECT * FROM customer_src;"),
                              ("update", "UPDATE customer SET c_data = lower(c_data);"),
                              ("delete", "DELETE FROM customer;")):
                log(f"exp 6: {segsize} MB segments: {step}")
                lsn0 = cl.value("SELECT pg_current_wal_insert_lsn()")
                secs, syncs = measure(cl, sql)
                wal = int(float(cl.value(f"SELECT pg_current_wal_insert_lsn() - '{lsn0}'::pg_lsn")))
                a16, a20000 = article[step]
                rows.append(dict(step=step, wal_segment_mb=segsize, rows=n, seconds=secs, flushes=syncs,
                                 wal_mb=round(wal / 1048576, 1),
                                 segments_filled=round(wal / (segsize * 1048576), 1),
                                 article_seconds=a16 if segsize == 64 else a20000))
                cl.psql("CHECKPOINT;")
        finally:
            cl.stop()
    by = {(r["step"], r["wal_segment_mb"]): r for r in rows}
    notes = []
    for step in ("insert", "update", "delete"):
        small, big = by[(step, 1)], by[(step, 64)]
        a16, a20000 = article[step]
        notes.append(f"{step}: 1 MB / 64 MB segments duration ratio ours {small['seconds'] / max(big['seconds'], 1e-9):.2f}x, "
                     f"article (20,000 / 16 VLFs) {a20000 / a16:.1f}x.")
    notes.append("PostgreSQL has no VLFs: its WAL is a sequence of fixed-size segment files, each fsynced once "
                 "when full and recycled after checkpoints. Small segments mean more files and more (smaller) "
                 "fsyncs, but no per-file scan at recovery or log-reuse bookkeeping like SQL Server's VLF "
                 "chain, so whatever effect shows here is the per-file cost only.")
    return dict(title="6. WAL segment size (the VLF article's analogue)",
                columns=["step", "wal_segment_mb", "rows", "seconds", "flushes", "wal_mb", "segments_filled",
                         "article_seconds"],
                rows=rows, notes=notes, chart=("bars", ("step", "wal_segment_mb")))

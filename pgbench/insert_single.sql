-- pgbench -f insert_single.sql: one single-row insert per transaction.
\set id random(1, 1000000000)
INSERT INTO t1 VALUES (:id);

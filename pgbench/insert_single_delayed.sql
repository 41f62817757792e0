-- pgbench -f insert_single_delayed.sql: one single-row insert per
-- transaction, each opting in to delayed durability (mode allowed).
\set id random(1, 1000000000)
BEGIN;
SELECT commit_delayed();
INSERT INTO t1 VALUES (:id);
COMMIT;

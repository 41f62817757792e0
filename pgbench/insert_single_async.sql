-- pgbench -f insert_single_async.sql: the native counterpart of
-- insert_single_delayed.sql, asynchronous commit for one transaction.
\set id random(1, 1000000000)
BEGIN;
SELECT set_config('synchronous_commit', 'off', true);
INSERT INTO t1 VALUES (:id);
COMMIT;

-- cached_nextval(): order, options, limits, errors, privileges, invalidation
-- and the counters (one recovery write and one flush per CACHE values).
CREATE EXTENSION IF NOT EXISTS delayed_durability;

CREATE FUNCTION seq_counters(OUT vals bigint, OUT writes bigint, OUT flushes bigint)
LANGUAGE sql AS $$
  SELECT sequence_values, sequence_recovery_writes, sequence_flushes
    FROM delayed_durability_stats WHERE datname = current_database()
$$;
\set seq_deltas 'SELECT vals - :b_vals AS values, writes - :b_writes AS recovery_writes, flushes - :b_flushes AS flushes FROM seq_counters()'

-- Order and the recovery value on disk: the end of the block.
CREATE SEQUENCE s50 CACHE 50;
SELECT cached_nextval('s50') FROM generate_series(1, 3);
SELECT last_value, log_cnt, is_called FROM s50;

-- One recovery write and one flush per CACHE values.
SELECT * FROM seq_counters() \gset b_
SELECT count(*), min(v), max(v), count(DISTINCT v)
  FROM (SELECT cached_nextval('s50') AS v FROM generate_series(1, 997)) s;
:seq_deltas;
CREATE SEQUENCE s1 CACHE 1;
SELECT * FROM seq_counters() \gset b_
SELECT count(DISTINCT cached_nextval('s1')) FROM generate_series(1, 1000);
:seq_deltas;
-- ... also under forced delayed durability and synchronous_commit = off.
SET delayed_durability.mode = 'forced';
SET synchronous_commit = off;
CREATE SEQUENCE s50f CACHE 50;
SELECT * FROM seq_counters() \gset b_
SELECT count(DISTINCT cached_nextval('s50f')) FROM generate_series(1, 1000);
:seq_deltas;
RESET synchronous_commit;
RESET delayed_durability.mode;
-- Temporary and unlogged sequences write the recovery value without a flush.
CREATE TEMP SEQUENCE tmp CACHE 50;
CREATE UNLOGGED SEQUENCE unl CACHE 50;
SELECT * FROM seq_counters() \gset b_
SELECT count(DISTINCT cached_nextval('tmp')) FROM generate_series(1, 1000);
SELECT count(DISTINCT cached_nextval('unl')) FROM generate_series(1, 1000);
:seq_deltas;

-- INCREMENT, START, MINVALUE, MAXVALUE and CYCLE as nextval has them.
CREATE SEQUENCE inc START 10 INCREMENT 5 CACHE 4;
SELECT cached_nextval('inc') FROM generate_series(1, 6);
CREATE SEQUENCE down INCREMENT -3 MINVALUE -10 MAXVALUE 5 START 5 CACHE 3 CYCLE;
SELECT cached_nextval('down') FROM generate_series(1, 8);
CREATE SEQUENCE up_cycle MINVALUE 1 MAXVALUE 4 CACHE 3 CYCLE;
SELECT cached_nextval('up_cycle') FROM generate_series(1, 6);
-- Compare with nextval on twins of the same options.
CREATE SEQUENCE twin_a INCREMENT 7 MINVALUE 3 MAXVALUE 40 START 5 CACHE 4 CYCLE;
CREATE SEQUENCE twin_b INCREMENT 7 MINVALUE 3 MAXVALUE 40 START 5 CACHE 4 CYCLE;
SELECT array_agg(cached_nextval('twin_a')) = array_agg(nextval('twin_b')) AS same_as_nextval
  FROM generate_series(1, 20);
-- Running past the limit without CYCLE: SQLSTATE 2200H, like nextval.
CREATE SEQUENCE lim MAXVALUE 3 CACHE 2;
SELECT cached_nextval('lim');
SELECT cached_nextval('lim');
SELECT cached_nextval('lim');
\set VERBOSITY sqlstate
SELECT cached_nextval('lim');
SELECT nextval('lim');
CREATE SEQUENCE lim_down INCREMENT -1 MINVALUE 1 MAXVALUE 2 CACHE 5;
SELECT cached_nextval('lim_down'), cached_nextval('lim_down');
SELECT cached_nextval('lim_down');
\set VERBOSITY default
SELECT cached_nextval('lim_down');
-- smallint sequences stop at their type's limit.
CREATE SEQUENCE small AS smallint START 32766 CACHE 10;
SELECT cached_nextval('small'), cached_nextval('small');
SELECT cached_nextval('small');

-- Errors.
CREATE TABLE not_a_seq (i int);
SELECT cached_nextval('not_a_seq');
SELECT cached_nextval('no_such_sequence');
SELECT cached_nextval(NULL);
SELECT cached_nextval(0);
BEGIN READ ONLY;
SELECT cached_nextval('s50');
ROLLBACK;
BEGIN READ ONLY;
SELECT cached_nextval('tmp') > 0 AS temp_ok_read_only;
ROLLBACK;

-- Privileges: USAGE or UPDATE, like nextval.
CREATE ROLE seq_nobody;
CREATE ROLE seq_usage;
CREATE ROLE seq_update;
CREATE SEQUENCE priv CACHE 10;
GRANT USAGE ON SEQUENCE priv TO seq_usage;
GRANT UPDATE ON SEQUENCE priv TO seq_update;
SET ROLE seq_nobody;
SELECT cached_nextval('priv');
SELECT nextval('priv');
SET ROLE seq_usage;
SELECT cached_nextval('priv');
SET ROLE seq_update;
SELECT cached_nextval('priv');
RESET ROLE;
-- A USAGE-only user refilling the cache does not gain UPDATE.
SET ROLE seq_usage;
SELECT count(*) FROM (SELECT cached_nextval('priv') FROM generate_series(1, 25)) s;
SELECT setval('priv', 1);
RESET ROLE;
DROP SEQUENCE priv;
DROP ROLE seq_nobody;
DROP ROLE seq_usage;
DROP ROLE seq_update;

-- Other changes to the sequence invalidate the cache.
CREATE SEQUENCE inv CACHE 100;
SELECT cached_nextval('inv');
SELECT setval('inv', 1000);
SELECT cached_nextval('inv');
SELECT nextval('inv');
SELECT cached_nextval('inv');
ALTER SEQUENCE inv RESTART WITH 5000;
SELECT cached_nextval('inv');
ALTER SEQUENCE inv INCREMENT 10;
SELECT cached_nextval('inv'), cached_nextval('inv');
ALTER SEQUENCE inv CACHE 2;
SELECT cached_nextval('inv'), cached_nextval('inv'), cached_nextval('inv');
SELECT last_value FROM inv;
-- A rolled-back RESTART: the sequence continues after what was handed out
-- before it, never repeating a value handed out before the RESTART.
ALTER SEQUENCE inv INCREMENT 1 CACHE 100;
SELECT cached_nextval('inv') AS before_restart \gset
BEGIN;
ALTER SEQUENCE inv RESTART WITH 1;
SELECT cached_nextval('inv') AS inside_restart;
ROLLBACK;
SELECT cached_nextval('inv') > :before_restart AS continues_after;
-- TRUNCATE ... RESTART IDENTITY on an identity column's sequence.
CREATE TABLE ident (id bigint GENERATED BY DEFAULT AS IDENTITY (CACHE 20), v int);
INSERT INTO ident (v) VALUES (1), (2);
SELECT cached_nextval(pg_get_serial_sequence('ident', 'id'));
INSERT INTO ident (v) VALUES (3);
SELECT cached_nextval(pg_get_serial_sequence('ident', 'id')) > max(id) AS after_identity FROM ident;
TRUNCATE ident RESTART IDENTITY;
SELECT cached_nextval(pg_get_serial_sequence('ident', 'id'));
-- DROP and re-create under the same name: a fresh sequence.
DROP SEQUENCE inv;
CREATE SEQUENCE inv CACHE 100;
SELECT cached_nextval('inv');
-- A rolled-back transaction does not give its values back.
BEGIN;
SELECT cached_nextval('inv');
ROLLBACK;
SELECT cached_nextval('inv');

-- setval() to exactly the end of the cached block is seen: the next value
-- follows it, as with nextval() (the page changed even if last_value did not).
CREATE SEQUENCE s3 CACHE 50;
SELECT cached_nextval('s3'), cached_nextval('s3');
SELECT setval('s3', 50);
SELECT cached_nextval('s3');
SELECT nextval('s3');
-- setval() inside the block, below it, and with is_called = false.
SELECT setval('s3', 120);
SELECT cached_nextval('s3');
SELECT setval('s3', 5);
SELECT cached_nextval('s3');
SELECT setval('s3', 500, false);
SELECT cached_nextval('s3'), cached_nextval('s3');
-- A CYCLE wrap by nextval() that lands exactly on the block's end.
CREATE SEQUENCE cyc MINVALUE 1 MAXVALUE 10 CACHE 5 CYCLE;
SELECT cached_nextval('cyc');
SELECT setval('cyc', 10);
SELECT nextval('cyc');
SELECT last_value FROM cyc;
SELECT cached_nextval('cyc');
-- Temporary and unlogged sequences (no WAL, the page LSN never changes).
CREATE TEMP SEQUENCE tmp3 CACHE 50;
CREATE UNLOGGED SEQUENCE unl3 CACHE 50;
SELECT cached_nextval('tmp3'), cached_nextval('unl3');
SELECT setval('tmp3', 50), setval('unl3', 50);
SELECT cached_nextval('tmp3'), cached_nextval('unl3');
SELECT log_cnt AS marked FROM tmp3;
SELECT nextval('tmp3'), nextval('unl3');
SELECT log_cnt AS nextval_leaves FROM tmp3;
SELECT cached_nextval('tmp3'), cached_nextval('unl3');

-- cached_currval() and cached_lastval(): what this session's cached_nextval()
-- returned last. currval() knows nothing of it (not even after a refill).
CREATE SEQUENCE cv CACHE 50;
SELECT cached_currval('cv');
SELECT cached_nextval('cv') AS v, cached_currval('cv') AS c, cached_lastval() AS l;
SELECT currval('cv');
SELECT cached_nextval('s3') AS other, cached_lastval() AS l, cached_currval('cv') AS c;
-- A new session has no value yet, takes the next one of the shared block
-- (no refill), and sees only its own.
\c
SELECT cached_lastval();
SELECT cached_currval('cv');
CREATE FUNCTION seq_writes() RETURNS bigint LANGUAGE sql AS $$
  SELECT sequence_recovery_writes FROM delayed_durability_stats WHERE datname = current_database() $$;
SELECT seq_writes() AS writes_before \gset
SELECT cached_nextval('cv') AS v, cached_currval('cv') AS c, cached_lastval() AS l;
SELECT seq_writes() - :writes_before AS refills;
DROP FUNCTION seq_writes;
-- Privileges: SELECT or USAGE, like currval().
CREATE ROLE cv_nobody;
CREATE ROLE cv_select;
GRANT SELECT ON SEQUENCE cv TO cv_select;
SET ROLE cv_nobody;
SELECT cached_currval('cv');
SELECT cached_lastval();
SET ROLE cv_select;
SELECT cached_currval('cv');
RESET ROLE;
-- DISCARD SEQUENCES forgets the values; a dropped sequence has none.
DISCARD SEQUENCES;
SELECT cached_currval('cv');
SELECT cached_nextval('cv') > 0 AS again;
DROP SEQUENCE cv;
DROP ROLE cv_nobody;
DROP ROLE cv_select;
SELECT cached_lastval();
SELECT cached_currval(0);

-- As a column default.
CREATE SEQUENCE orders_id_seq CACHE 20;
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT cached_nextval('orders_id_seq'), item text);
INSERT INTO orders (item) SELECT 'item ' || g FROM generate_series(1, 30) g;
SELECT count(*), min(id), max(id) FROM orders;

DROP TABLE orders, ident, not_a_seq;
-- (the temporary sequences went with the first session)
DROP SEQUENCE s50, s1, s50f, unl, s3, cyc, unl3, inc, down, up_cycle, twin_a, twin_b, lim, lim_down, small, inv, orders_id_seq;
DROP FUNCTION seq_counters;

-- A transaction that used a temporary sequence cannot PREPARE, with
-- cached_nextval() as with nextval() (a prepared transaction holding a
-- temporary object would block the session's exit).
CREATE TEMP SEQUENCE temp_prep;
BEGIN;
SELECT cached_nextval('temp_prep');
PREPARE TRANSACTION 'dd_temp_seq';
BEGIN;
SELECT nextval('temp_prep');
PREPARE TRANSACTION 'dd_temp_seq_native';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
-- Calls after the first in a transaction (the lock already taken) keep the mark.
BEGIN;
SELECT cached_nextval('temp_prep');
COMMIT;
BEGIN;
SELECT 1;
SELECT cached_nextval('temp_prep');
SELECT cached_nextval('temp_prep');
PREPARE TRANSACTION 'dd_temp_seq2';
DROP SEQUENCE temp_prep;

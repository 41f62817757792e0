-- pgbench -f insert_loop.sql -D rows=100 -D delayed=false: one iteration of
-- the concurrent workload (a loop of committed single-row inserts).
CALL insert_loop(:rows, :delayed);

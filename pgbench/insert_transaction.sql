-- pgbench -f insert_transaction.sql -D rows=1000 -D delayed=false: one
-- iteration of experiment 4's primary case (the article's reading): one
-- transaction whose loop inserts the rows one by one, then commits.
CALL insert_transaction(:rows, :delayed);

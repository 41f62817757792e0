# Durability per table across crashes, sessions, pg_dump and logical
# replication: in a forced database no commit to a durable table is lost by
# kill -9 or by the simulated power cut; in an allowed database commits to a
# delayed table behave like commit_delayed() ones; a class set in one
# session applies to the next commit of another; pg_dump/pg_restore keep
# classes; a logical replication apply worker's commits follow them.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('classes', init => { allows_streaming => 'logical' });
$node->safe_psql('postgres', q{
CREATE DATABASE shop;
ALTER DATABASE shop SET delayed_durability.mode = 'forced';
CREATE DATABASE web;
ALTER DATABASE web SET delayed_durability.mode = 'allowed';
});
for my $db ('shop', 'web')
{
	$node->safe_psql($db, q{
CREATE TABLE payments (id int PRIMARY KEY, amount numeric);
CREATE TABLE clicks (id int, url text);
SELECT delayed_durability_set_table_class('payments', 'durable');
SELECT delayed_durability_set_table_class('clicks', 'delayed');
});
}

sub count_in
{
	my ($db, $sql) = @_;
	return $node->safe_psql($db, $sql);
}

sub counter
{
	my ($db, $name) = @_;
	return $node->safe_psql($db, "SELECT $name FROM delayed_durability_stats WHERE datname = current_database()");
}

# Forced database: payments commits are flushed before COMMIT returns, clicks
# commits are not.
my @statements = map { $_ % 2
	  ? "INSERT INTO payments VALUES ($_, 10);"
	  : "INSERT INTO clicks VALUES ($_, '/p');" } 1 .. 40;
my $by_table_before = counter('shop', 'commits_durable_by_table');
my @flushed = commits_with_check($node, 'shop', '', \@statements);
is(count_true(@flushed[ grep { $_ % 2 == 0 } 0 .. 39 ]), 20, 'forced: every payments commit is flushed');
is(count_true(@flushed[ grep { $_ % 2 == 1 } 0 .. 39 ]), 0, 'forced: no clicks commit is');
is(counter('shop', 'commits_durable_by_table') - $by_table_before, 20, 'forced: 20 commits durable by table');

# kill -9 right after a run that ends with delayed clicks commits: every
# payments row survives, the clicks after the last payment do not.
settle_wal_writer($node);
$node->safe_psql('shop', join("\n",
	(map { "INSERT INTO payments VALUES ($_, 20); INSERT INTO clicks VALUES ($_, '/x');" } 101 .. 130),
	(map { "INSERT INTO clicks VALUES ($_, '/after');" } 131 .. 160)));
my $payment_end = $node->safe_psql('shop', 'SELECT pg_current_wal_flush_lsn()');
my $insert_end = $node->safe_psql('shop', 'SELECT pg_current_wal_insert_lsn()');
ok($node->safe_psql('shop', "SELECT '$payment_end'::pg_lsn < '$insert_end'::pg_lsn") eq 't',
	'the clicks commits after the last payment are unflushed before the crash');
power_cut($node);
is(count_in('shop', 'SELECT count(*) FROM payments WHERE id BETWEEN 101 AND 130'), 30,
	'power cut: every payments commit survives');
is(count_in('shop', 'SELECT count(*) FROM clicks WHERE id BETWEEN 131 AND 160'), 0,
	'power cut: the delayed clicks commits after the last payment are lost');

# Plain kill -9 (the OS keeps what was written): payments commits survive.
settle_wal_writer($node);
$node->safe_psql('shop', join("\n", map { "INSERT INTO payments VALUES ($_, 30);" } 201 .. 230));
kill_everything($node);
$node->start;
is(count_in('shop', 'SELECT count(*) FROM payments WHERE id BETWEEN 201 AND 230'), 30,
	'kill -9: every payments commit survives');

# Allowed database: clicks commits are delayed without commit_delayed(),
# counted as delayed by table, and a power cut loses them like delayed commits.
my $delayed_before = counter('web', 'commits_delayed_by_table');
@flushed = commits_with_check($node, 'web', '', [ map { "INSERT INTO clicks VALUES ($_, '/c');" } 1 .. 20 ]);
is(count_true(@flushed), 0, 'allowed: no clicks commit is flushed');
is(counter('web', 'commits_delayed_by_table') - $delayed_before, 20, 'allowed: 20 commits delayed by table');
@flushed = commits_with_check($node, 'web', '', [ map { "INSERT INTO payments VALUES ($_, 1);" } 1 .. 5 ]);
is(count_true(@flushed), 5, 'allowed: payments commits are flushed');
settle_wal_writer($node);
$node->safe_psql('web', join("\n",
	"INSERT INTO payments VALUES (100, 1);",
	(map { "BEGIN; SELECT commit_delayed(); INSERT INTO payments VALUES ($_, 2); COMMIT;" } 101 .. 102),
	(map { "INSERT INTO clicks VALUES ($_, '/lost');" } 101 .. 120)));
power_cut($node);
is(count_in('web', 'SELECT count(*) FROM payments WHERE id = 100'), 1, 'allowed: the durable payment survives');
is(count_in('web', 'SELECT count(*) FROM clicks WHERE id BETWEEN 101 AND 120'), 0,
	'allowed: the clicks commits after it are lost, as delayed commits are');
is(count_in('web', 'SELECT count(*) FROM payments WHERE id BETWEEN 101 AND 102'), 2,
	'allowed: commit_delayed() does not delay a commit to a durable table (they survive the cut after them)');

# Another session's class applies to this session's next commit: the class
# map is invalidated when the configuration table changes.
settle_wal_writer($node);
my $bg = $node->background_psql('web', on_error_stop => 1);
$bg->query_safe("CREATE TABLE IF NOT EXISTS orders (id int); INSERT INTO orders VALUES (0)");
$bg->query_safe("SET delayed_durability.mode = 'forced'; CALL mark_wal(); INSERT INTO orders VALUES (1)");
is($bg->query_safe('SELECT flushed_since_mark()'), 'f', 'another session: unclassified, forced: delayed');
$node->safe_psql('web', "SELECT delayed_durability_set_table_class('orders', 'durable')");
$bg->query_safe('CALL mark_wal(); INSERT INTO orders VALUES (2)');
is($bg->query_safe('SELECT flushed_since_mark()'), 't', 'another session: the class set meanwhile makes the next commit durable');
$node->safe_psql('web', "SELECT delayed_durability_set_table_class('orders', NULL)");
$bg->query_safe('CALL mark_wal(); INSERT INTO orders VALUES (3)');
is($bg->query_safe('SELECT flushed_since_mark()'), 'f', 'another session: cleared meanwhile, delayed again');
# A class set while a transaction is open applies to its commit.
$bg->query_safe('BEGIN; INSERT INTO orders VALUES (4)');
$node->safe_psql('web', "SELECT delayed_durability_set_table_class('orders', 'durable')");
$bg->query_safe('CALL mark_wal(); COMMIT');
is($bg->query_safe('SELECT flushed_since_mark()'), 't', 'another session: a class set during an open transaction applies to its commit');

# COMMIT PREPARED makes other sessions read the classes again only when the
# prepared transaction changed one. Each read of the classes is a scan of
# the configuration table, counted in pg_stat_user_tables by the session
# that makes it.
sub config_scans
{
	$bg->query_safe('SELECT pg_stat_force_next_flush()');
	$bg->query_safe('SELECT 1');
	return $node->safe_psql('web',
		"SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'delayed_durability_table_class_config'::regclass");
}
$bg->query_safe('INSERT INTO orders VALUES (5)');
my $scans = config_scans();
$node->safe_psql('web', "BEGIN; INSERT INTO clicks VALUES (1, '/2pc'); PREPARE TRANSACTION 'no_class'");
$node->safe_psql('web', "COMMIT PREPARED 'no_class'");
$bg->query_safe('INSERT INTO orders VALUES (6)');
is(config_scans() - $scans, 0, 'COMMIT PREPARED of a transaction that changed no class: no session reads the classes again');
$scans = config_scans();
$node->safe_psql('web', "CREATE TABLE refunds (id int); BEGIN; SELECT delayed_durability_set_table_class('refunds', 'durable'); PREPARE TRANSACTION 'with_class'");
# The other session's transaction writes refunds before the COMMIT
# PREPARED and commits after it: no lock it takes in between brings it the
# invalidation, only the shared generation tells its commit.
$bg->query_safe('BEGIN; INSERT INTO refunds VALUES (1)');
$node->safe_psql('web', "COMMIT PREPARED 'with_class'");
$bg->query_safe('CALL mark_wal(); COMMIT');
is($bg->query_safe('SELECT flushed_since_mark()'), 't', 'COMMIT PREPARED of a class change: applies to the commit of a transaction open in another session');
cmp_ok(config_scans() - $scans, '>=', 1, 'and that session read the classes again');

# A durable table another session moves to another access method (heap's
# own handler under another name: PostgreSQL has no other one) may not
# count its writes: this session's next commit that writes anything is
# durable, even one to a delayed table, forced. VACUUM and ANALYZE of a
# durable table (which invalidate it) make no session read the classes
# again.
$node->safe_psql('web', "CREATE TABLE ledger (id int); SELECT delayed_durability_set_table_class('ledger', 'durable');
INSERT INTO ledger SELECT generate_series(1, 1000)");
$bg->query_safe("INSERT INTO clicks VALUES (7, '/loads the classes')");
$scans = config_scans();
# In this session: a new one would read the classes at its first commit.
$bg->query_safe('VACUUM ledger');
$bg->query_safe('ANALYZE ledger');
$bg->query_safe('CALL mark_wal(); INSERT INTO clicks VALUES (8, \'/after a vacuum\')');
is($bg->query_safe('SELECT flushed_since_mark()'), 'f', 'a delayed table\'s commit, forced, after a VACUUM of a durable table: delayed');
is(config_scans() - $scans, 0, 'VACUUM and ANALYZE of a durable table: the session did not read the classes again');
$node->safe_psql('web', 'CREATE ACCESS METHOD heap2 TYPE TABLE HANDLER heap_tableam_handler; ALTER TABLE ledger SET ACCESS METHOD heap2');
# Not query_safe(): the WARNING comes on stderr (kept there until cleared).
$bg->query('CALL mark_wal(); INSERT INTO clicks VALUES (9, \'/after the move\')');
like($bg->{stderr}, qr/WARNING:  durable table "ledger" uses table access method "heap2"/, 'the session is told');
$bg->{stderr} = '';
is($bg->query_safe('SELECT flushed_since_mark()'), 't', 'a durable table moved to another access method by another session: this session\'s next commit is durable');
ok($node->log_contains(qr/WARNING:  durable table "ledger" uses table access method "heap2", whose writes are not counted per transaction/),
	'and the server log');
$node->safe_psql('web', 'ALTER TABLE ledger SET ACCESS METHOD heap');
$bg->query_safe('CALL mark_wal(); INSERT INTO clicks VALUES (10, \'/moved back\')');
is($bg->query_safe('SELECT flushed_since_mark()'), 'f', 'moved back to heap: delayed again');
$node->safe_psql('web', 'DROP TABLE ledger; DROP ACCESS METHOD heap2');
$bg->quit;

# The fail-safe: while the configuration table is locked (VACUUM FULL, an
# uncommitted class change), a session that must read the classes cannot,
# and its commit is made durable (read from positions, with the WAL writer
# stopped), even forced; once the lock is gone the same commit is delayed.
$node->safe_psql('web', 'CREATE TABLE unclassified (i int)');
my $holder = $node->background_psql('web', on_error_stop => 1);
$holder->query_safe('BEGIN; LOCK TABLE delayed_durability_table_class_config IN ACCESS EXCLUSIVE MODE');
my $ww = pause_wal_writer($node);
my $fresh_commit = q{SET delayed_durability.mode = 'forced';
BEGIN;
INSERT INTO unclassified VALUES (1);
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn;};
is($node->safe_psql('web', $fresh_commit), 't', 'configuration table locked: a session that cannot read the classes commits durably');
$holder->query_safe('COMMIT');
is($node->safe_psql('web', $fresh_commit), 'f', 'lock released: the same commit is delayed');
resume_wal_writer($ww);
$holder->quit;

# DROP EXTENSION with classes set: commits go on, following the mode.
$node->safe_psql('postgres', 'CREATE DATABASE dropext');
$node->safe_psql('dropext', q{CREATE TABLE p (i int); SELECT delayed_durability_set_table_class('p', 'durable');});
my $dropext = $node->safe_psql('dropext', q{SET delayed_durability.mode = 'forced';
SELECT flushed();
CALL mark_wal();
INSERT INTO p VALUES (1);
SELECT 'class=' || flushed_since_mark();
DROP EXTENSION delayed_durability CASCADE;
SELECT flushed();
CALL mark_wal();
INSERT INTO p VALUES (2);
SELECT 'dropped=' || flushed_since_mark();});
like($dropext, qr/class=true/, 'before DROP EXTENSION: the durable class applies');
like($dropext, qr/dropped=false/, 'after DROP EXTENSION: no class, the commit follows forced');

# pg_dump/pg_restore keep the classes, and the restored database uses them.
my $dump = $node->basedir . '/web.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('web') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE web_restored TEMPLATE template0');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('web_restored'), $dump ], 'pg_restore');
is($node->safe_psql('web_restored', 'SELECT "table", class FROM delayed_durability_table_classes ORDER BY 1'),
	"clicks|delayed\norders|durable\npayments|durable\nrefunds|durable", 'the restored database has the classes');
# (the first SELECT warms the new database's catalog caches: setting hint
# bits writes WAL with wal_log_hints, which would land after the commit)
like($node->safe_psql('web_restored', q{SELECT flushed() IS NOT NULL FROM delayed_durability_stats LIMIT 1;
SET delayed_durability.mode = 'forced';
SELECT commits_durable_by_table AS before FROM delayed_durability_stats WHERE datname = current_database() \gset
CALL mark_wal();
INSERT INTO payments VALUES (1000, 1);
SELECT flushed_since_mark(), commits_durable_by_table - :before FROM delayed_durability_stats WHERE datname = current_database()}),
	qr/^t\nt\|1$/, 'and uses them');

# Logical replication: the apply worker's commits follow the subscriber's
# classes. A subscription commits with synchronous_commit = off by default,
# so under allowed its commits are delayed, except those to a durable table.
my $sub = new_dd_node('subscriber', conf => "delayed_durability.mode = 'allowed'\n");
$sub->safe_psql('postgres', q{
CREATE TABLE payments (id int PRIMARY KEY, amount numeric);
CREATE TABLE clicks (id int, url text);
SELECT delayed_durability_set_table_class('payments', 'durable');
});
$node->safe_psql('web', 'CREATE PUBLICATION pub FOR TABLE payments, clicks');
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION sub CONNECTION '" . $node->connstr . " dbname=web' PUBLICATION pub WITH (copy_data = false)");
$node->wait_for_catchup('sub');
my $sub_counter = sub {
	$sub->safe_psql('postgres', "SELECT commits_durable_by_table FROM delayed_durability_stats WHERE datname = 'postgres'");
};
my $sub_before = $sub_counter->();
$node->safe_psql('web', join("\n", map { "INSERT INTO payments VALUES ($_, 5);" } 2001 .. 2010));
$node->safe_psql('web', join("\n", map { "INSERT INTO clicks VALUES ($_, '/r');" } 2001 .. 2010));
$node->wait_for_catchup('sub');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM payments WHERE id > 2000'), '10', 'replicated');
is($sub_counter->() - $sub_before, 10, 'subscriber: the 10 applied payments commits were made durable by the table');

# The same from the subscriber's own positions, with its WAL writer
# stopped: after an applied payments commit the flush position is at the
# end of its WAL; after an applied clicks commit it is behind.
my $sub_walwriter = pause_wal_writer($sub);
my $applied_end = sub {
	my ($table, $id) = @_;
	$sub->poll_query_until('postgres', "SELECT count(*) = 1 FROM $table WHERE id = $id") or die "$table $id not applied";
	return $sub->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn() >= wal_end()');
};
$node->safe_psql('web', "INSERT INTO clicks VALUES (3001, '/control')");
is($applied_end->('clicks', 3001), 'f', 'subscriber positions: an applied clicks commit is not flushed (control)');
$node->safe_psql('web', 'INSERT INTO payments VALUES (3001, 7)');
is($applied_end->('payments', 3001), 't', 'subscriber positions: an applied payments commit is flushed up to the end of its WAL');
resume_wal_writer($sub_walwriter);

# The configuration table itself replicated: a class set on the publisher
# reaches the subscriber, whose apply worker (whose row triggers fire) and
# sessions read the classes again.
for my $n ($node, $sub)
{
	$n->safe_psql($n == $node ? 'web' : 'postgres', 'CREATE TABLE newt (i int)');
}
$node->safe_psql('web', 'ALTER PUBLICATION pub ADD TABLE delayed_durability_table_class_config, newt');
$sub->safe_psql('postgres', 'ALTER SUBSCRIPTION sub REFRESH PUBLICATION WITH (copy_data = false)');
$sub->poll_query_until('postgres',
	"SELECT count(*) = 4 FROM pg_subscription_rel WHERE srsubstate = 'r'")
  or diag('the subscription did not pick up the new tables');
$node->safe_psql('web', "SELECT delayed_durability_set_table_class('newt', 'durable')");
$node->wait_for_catchup('sub');
is($sub->safe_psql('postgres', q{SELECT class FROM delayed_durability_table_classes WHERE "table" = 'newt'}),
	'durable', 'the class replicated to the subscriber');
$sub_before = $sub_counter->();
$node->safe_psql('web', join("\n", map { "INSERT INTO newt VALUES ($_);" } 1 .. 5));
$node->wait_for_catchup('sub');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM newt'), '5', 'newt replicated');
is($sub_counter->() - $sub_before, 5, 'subscriber: the replicated class made the 5 applied commits durable');

$sub->stop;
$node->stop;
done_testing();

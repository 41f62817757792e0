# Streaming replication with a synchronous standby: durable commits wait for
# it, delayed ones do not; the extension is harmless on the standby, and the
# policy follows the primary role after promotion.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $primary = new_dd_node('primary', init => { allows_streaming => 1 });
$primary->safe_psql('postgres', q{
CREATE TABLE t (id int);
CREATE SEQUENCE s CACHE 10;
CREATE DATABASE shop;
ALTER DATABASE shop SET delayed_durability.mode = 'forced';
});
$primary->safe_psql('shop', 'CREATE TABLE t (id int)');
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
# A killed WAL receiver then restarts recovery instead of stopping the server
# (the failover test below kills it).
$standby->append_conf('postgresql.conf', "restart_after_crash = on\n");
$standby->start;
$primary->wait_for_catchup($standby);
# Synchronous only now: with no standby connected every durable commit waits.
$primary->safe_psql('postgres', "ALTER SYSTEM SET synchronous_standby_names = 'standby'; SELECT pg_reload_conf();");
ok($primary->poll_query_until('postgres', "SELECT sync_state = 'sync' FROM pg_stat_replication"),
	'standby is synchronous');

# A durable commit with remote_apply is visible on the standby as soon as
# COMMIT returns.
$primary->safe_psql('postgres', "SET synchronous_commit = remote_apply;\nINSERT INTO t VALUES (1);");
is($standby->safe_psql('postgres', 'SELECT count(*) FROM t WHERE id = 1'), '1',
	'durable remote_apply commit visible on the standby right after COMMIT');

# With replay paused on the standby, a durable remote_apply commit waits
# for it (seen in pg_stat_activity as wait event SyncRep until cancelled);
# a forced commit does not wait at all.
$standby->safe_psql('postgres', 'SELECT pg_wal_replay_pause()');
my $waiter = $primary->background_psql('postgres', on_error_stop => 0);
$waiter->query_safe("SET application_name = 'durable_waiter'; SET synchronous_commit = remote_apply;");
$waiter->query_until(qr/sent/, "\\echo sent\nINSERT INTO t VALUES (2);\n");
ok($primary->poll_query_until('postgres',
	"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE application_name = 'durable_waiter'"),
	'durable commit waits for the paused standby');
my ($ret, $out, $err) = $primary->psql('shop',
	"SET synchronous_commit = remote_apply;\nINSERT INTO t VALUES (3);\nSELECT current_setting('delayed_durability.mode');",
	timeout => 60);
is($ret, 0, 'forced commit returned while the standby is paused');
unlike($err, qr/canceling wait/, 'forced (delayed) commit did not wait for the standby');
is($out, 'forced', 'shop runs under forced');
$primary->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'durable_waiter'");
$waiter->quit;
$standby->safe_psql('postgres', 'SELECT pg_wal_replay_resume()');

# Commits PostgreSQL makes durable anyway (here: dropping a file) are
# flushed locally but, delayed by the policy, do not wait for a synchronous
# standby; native synchronous_commit = off behaves the same. Shown with the
# standby's WAL receiver stopped (a wait would last until the timeout).
my $walreceiver = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
$primary->safe_psql('shop', 'CREATE TABLE drop_me (i int)');
$primary->safe_psql('postgres', 'CREATE TABLE drop_me_too (i int)');
ok(kill('STOP', $walreceiver), "standby's WAL receiver stopped");
($ret, $out, $err) = $primary->psql('shop', "SET statement_timeout = '5s';\nDROP TABLE drop_me;\nSELECT 'returned';");
is($out, 'returned', 'forced: DROP TABLE (flushed by PostgreSQL) does not wait for the stopped standby');
unlike($err, qr/canceling/, '... no wait cancelled');
# Native: the library's policy allowed, the session asynchronous.
($ret, $out, $err) = $primary->psql('postgres',
	"SET delayed_durability.mode = allowed;\nSET synchronous_commit = off;\nSET statement_timeout = '5s';\nDROP TABLE drop_me_too;\nSELECT 'returned';");
is($out, 'returned', 'native synchronous_commit = off: DROP TABLE does not wait either');
ok(kill('CONT', $walreceiver), "standby's WAL receiver resumed");
$primary->wait_for_catchup($standby);

# flush_log() hardens delayed commits locally. (The WAL writer, settled
# first, flushes nothing for the next 10 s: woken from hibernation by the
# asynchronous commit it would otherwise flush it at once.)
settle_wal_writer($primary);
my $flushed = $primary->safe_psql('shop',
	"INSERT INTO t VALUES (4);\nSELECT pg_current_wal_flush_lsn() < wal_end();\nSELECT flush_log() >= wal_end();");
is($flushed, "t\nt", 'forced commit unflushed, then flushed by flush_log()');

# The extension on the standby.
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'standby in recovery');
is($standby->safe_psql('shop', 'SELECT count(*) FROM t'), '2', 'standby replayed the commits');
is($standby->safe_psql('postgres',
	"SELECT count(*), sum(commits_durable + commits_delayed) FROM delayed_durability_stats WHERE datname IN ('postgres', 'shop')"),
	'2|0', 'stats on the standby: one row per database, no commits of its own');
is($standby->safe_psql('postgres', 'SELECT insert_lsn = flush_lsn AND bytes_at_risk = 0 FROM delayed_durability_status()'),
	't', 'status on the standby reports the replay position');
($ret, $out, $err) = $standby->psql('postgres', 'SELECT flush_log()');
like($err, qr/ERROR:  recovery is in progress/, 'flush_log() refused on the standby');
($ret, $out, $err) = $standby->psql('postgres', "SELECT wait_durable('0/1000', interval '1s')");
like($err, qr/ERROR:  recovery is in progress\nHINT:  wait_durable\(\) answers for the primary's own commits; on a standby, compare with pg_last_wal_replay_lsn\(\)\./,
	'wait_durable() refused on the standby, with a hint');
($ret, $out, $err) = $standby->psql('postgres', "SELECT cached_nextval('s')");
like($err, qr/cannot execute cached_nextval\(\) in a read-only transaction/, 'cached_nextval() refused on the standby');
ok($standby->log_contains(qr/database system is ready to accept read-only connections/), 'standby started normally');
unlike(slurp_file($standby->logfile), qr/PANIC|terminated by signal/, 'no crash on the standby');

# cached_nextval() with a synchronous standby: a new block's recovery value
# must be on the standby before any value of it is handed out, whatever the
# policy (shop runs under forced). With the standby's WAL receiver stopped,
# a call that needs a new block waits and, cancelled, hands out nothing; the
# standby, promoted without ever receiving that block, continues above
# every value the old primary handed out.
$primary->safe_psql('shop', 'CREATE SEQUENCE fo CACHE 1');
my @handed = split /\n/, $primary->safe_psql('shop', "SELECT cached_nextval('fo') FROM generate_series(1, 20)");
is(scalar @handed, 20, 'cached_nextval() with the synchronous standby connected');
$primary->safe_psql('shop', "CREATE SEQUENCE fo2 CACHE 10; SELECT cached_nextval('fo2');");
$primary->safe_psql('shop', "CREATE SEQUENCE fo3 CACHE 10; SELECT cached_nextval('fo3');");
$walreceiver = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok(kill('STOP', $walreceiver), "standby's WAL receiver stopped again");
($ret, $out, $err) = $primary->psql('shop', "SET statement_timeout = '2s';\nSELECT cached_nextval('fo');");
isnt($ret, 0, 'without confirmation from the standby, cached_nextval() returns no value');
like($err, qr/ERROR:  canceling cached_nextval\(\): the synchronous standby has not confirmed/, '... and says why');
push @handed, $out if $out =~ /^\d+$/;
# A sequence whose file is made anew in a transaction (ALTER SEQUENCE ...
# CACHE rewrites it): the values that transaction hands out are confirmed by
# its commit, which waits for the standby whatever the session's
# synchronous_commit (here local: without the extension it would not wait).
# The wait (wait event SyncRep; statement_timeout does not cover a commit)
# is cancelled: PostgreSQL warns that the commit may be missing on the
# standby. After it, no value of that transaction's block is handed out
# without the standby. The same at PREPARE TRANSACTION.
sub waits_for_standby
{
	my ($script, $what) = @_;
	my ($stdout, $stderr) = ('', '');
	# From a file: IPC::Run feeds a scalar's input only when pumped.
	my $file = PostgreSQL::Test::Utils::tempdir() . '/script.sql';
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my $h = IPC::Run::start([ 'psql', '-X', '-d', $primary->connstr('shop'), '-f', $file ], '>', \$stdout, '2>', \$stderr);
	ok($primary->poll_query_until('shop', "SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'"),
		"$what waits for the standby, even at synchronous_commit = local");
	$primary->safe_psql('shop', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
	$h->finish;
	like($stderr, qr/WARNING:  canceling wait for synchronous replication/, "$what: the cancelled wait is PostgreSQL's");
}
waits_for_standby("SET synchronous_commit = local;\nBEGIN;\nALTER SEQUENCE fo2 CACHE 1000;\nSELECT cached_nextval('fo2');\nCOMMIT;\n",
	'the commit of a transaction that rewrote a sequence and handed out its values');
($ret, $out, $err) = $primary->psql('shop', "SET statement_timeout = '2s';\nSELECT cached_nextval('fo2');");
isnt($ret, 0, 'after it, its block is not handed out without confirmation from the standby');
like($err, qr/ERROR:  canceling cached_nextval\(\): the synchronous standby has not confirmed/, '... and says why');
waits_for_standby("SET synchronous_commit = local;\nBEGIN;\nALTER SEQUENCE fo3 CACHE 1000;\nSELECT cached_nextval('fo3');\nPREPARE TRANSACTION 'fo3';\n",
	'PREPARE TRANSACTION of a transaction that rewrote a sequence and handed out its values');
$primary->safe_psql('shop', "SET synchronous_commit = local; ROLLBACK PREPARED 'fo3'");

# Failover: the primary dies; the WAL receiver dies with what it had not
# written (the standby restarts its recovery); the standby is promoted and
# the policy applies there.
$primary->stop('immediate');
my $standby_log = -s $standby->logfile;
kill 'KILL', $walreceiver;
$standby->wait_for_log(qr/all server processes terminated; reinitializing/, $standby_log);
$standby->poll_query_until('postgres', 'SELECT pg_is_in_recovery()') or die 'standby did not come back';
$standby->promote;
# Promotion requests a checkpoint whose WAL would race with the checks below.
$standby->safe_psql('postgres', 'CHECKPOINT');
my @checks = commits_with_check($standby, 'shop', '', [ map { "INSERT INTO t VALUES ($_);" } 101 .. 120 ]);
is(count_true(@checks), 0, 'after promotion: shop commits are delayed on the new primary');
my $before = $standby->safe_psql('postgres',
	"SELECT commits_durable || '/' || commits_delayed FROM delayed_durability_stats WHERE datname = 'postgres'");
@checks = commits_with_check($standby, 'postgres', 'SET synchronous_commit = off;',
	[ map { "INSERT INTO t VALUES ($_);" } 101 .. 120 ]);
is(count_true(@checks), 20, 'after promotion: postgres (disabled) commits are flushed on the new primary');
my ($d0, $l0) = split m{/}, $before;
is($standby->safe_psql('postgres',
	"SELECT (commits_durable - $d0) || '/' || (commits_delayed - $l0) FROM delayed_durability_stats WHERE datname = 'postgres'"),
	'20/0', 'after promotion: all 20 counted durable, none delayed');
is($standby->safe_psql('shop', "SELECT commits_delayed >= 20 FROM delayed_durability_stats WHERE datname = 'shop'"),
	't', 'the new primary counts its commits');
# Every value handed out on the old primary stays handed out: the new one
# continues above them.
my @after = split /\n/, $standby->safe_psql('shop', "SELECT cached_nextval('fo') FROM generate_series(1, 5)");
my $max_handed = (sort { $b <=> $a } @handed)[0];
cmp_ok((sort { $a <=> $b } @after)[0], '>', $max_handed,
	"after promotion cached_nextval() continues above every value handed out before ($max_handed)");

$standby->stop;
done_testing();

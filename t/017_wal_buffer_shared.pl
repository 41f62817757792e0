# One persistent WAL buffer, two servers: a pg_basebackup copy on the same
# host inherits delayed_durability.wal_buffer_path and the system identifier.
# Started while the primary runs, the copy is refused before it reads or
# writes the file (the primary's postmaster holds a lock on it for its
# life), with a FATAL naming the primary's postmaster and data directory;
# the primary's buffer and the copy's pg_wal stay byte-identical, and the
# primary's acknowledged durable commits still survive a power cut from its
# last real WAL fsync. The lock survives a crash-restart cycle of the
# primary's postmaster. With a buffer file of its own the copy starts.
use strict;
use warnings;
use Cwd qw(abs_path);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;
use WalBufferFile;

my $buffer = "/dev/shm/dd_tap_shared_$$.buf";
my $clone_buffer = "/dev/shm/dd_tap_shared_clone_$$.buf";
END { unlink $buffer, $clone_buffer; }

# restart_after_crash: a child killed by a signal makes the postmaster reset
# shared memory and run its startup hook again, without exiting.
my $node = new_dd_node('primary', init => { allows_streaming => 1 }, conf => qq{
delayed_durability.wal_buffer_path = '$buffer'
delayed_durability.wal_buffer_allow_volatile = on
delayed_durability.mode = disabled
synchronous_commit = on
restart_after_crash = on
});
$node->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY)');
$node->safe_psql('postgres', 'INSERT INTO t SELECT generate_series(1, 100)');
my $primary_dir = abs_path($node->data_dir);

$node->backup('b');
my $clone = PostgreSQL::Test::Cluster->new('clone');
$clone->init_from_backup($node, 'b');
like(slurp_file($clone->data_dir . '/postgresql.conf'), qr/^delayed_durability\.wal_buffer_path = '\Q$buffer\E'$/m,
	'the clone inherits the primary\'s buffer path');

sub postmaster_pid
{
	my ($n) = @_;
	return (split /\n/, slurp_file($n->data_dir . '/postmaster.pid'))[0];
}

sub insert_script
{
	my ($from, $to) = @_;
	return join '', map { "INSERT INTO t VALUES ($_);\n" } $from .. $to;
}

sub fsyncs_avoided
{
	return $node->safe_psql('postgres', 'SELECT wal_buffer_fsyncs_avoided FROM delayed_durability_status()');
}

# Tries to start the clone while every process of the primary is stopped
# (SIGSTOP), so that the primary's own WAL writes (the background writer
# logs running transactions every 15 s) cannot change its buffer during the
# attempt: any change would be the clone's. A stopped process keeps its
# lock.
sub clone_refused
{
	my ($what) = @_;
	my $pm = postmaster_pid($node);
	my @primary = ($pm, grep { /^\d+$/ } split /\s+/, `pgrep -P $pm`);
	my $wal = pg_wal_digest($clone);
	my $log_start = (-s $clone->logfile) // 0;
	kill 'STOP', @primary;
	my $before = WalBufferFile::slurp_raw($buffer);
	my $started = $clone->start(fail_ok => 1);
	my $unchanged = WalBufferFile::slurp_raw($buffer) eq $before;
	kill 'CONT', @primary;
	ok(!$started, "$what: the clone does not start");
	my $log = substr(slurp_file($clone->logfile), $log_start);
	like($log, qr/FATAL:  persistent WAL buffer "\Q$buffer\E" is in use by another server/,
		"$what: FATAL says the buffer is in use by another server");
	like($log, qr/DETAIL:  It is locked by process $pm \(data directory "\Q$primary_dir\E"\)\./,
		"$what: DETAIL names the primary's postmaster and data directory");
	like($log, qr/HINT:  Each server needs its own buffer file\..*set delayed_durability\.wal_buffer_path of the copy to another file, or empty it\./,
		"$what: HINT tells how to fix the copy");
	ok($unchanged, "$what: the primary's buffer file is byte-identical");
	is(pg_wal_digest($clone), $wal, "$what: the clone's pg_wal untouched");
	return;
}

clone_refused('primary running');

# The primary still commits durably through its buffer.
my $avoided = fsyncs_avoided();
$node->safe_psql('postgres', insert_script(101, 200));
cmp_ok(fsyncs_avoided() - $avoided, '>=', 100, 'after the refusal, the primary\'s durable commits still skip their fsync');

# A crash of one child: the postmaster restores its buffer again but keeps
# its lock (it does not take it twice, nor drop it).
my $pm = postmaster_pid($node);
my $log_start = -s $node->logfile;
my $victim = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
kill 'KILL', $victim;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_start);
$node->poll_query_until('postgres', 'SELECT true') or die 'no reconnection after the crash';
is(postmaster_pid($node), $pm, 'crash-restart: same postmaster');
unlike(substr(slurp_file($node->logfile), $log_start), qr/FATAL:  persistent WAL buffer/, 'crash-restart: the postmaster does not lock itself out');
clone_refused('after a crash-restart of the primary');

# Power cut of the primary: every acknowledged durable commit comes back,
# the ones since the last real WAL fsync from the buffer the clone left
# alone.
$node->safe_psql('postgres', insert_script(201, 300));
kill_everything($node);
my $h = read_wal_buffer($buffer);
ok(@{ $h->{records} } > 0, 'the primary\'s buffer holds records after the kill');
cmp_ok(zero_wal_after($node, @{ $h->{records} } ? $h->{records}[0]{lsn} : $h->{synced_lsn}),
	'>', 0, 'power cut: WAL after the last real fsync zeroed');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '300', 'primary: all 300 acknowledged durable commits survive');

# With a buffer file of its own, the clone starts next to the primary.
$clone->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$clone_buffer'");
$clone->start;
like(slurp_file($clone->logfile), qr/persistent WAL buffer "\Q$clone_buffer\E" in use/, 'clone with its own buffer file starts');
is($clone->safe_psql('postgres', 'SELECT count(*) FROM t'), '100', 'the clone holds the backup\'s rows');
$clone->safe_psql('postgres', insert_script(1001, 1010));
$node->safe_psql('postgres', insert_script(1001, 1010));
is($clone->safe_psql('postgres', 'SELECT count(*) FROM t'), '110', 'the clone commits');
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '310', 'the primary commits');
$clone->stop;
$node->stop;

done_testing();

# The persistent WAL buffer (on /dev/shm, DRAM standing in for persistent
# memory, accepted with delayed_durability.wal_buffer_allow_volatile):
# durable commits survive a kill -9 of every process followed by
# a simulated power cut that zeroes all WAL written after the last real
# fsync; the same cut without the buffer loses commits; a buffer that cannot
# be trusted, or on tmpfs without the opt-in, stops the server with a clear
# FATAL and leaves pg_wal untouched.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;
use WalBufferFile;

my $buffer = "/dev/shm/dd_tap_$$.buf";
my @cleanup = ($buffer);
END { unlink @cleanup; }

my $node = new_dd_node('walbuf', init => { allows_streaming => 1 }, conf => qq{
delayed_durability.wal_buffer_path = '$buffer'
delayed_durability.wal_buffer_allow_volatile = on
delayed_durability.mode = disabled
synchronous_commit = on
});
$node->safe_psql('postgres', q{
CREATE TABLE t (id int PRIMARY KEY, payload text);
CREATE EXTENSION amcheck;
});
ok(-f $buffer && ((stat $buffer)[2] & 0777) == 0600, 'buffer file created with mode 0600');
like(slurp_file($node->logfile), qr/persistent WAL buffer "\Q$buffer\E" in use/, 'startup says the buffer is in use');
like(slurp_file($node->logfile),
	qr/WARNING:  delayed_durability: persistent WAL buffer "\Q$buffer\E" is on tmpfs \(delayed_durability\.wal_buffer_allow_volatile = on\): commits acknowledged as durable through this buffer are lost at a power cut or operating-system crash/,
	'tmpfs with the opt-in: starts with a WARNING that a power cut loses commits');

sub status
{
	my ($n) = @_;
	my %s;
	@s{qw(is_pmem persisted avoided drains restored wal_sync)} = split /\|/, $n->safe_psql('postgres', q{
SELECT pg_stat_force_next_flush();
SELECT coalesce(wal_buffer_is_pmem::text, 'null'), wal_buffer_bytes_persisted,
       wal_buffer_fsyncs_avoided, wal_buffer_drains, wal_buffer_restored_bytes, wal_flushes
  FROM delayed_durability_status()}) =~ s/^\n//r;
	# PostgreSQL 18 counts WAL fsyncs in pg_stat_io, after the call and in
	# memory the extension cannot reach: a call the buffer absorbed is
	# counted there, and wal_buffer_fsyncs_avoided says how many were.
	$s{real_syncs} = $s{wal_sync} - ($n->pg_version >= 18 ? $s{avoided} : 0);
	return \%s;
}

sub insert_script
{
	my ($from, $to) = @_;
	return join '', map { "INSERT INTO t VALUES ($_, repeat('x', 100));\n" } $from .. $to;
}

# 1. Counters: durable commits skip their WAL fsync.
my $before = status($node);
is($before->{is_pmem}, 'false', 'tmpfs is not reported as persistent memory');
$node->safe_psql('postgres', insert_script(1, 300));
my $after = status($node);
cmp_ok($after->{avoided} - $before->{avoided}, '>=', 300, 'wal_buffer_fsyncs_avoided grows with each durable commit');
cmp_ok($after->{real_syncs} - $before->{real_syncs}, '<', 10, 'PostgreSQL\'s WAL fsync count does not grow per commit');
cmp_ok($after->{persisted} - $before->{persisted}, '>', 300 * 100, 'the commits\' WAL was persisted in the buffer');
my $drains = $after->{drains};
$node->safe_psql('postgres', 'SELECT pg_switch_wal(); CREATE TABLE after_switch ()');
cmp_ok(status($node)->{drains}, '>', $drains, 'a finished segment drains the buffer with a real fsync');

# 2. Power cut with the buffer: every acknowledged durable commit survives.
# What really reached the disk is taken from outside the server: strace of
# every server process's WAL writes and syncs (the buffer skips fdatasync
# and adjusts pg_stat_wal itself, so neither could tell).
my $trace = start_fsync_trace($node);
$node->safe_psql('postgres', insert_script(301, 600));
my $acked_end = lsn_to_int($node->safe_psql('postgres', 'SELECT wal_end()'));
kill_everything($node);
stop_fsync_trace($trace);
my $h = read_wal_buffer($buffer);
is($h->{magic}, 'DDWALBUF', 'buffer signature');
ok(@{ $h->{records} } > 0, 'the buffer holds records after the kill');
my ($zeroed, $first_unsynced) = zero_unsynced_wal($node, $trace);
cmp_ok($zeroed, '>', 0, 'power cut: WAL never really synced (strace) zeroed');
cmp_ok($first_unsynced // $acked_end, '<', $acked_end, 'acknowledged commits lay past the last real WAL fsync');
$node->start;
like(slurp_file($node->logfile), qr/restored \d+ bytes of WAL/, 'startup restored the buffer into pg_wal');
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '600', 'all 600 acknowledged durable commits survive');
cmp_ok(status($node)->{restored}, '>', 0, 'wal_buffer_restored_bytes reports the restore');
my ($rc, $amout, $amerr) = (0, '', '');
IPC::Run::run([ 'pg_amcheck', '--all', '-d', 'postgres', '-h', $node->host, '-p', $node->port ],
	'>', \$amout, '2>', \$amerr) or $rc = $?;
is($rc, 0, 'pg_amcheck is clean after the restore') or diag("$amout$amerr");

# 3. A clean shutdown leaves the buffer empty.
$node->safe_psql('postgres', insert_script(601, 650));
$node->stop('fast');
is(read_wal_buffer($buffer)->{tail}, 0, 'clean shutdown leaves the buffer empty');

# 4. A buffer that cannot be trusted is refused and pg_wal stays untouched.
$node->start;
$trace = start_fsync_trace($node);
$node->safe_psql('postgres', insert_script(651, 700));
kill_everything($node);
stop_fsync_trace($trace);
# The power cut: the torn-tail case below must bring 651..700 back from the buffer.
($zeroed) = zero_unsynced_wal($node, $trace);
cmp_ok($zeroed, '>', 0, 'refusal cases: WAL never really synced zeroed');
my $pristine = WalBufferFile::slurp_raw($buffer);
$h = read_wal_buffer($buffer);
ok(@{ $h->{records} } > 0, 'buffer holds records for the refusal cases');

# Returns the log of the refused start.
sub refused
{
	my ($what, $expect, %change) = @_;
	my $digest = pg_wal_digest($node);
	$node->append_conf('postgresql.conf', $change{conf}) if $change{conf};
	$change{forge}->() if $change{forge};
	my $log_start = -s $node->logfile;
	ok(!$node->start(fail_ok => 1), "$what: server does not start");
	my $log = substr(slurp_file($node->logfile), $log_start);
	like($log, qr/FATAL:  .*$expect/, "$what: clear FATAL");
	is(pg_wal_digest($node), $digest, "$what: pg_wal untouched");
	# Undo.
	$node->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$buffer'\n"
		  . "delayed_durability.wal_buffer_size = 16MB\nwal_sync_method = fdatasync\n"
		  . "delayed_durability.wal_buffer_allow_volatile = on\n");
	write_at($buffer, 0, $pristine);
	return $log;
}

# A path changed after the crash is refused first because the buffer that
# holds WAL is not the one set (t/027); without that marker, each path is
# refused for what it is.
my $marker = $node->data_dir . '/delayed_durability/wal_buffer_in_use';
ok(-e $marker, 'refusal cases: the data directory says its WAL went through the buffer');
sub forget_marker { unlink $marker }
refused('missing directory', qr/directory "\/dev\/shm\/dd_no_such_dir_$$" of the persistent WAL buffer does not exist/,
	conf => "delayed_durability.wal_buffer_path = '/dev/shm/dd_no_such_dir_$$/buf'\n", forge => \&forget_marker);
refused('another cluster', qr/belongs to another database system/,
	forge => sub { write_at($buffer, 16, pack('Q<', $h->{system_id} + 1)); header_crc_fix($buffer); });
refused('another segment size', qr/written with another WAL segment size/,
	forge => sub { write_at($buffer, 12, pack('V', 32 * 1024 * 1024)); header_crc_fix($buffer); });
refused('corrupted record', qr/holds a corrupted record/,
	forge => sub { my $r = $h->{records}[0]; write_at($buffer, $r->{offset} + 24, 'garbage!'); });
refused('another timeline', qr/holds WAL of another timeline/,
	forge => sub { my $r = $h->{records}[-1]; write_at($buffer, $r->{offset} + 12, pack('V', 7)); record_crc_fix($buffer, { %$r, tli => 7 }); });
my $foreign = "/dev/shm/dd_tap_foreign_$$";
push @cleanup, $foreign;
write_at($foreign, 0, 'not a buffer' x 1000) if open my $touch, '>', $foreign;
refused('not a buffer', qr/is not a delayed_durability WAL buffer/,
	conf => "delayed_durability.wal_buffer_path = '$foreign'\n", forge => \&forget_marker);
# tmpfs does not survive a power cut: refused unless explicitly accepted,
# before the file is created.
my $volatile = "/dev/shm/dd_tap_volatile_$$.buf";
push @cleanup, $volatile;
my $log = refused('tmpfs without the opt-in',
	qr/persistent WAL buffer "\Q$volatile\E" is on a file system that does not survive a power cut \(tmpfs\)/,
	conf => "delayed_durability.wal_buffer_path = '$volatile'\ndelayed_durability.wal_buffer_allow_volatile = off\n",
	forge => \&forget_marker);
like($log, qr/HINT:  .*mount -o dax \/dev\/pmem0 \/mnt\/pmem.*delayed_durability\.wal_buffer_allow_volatile = on accepts it/,
	'tmpfs without the opt-in: the hint shows a DAX mount and the opt-in');
ok(!-e $volatile, 'tmpfs without the opt-in: no buffer file created');

# A torn record past the committed tail is ignored.
write_at($buffer, 4096 + $h->{tail}, 'torn record bytes, never committed');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '700', 'torn bytes past the tail ignored; all commits present');

# Settings the buffer cannot work with (a changed wal_sync_method, a size
# below the minimum): the start restores what the buffer holds, then runs
# without it, fsyncing WAL as usual, and says so. It never refuses to start:
# a crash restart must not either.
for my $case ([ 'wal_sync_method = fsync', qr/it requires wal_sync_method = fdatasync/ ],
	[ 'delayed_durability.wal_buffer_size = 32kB', qr/delayed_durability\.wal_buffer_size \(32kB\) is below 64kB/ ])
{
	my ($setting, $why) = @$case;
	my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM t');
	my $first = $setting =~ /sync/ ? 5001 : 5021;
	my $setting_trace = start_fsync_trace($node);
	$node->safe_psql('postgres', insert_script($first, $first + 19));
	kill_everything($node);
	stop_fsync_trace($setting_trace);
	my ($cut) = zero_unsynced_wal($node, $setting_trace);
	cmp_ok($cut, '>', 0, "$setting: WAL never really synced zeroed");
	$node->append_conf('postgresql.conf', "$setting\n");
	my $setting_log = -s $node->logfile;
	$node->start;
	my $started = substr(slurp_file($node->logfile), $setting_log);
	like($started, qr/restored \d+ bytes of WAL/, "$setting: the buffer is restored first");
	like($started, qr/WARNING:  delayed_durability: the persistent WAL buffer "\Q$buffer\E" is not used until the next start: $why/,
		"$setting: then not used, with the reason");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows + 20, "$setting: every acknowledged commit present");
	is($node->safe_psql('postgres', 'SELECT wal_buffer_is_pmem IS NULL FROM delayed_durability_status()'), 't', "$setting: buffer off");
	$node->append_conf('postgresql.conf', "wal_sync_method = fdatasync\ndelayed_durability.wal_buffer_size = 16MB\n");
	$node->restart;
	is($node->safe_psql('postgres', 'SELECT wal_buffer_is_pmem IS NOT NULL FROM delayed_durability_status()'), 't', "$setting undone: buffer on again");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '740', '40 more rows');

# A crash of one server process: the postmaster reinitializes and restores the
# buffer before crash recovery, as at a start.
$node->safe_psql('postgres', insert_script(701, 705));
my $log_start = -s $node->logfile;
# Any child killed by a signal makes the postmaster reset shared memory
# (the test framework turns that off by default).
$node->append_conf('postgresql.conf', "restart_after_crash = on\n");
$node->reload;
my $victim = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
# The postmaster survives this crash, so pg_wal cannot be cut under it; the
# evidence that the restore really wrote WAL back comes from strace: the
# postmaster itself never writes WAL otherwise.
$trace = start_fsync_trace($node);
my $postmaster = (split /\n/, slurp_file($node->data_dir . '/postmaster.pid'))[0];
kill 'KILL', $victim;
# A connection accepted before the postmaster saw the death would stop the
# trace before the restore.
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_start);
$node->poll_query_until('postgres', 'SELECT true') or die 'no reconnection after the crash';
stop_fsync_trace($trace);
my $restore_writes = () = slurp_file($trace->{file}) =~ /^$postmaster\s+pwrite64\(\d+<[^>]*\/pg_wal\/[0-9A-F]{24}>/mg;
cmp_ok($restore_writes, '>', 0, 'crash of one process: the postmaster wrote the buffer\'s WAL back into pg_wal (strace)');
like(substr(slurp_file($node->logfile), $log_start), qr/terminated by signal 9.*restored \d+ bytes of WAL/s,
	'crash of one process: buffer restored before crash recovery');
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '745', 'all commits present after that crash');

# A changed wal_buffer_size: the old file's WAL is restored, then it is resized.
$trace = start_fsync_trace($node);
$node->safe_psql('postgres', insert_script(706, 710));
kill_everything($node);
stop_fsync_trace($trace);
($zeroed) = zero_unsynced_wal($node, $trace);
cmp_ok($zeroed, '>', 0, 'resize: WAL never really synced zeroed');
ok(@{ read_wal_buffer($buffer)->{records} } > 0, 'buffer holds records before the resize');
$node->append_conf('postgresql.conf', "delayed_durability.wal_buffer_size = 1MB\n");
$log_start = -s $node->logfile;
$node->start;
like(substr(slurp_file($node->logfile), $log_start), qr/restored \d+ bytes of WAL/, 'resize: old content restored first');
is(-s $buffer, 1024 * 1024, 'resize: file now 1MB');
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '750', 'resize: all commits present');

# A full buffer drains: with 1MB (768kB before a drain) one transaction of
# several MB of WAL cannot stay in the buffer and is really fsynced; a power
# cut from the last real fsync then keeps it.
my $drains_before = status($node)->{drains};
$trace = start_fsync_trace($node);
$node->safe_psql('postgres', "INSERT INTO t SELECT i, repeat('y', 200) FROM generate_series(100001, 115000) AS i");
cmp_ok(status($node)->{drains}, '>', $drains_before, 'full buffer: real fsyncs (wal_buffer_drains grows)');
$node->safe_psql('postgres', insert_script(711, 720));
kill_everything($node);
stop_fsync_trace($trace);
my $synced_segments = () = slurp_file($trace->{file}) =~ /\bfdatasync\(\d+<[^>]*\/pg_wal\/[0-9A-F]{24}>(?:\)\s+=\s+0| <unfinished)/g;
cmp_ok($synced_segments, '>', 0, 'full buffer: strace saw real fdatasync calls on WAL segments');
($zeroed) = zero_unsynced_wal($node, $trace);
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), '15760', 'full buffer: the big transaction and later commits survive a power cut');

# Switching wal_sync_method by reload stays durable: WAL fsyncs are real again.
$node->append_conf('postgresql.conf', "wal_sync_method = fsync\n");
$node->reload;
$before = status($node);
$node->safe_psql('postgres', insert_script(721, 740));
$after = status($node);
is($after->{avoided} - $before->{avoided}, 0, 'wal_sync_method = fsync: no fsync skipped');
cmp_ok($after->{real_syncs} - $before->{real_syncs}, '>=', 20, 'wal_sync_method = fsync: each commit fsyncs');
$node->append_conf('postgresql.conf', "wal_sync_method = fdatasync\n");
$node->reload;

# 5. A standby does not use the buffer (it holds its lock and restores it at start).
$node->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('walbuf_standby');
$standby->init_from_backup($node, 'b', has_streaming => 1);
my $standby_buffer = "/dev/shm/dd_tap_standby_$$.buf";
push @cleanup, $standby_buffer;
$standby->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$standby_buffer'\n");
$standby->start;
$node->safe_psql('postgres', insert_script(741, 750));
$node->wait_for_catchup($standby);
like(slurp_file($standby->logfile), qr/the persistent WAL buffer .* is not used in this run \(standby mode/, 'standby logs that it does not use the buffer');
is($standby->safe_psql('postgres', 'SELECT wal_buffer_is_pmem IS NULL FROM delayed_durability_status()'), 't', 'standby: buffer off');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM t'), '15790', 'standby replays the primary\'s WAL');
$standby->stop;

# 5b. PostgreSQL 18 reads through asynchronous I/O (io_method), but WAL is
# still written and synced by XLogWrite and issue_xlog_fsync with plain
# pg_pwrite and pg_fdatasync in the committing process: the interposition
# holds under every method this server offers (io_uring only when built
# with liburing).
if ($node->pg_version >= 18)
{
	my @methods = split /,/, $node->safe_psql('postgres',
		"SELECT array_to_string(enumvals, ',') FROM pg_settings WHERE name = 'io_method'");
	cmp_ok(scalar @methods, '>=', 2, 'io_method offers sync and worker at least');
	my ($rows, $next) = (15790, 751);
	for my $method (@methods)
	{
		$node->append_conf('postgresql.conf', "io_method = $method\n");
		$node->stop;
		my $io_log = -s $node->logfile;
		if (!$node->start(fail_ok => 1))
		{
			# A kernel or container that forbids io_uring (sysctl
			# kernel.io_uring_disabled, a seccomp profile) stops the server
			# at startup; nothing else may, and only io_uring may be refused.
			is($method, 'io_uring', "io_method = $method: only io_uring may be refused at startup");
			like(substr(slurp_file($node->logfile), $io_log), qr/io_uring/i, "io_method = $method: refused at this start, naming io_uring");
			$node->append_conf('postgresql.conf', "io_method = sync\n");
			$node->start;
			next;
		}
		is($node->safe_psql('postgres', 'SHOW io_method'), $method, "io_method = $method in effect");
		my $avoided = status($node)->{avoided};
		my $io_trace = start_fsync_trace($node);
		# A sequential scan read through a read stream, then durable commits.
		$node->safe_psql('postgres', "SELECT count(*) FROM t;\n" . insert_script($next, $next + 19));
		cmp_ok(status($node)->{avoided} - $avoided, '>=', 20, "io_method = $method: durable commits skip their fsync");
		kill_everything($node);
		stop_fsync_trace($io_trace);
		my ($io_zeroed) = zero_unsynced_wal($node, $io_trace);
		cmp_ok($io_zeroed, '>', 0, "io_method = $method: the power cut zeroed WAL never really synced");
		$node->start;
		($rows, $next) = ($rows + 20, $next + 20);
		is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, "io_method = $method: every commit survives a power cut");
	}
}
$node->stop;

# 6. Negative control: the same power cut without the buffer, with
# synchronous_commit = off, loses commits (the simulation bites).
my $plain = new_dd_node('plain', conf => "delayed_durability.mode = allowed\n");
$plain->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY, payload text)');
$plain->safe_psql('postgres', "SET synchronous_commit = off;\n" . insert_script(1, 300));
my $flushed = lsn_to_int($plain->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
cmp_ok($flushed, '<', lsn_to_int($plain->safe_psql('postgres', 'SELECT wal_end()')), 'control: commits past the flush position');
kill_everything($plain);
zero_wal_after($plain, $flushed);
$plain->start;
cmp_ok($plain->safe_psql('postgres', 'SELECT count(*) FROM t'), '<', 300, 'control: the power cut loses unflushed commits');
$plain->stop;

done_testing();

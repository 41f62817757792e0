# The persistent WAL buffer through a cluster's whole life. A durable commit
# is acknowledged once its WAL is in the buffer, so data pages can reach the
# disk while their WAL is only there: every way a server starts must restore
# the buffer first. Each case makes data pages depend on WAL that only the
# buffer holds (64 MB segments, so no segment switch forces a real fsync;
# shared_buffers = 1MB, so backends write dirty pages out), kills every
# process and zeroes the WAL that strace did not see really synced (the
# power cut), then starts the server the way an HA tool would, and checks
# the rows and pg_amcheck.
use strict;
use warnings;
use Cwd ();
use Digest::MD5;
use File::Spec;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;
use WalBufferFile;
use File::Copy ();

my @cleanup;

sub copy_file
{
	my ($from, $to) = @_;
	File::Copy::copy($from, $to) or die "copy $from $to: $!";
}
END { unlink @cleanup; }

sub buffer_conf
{
	my ($path) = @_;
	push @cleanup, $path, "$path.commits";
	return qq{
delayed_durability.wal_buffer_path = '$path'
delayed_durability.wal_buffer_allow_volatile = on
delayed_durability.mode = disabled
synchronous_commit = on
shared_buffers = 1MB
restart_after_crash = on
};
}

sub new_primary
{
	my ($name, $buffer) = @_;
	my $node = new_dd_node($name, init => { allows_streaming => 1, extra => ['--wal-segsize=64'] },
		conf => buffer_conf($buffer));
	$node->safe_psql('postgres', q{
CREATE EXTENSION amcheck;
CREATE TABLE t (id int PRIMARY KEY, payload text);
});
	return $node;
}

# Durable commits: one big transaction and many small ones; returns how
# many rows were acknowledged.
sub durable_commits
{
	my ($node, $from, $n_small) = @_;
	$node->safe_psql('postgres',
		"INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series($from, $from + 9999) AS g");
	$node->safe_psql('postgres',
		join('', map { "INSERT INTO t VALUES ($_, repeat('y', 200));\n" } $from + 10000 .. $from + 9999 + $n_small));
	return 10000 + $n_small;
}

# Durable commits under strace, kill -9 of every process, and the power cut
# at what strace saw really synced. Returns the rows acknowledged.
sub commits_then_power_cut
{
	my ($node, $from) = @_;
	my $trace = start_fsync_trace($node);
	my $acked = durable_commits($node, $from, 2000);
	my $acked_end = lsn_to_int($node->safe_psql('postgres', 'SELECT wal_end()'));
	kill_everything($node);
	stop_fsync_trace($trace);
	my ($zeroed, $first_unsynced) = zero_unsynced_wal($node, $trace);
	cmp_ok($zeroed, '>', 0, $node->name . ': the power cut zeroed WAL never really synced');
	cmp_ok($first_unsynced // $acked_end, '<', $acked_end,
		$node->name . ': acknowledged commits lay past the last real WAL fsync (only the buffer had them)');
	return $acked;
}

sub amcheck_clean
{
	my ($node, $what) = @_;
	my ($rc, $out, $err) = (0, '', '');
	IPC::Run::run([ 'pg_amcheck', '--all', '-d', 'postgres', '-h', $node->host, '-p', $node->port ],
		'>', \$out, '2>', \$err) or $rc = $?;
	is($rc, 0, "$what: pg_amcheck is clean") or diag("$out$err");
}

sub buffer_in_use
{
	my ($node) = @_;
	return $node->safe_psql('postgres', 'SELECT wal_buffer_is_pmem IS NOT NULL FROM delayed_durability_status()');
}

# ---- 1. A crashed primary restarted as a standby (standby.signal), then
# promoted: what Patroni, pg_auto_failover and the runbooks do.
my $buffer = "/dev/shm/dd_life_$$.buf";
my $node = new_primary('old_primary', $buffer);
my $rows = commits_then_power_cut($node, 1);
$node->append_conf('postgresql.conf', "primary_conninfo = 'host=/nonexistent port=1'\n");
$node->set_standby_mode;
my $log_start = -s $node->logfile;
$node->start;
$node->poll_query_until('postgres', 'SELECT pg_is_in_recovery()') or die;
my $log = substr(slurp_file($node->logfile), $log_start);
like($log, qr/restored \d+ bytes of WAL .* from the persistent WAL buffer/, 'standby start: the buffer is restored first');
like($log, qr/the persistent WAL buffer "\Q$buffer\E" is not used in this run \(standby mode/, 'standby start: then left unused');
$node->poll_query_until('postgres', "SELECT count(*) = $rows FROM t") or diag('rows: ' . $node->safe_psql('postgres', 'SELECT count(*) FROM t'));
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, "standby: every acknowledged durable row ($rows)");
is(buffer_in_use($node), 'f', 'standby: the buffer is not in use');
$node->promote;
$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, 'promoted: every acknowledged durable row');
amcheck_clean($node, 'promoted');
$node->restart;
is(buffer_in_use($node), 't', 'restarted after the promotion: the buffer is in use again');
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, 'restarted: every row');

# ---- 2. Archive recovery (recovery.signal, as for point-in-time recovery).
$rows += commits_then_power_cut($node, 100001);
$node->append_conf('postgresql.conf', "restore_command = 'false'\n");
$node->set_recovery_mode;
$node->start;
$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, 'archive recovery: every acknowledged durable row');
amcheck_clean($node, 'archive recovery');
$node->restart;
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $rows, 'restarted after archive recovery: every row');

# ---- 3. pg_rewind of the old primary against a promoted standby: pg_rewind
# first finishes crash recovery in a single-user backend, which restores the
# buffer; the old primary then rejoins as a standby.
$node->backup('for_standby');
my $standby = PostgreSQL::Test::Cluster->new('new_primary');
$standby->init_from_backup($node, 'for_standby', has_streaming => 1);
$standby->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = ''\n");
# The base backup carries the primary's marker (its buffer is in use); the
# copy, started without a buffer, is not refused for it and removes it.
ok(-e $node->backup_dir . '/for_standby/delayed_durability/wal_buffer_in_use', 'base backup: the primary\'s marker is in it');
$standby->start;
ok(!-e $standby->data_dir . '/delayed_durability/wal_buffer_in_use', 'base backup: its first start removed the copied marker');
$node->wait_for_catchup($standby);
commits_then_power_cut($node, 200001);
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;
# pg_rewind reads the source's timeline from its last checkpoint.
$standby->safe_psql('postgres', "INSERT INTO t SELECT g, 'new timeline' FROM generate_series(900001, 900100) AS g; CHECKPOINT");
# pg_rewind copies the source's configuration files: keep the old primary's.
my $conf = slurp_file($node->data_dir . '/postgresql.conf');
my ($rc, $out, $err) = (0, '', '');
IPC::Run::run([ 'pg_rewind', '--progress', '--target-pgdata', $node->data_dir, '--source-server', $standby->connstr('postgres') ],
	'>', \$out, '2>', \$err) or $rc = $?;
is($rc, 0, 'pg_rewind of the old primary succeeds') or diag("$out$err");
like("$out$err", qr/executing .*postgres.* for target server to complete crash recovery|single-user/i,
	'pg_rewind finished crash recovery in single-user mode first') or diag("$out$err");
open my $conf_fh, '>', $node->data_dir . '/postgresql.conf' or die $!;
print $conf_fh $conf;
close $conf_fh;
$node->enable_streaming($standby);
# A marker that names this data directory, come back with the files
# pg_rewind copied (the source was cloned from this server while its buffer
# was in use, and its marker kept): the buffer was drained by the
# single-user recovery since. A rewound start (backup_label) ignores it:
# started without the buffer, it is not refused.
my $marker = $node->data_dir . '/delayed_durability/wal_buffer_in_use';
my @dir_stat = stat($node->data_dir) or die $!;
my $machine = -r '/etc/machine-id' ? slurp_file('/etc/machine-id') : '';
chomp $machine;
open(my $marker_fh, '>', $marker) or die $!;
print $marker_fh "buffer\t$buffer\ndata_directory\t" . Cwd::abs_path($node->data_dir)
  . "\ndevice\t$dir_stat[0]\ninode\t$dir_stat[1]\nmachine\t$machine\n";
close $marker_fh;
ok(-e $node->data_dir . '/backup_label', 'pg_rewind: the rewound data directory holds a backup_label');
$node->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = ''\n");
$node->start;
ok(!-e $marker, 'pg_rewind: the rewound server started without the buffer, the copied marker removed');
$node->stop;
$node->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$buffer'\n");
$node->start;
$standby->wait_for_catchup($node);
is($node->safe_psql('postgres', 'SELECT count(*) FROM t'), $standby->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'rewound old primary: the same rows as the new primary');
is($node->safe_psql('postgres', "SELECT count(*) FROM t WHERE payload = 'new timeline'"), '100', 'and the new timeline\'s');
amcheck_clean($node, 'rewound old primary');
$node->stop;
$standby->stop;

# ---- 4. wal_sync_method changed by reload, then a backend crash: the crash
# restart restores the buffer and runs without it (never stops the server),
# and every acknowledged commit survives a later power cut.
my $reload_buffer = "/dev/shm/dd_life_reload_$$.buf";
my $reload = new_primary('reload', $reload_buffer);
my $trace = start_fsync_trace($reload);
my $acked = durable_commits($reload, 1, 500);
$reload->append_conf('postgresql.conf', "wal_sync_method = fsync\n");
$reload->reload;
$reload->poll_query_until('postgres', "SELECT current_setting('wal_sync_method') = 'fsync'") or die;
$reload->safe_psql('postgres', "INSERT INTO t SELECT g, 'after reload' FROM generate_series(50001, 50100) AS g");
$acked += 100;
$log_start = -s $reload->logfile;
my $walwriter = $reload->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
my $postmaster = (split /\n/, slurp_file($reload->data_dir . '/postmaster.pid'))[0];
kill 'KILL', $walwriter;
ok($reload->poll_query_until('postgres', "SELECT pid <> $walwriter FROM pg_stat_activity WHERE backend_type = 'walwriter'"),
	'wal_sync_method changed by reload: a backend crash does not stop the server');
$log = substr(slurp_file($reload->logfile), $log_start);
like($log, qr/restored \d+ bytes of WAL .*not used until the next start: it requires wal_sync_method = fdatasync/s,
	'the crash restart restores the buffer, then says it is off, and why');
unlike($log, qr/FATAL:  .*(?:wal_sync_method|buffer)|database system is shut down/, 'no FATAL of the buffer, no shutdown at the crash restart');
is(buffer_in_use($reload), 'f', 'after the crash restart the buffer is not in use');
kill_everything($reload);
stop_fsync_trace($trace);
# The postmaster never writes WAL but to restore the buffer: its writes to
# pg_wal are the restore, seen from outside the server. (A crash restart
# also fsyncs the data directory, so the power cut below may find nothing
# left to cut; the restore is what the strace shows.)
my $restore_writes = () = slurp_file($trace->{file}) =~ /^$postmaster\s+pwrite64\(\d+<[^>]*\/pg_wal\/[0-9A-F]{24}>/mg;
cmp_ok($restore_writes, '>', 0, 'the crash restart wrote the buffer\'s WAL back into pg_wal (strace)');
zero_unsynced_wal($reload, $trace);
$reload->append_conf('postgresql.conf', "wal_sync_method = fdatasync\n");
$reload->start;
is($reload->safe_psql('postgres', 'SELECT count(*) FROM t'), $acked, 'every acknowledged commit survives');
amcheck_clean($reload, 'after the reload, the crash and the power cut');
is(buffer_in_use($reload), 't', 'with fdatasync again, the buffer is in use after a start');

# ---- 5. A pg_basebackup copy on the same host inherits wal_buffer_path.
$reload->safe_psql('postgres', 'CHECKPOINT');
$reload->backup('same_host');
my $copy = PostgreSQL::Test::Cluster->new('copy');
$copy->init_from_backup($reload, 'same_host', has_streaming => 1);
# The original keeps writing its own WAL through the buffer meanwhile (a
# running-transactions record, say): its header is what a copy would change.
my $owner = read_wal_buffer($reload_buffer)->{owner};
is($owner, Cwd::realpath($reload->data_dir), 'the buffer names its owner, the original\'s data directory');
ok(!$copy->start(fail_ok => 1), 'a same-host copy with the inherited buffer path does not start while the original runs');
like(slurp_file($copy->logfile), qr/FATAL:  persistent WAL buffer "\Q$reload_buffer\E" is in use by another server/,
	'the copy is refused: the buffer is in use');
unlike(slurp_file($copy->logfile), qr/restored \d+ bytes|takes it over/, 'the copy restored nothing from it');
is(read_wal_buffer($reload_buffer)->{owner}, $owner, 'the buffer still belongs to the original');
$reload->stop;
my $digest;
$digest = Digest::MD5->new->add(WalBufferFile::slurp_raw($reload_buffer))->hexdigest;
$log_start = -s $copy->logfile;
ok(!$copy->start(fail_ok => 1), 'the copy does not start on the original\'s buffer when the original is down either');
like(substr(slurp_file($copy->logfile), $log_start), qr/FATAL:  persistent WAL buffer "\Q$reload_buffer\E" belongs to another server/,
	'the copy is refused: the buffer is another data directory\'s');
is(Digest::MD5->new->add(WalBufferFile::slurp_raw($reload_buffer))->hexdigest, $digest, 'the original\'s buffer is untouched');
my $copy_buffer = "/dev/shm/dd_life_copy_$$.buf";
push @cleanup, $copy_buffer;
$copy->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$copy_buffer'\n");
$copy->start;
$copy->promote;
$copy->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die;
$copy->safe_psql('postgres', "INSERT INTO t VALUES (-1, 'copy')");
$walwriter = $copy->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
kill 'KILL', $walwriter;
$copy->poll_query_until('postgres', "SELECT pid <> $walwriter FROM pg_stat_activity WHERE backend_type = 'walwriter'") or die;
is($copy->safe_psql('postgres', "SELECT count(*) FROM t WHERE id = -1"), '1', 'the promoted copy survives a crash on its own buffer');
is(Digest::MD5->new->add(WalBufferFile::slurp_raw($reload_buffer))->hexdigest, $digest, 'the original\'s buffer is untouched by the copy');
$copy->stop;
$reload->start;
is($reload->safe_psql('postgres', 'SELECT count(*) FROM t'), $acked, 'the original starts on its own buffer');

# ---- 6. A buffer of another database system: taken over when it is empty
# (a clean stop drained it, then re-initdb or pg_upgrade kept the path),
# refused while it holds WAL.
$reload->stop;
is(read_wal_buffer($reload_buffer)->{tail}, 0, 'a clean stop leaves the buffer empty');
my $other = new_dd_node('other_system', conf => buffer_conf($reload_buffer));
like(slurp_file($other->logfile), qr/the persistent WAL buffer "\Q$reload_buffer\E" held an empty buffer of database system \d+ .*this server takes it over/,
	'an empty buffer of another database system is taken over, and the log says so');
is(buffer_in_use($other), 't', 'and used');
$other->safe_psql('postgres', 'CREATE TABLE o (i int); INSERT INTO o VALUES (1)');
kill_everything($other);
ok(!$reload->start(fail_ok => 1), 'a buffer of another database system that holds WAL is refused');
like(slurp_file($reload->logfile), qr/belongs to another database system/, 'with the reason');
$other->start;
$other->stop;
$reload->start;
is($reload->safe_psql('postgres', 'SELECT count(*) FROM t'), $acked, 'taken back once the other system drained it');
$reload->stop;

# ---- 7. A run without the buffer after it was last written (the path
# emptied, as a refusal's hint offers, or the library left out): that run's
# recovery ended where pg_wal's WAL ended and wrote its own WAL from there,
# over what only the buffer held. Restoring the buffer at a later start
# would write stale WAL over that run's: refused, pg_wal untouched, both
# when the run wrote inside the buffer's WAL (after a power cut) and past it
# (after kill -9: pg_wal had it all, but the buffer's zeroed page tail would
# still erase the run's WAL).
my $stale_buffer = "/dev/shm/dd_life_stale_$$.buf";
my $stale = new_primary('stale', $stale_buffer);
$stale->safe_psql('postgres', 'CREATE TABLE run_without (i int)');
for my $case ('kill -9', 'power cut')
{
	if ($case eq 'power cut')
	{
		commits_then_power_cut($stale, 100001);
	}
	else
	{
		durable_commits($stale, 1, 200);
		kill_everything($stale);
	}
	cmp_ok(read_wal_buffer($stale_buffer)->{tail}, '>', 0, "$case: the buffer holds WAL");
	$stale->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = ''\n");
	# The path emptied after a crash: refused while the marker says the
	# buffer was not drained; removing it, as the hint says, accepts the loss.
	my $wal_at_crash = pg_wal_digest($stale);
	my $log_at = -s $stale->logfile;
	ok(!$stale->start(fail_ok => 1), "$case: a start with the path emptied after a crash is refused");
	like(substr(slurp_file($stale->logfile), $log_at),
		qr/FATAL:  the persistent WAL buffer "\Q$stale_buffer\E" may hold WAL this data directory lacks, and delayed_durability.wal_buffer_path is empty/,
		"$case: with the reason");
	is(pg_wal_digest($stale), $wal_at_crash, "$case: refused before recovery wrote anything");
	unlink($stale->data_dir . '/delayed_durability/wal_buffer_in_use') or die $!;
	$stale->start;
	$stale->safe_psql('postgres', 'INSERT INTO run_without SELECT generate_series(1, 100)');
	$stale->stop;
	$stale->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$stale_buffer'\n");
	my $wal_before = pg_wal_digest($stale);
	my $log_from = -s $stale->logfile;
	ok(!$stale->start(fail_ok => 1), "$case: the buffer, set again after a run without it, is refused");
	like(substr(slurp_file($stale->logfile), $log_from),
		qr/persistent WAL buffer "\Q$stale_buffer\E" holds WAL this data directory has since overwritten/,
		"$case: with the reason");
	is(pg_wal_digest($stale), $wal_before, "$case: pg_wal was not modified");
	# What the hint says: move the buffer away.
	rename $stale_buffer, "$stale_buffer.old" or die $!;
	push @cleanup, "$stale_buffer.old";
	$stale->start;
	is($stale->safe_psql('postgres', 'SELECT count(*) FROM run_without'), $case eq 'kill -9' ? '100' : '200',
		"$case: moved away, the run without the buffer has all its commits");
	is(buffer_in_use($stale), 't', "$case: and a new buffer is in use");
}
$stale->stop;

# ---- 9. The buffer file lost after a crash: a persistent-memory file
# system not mounted again after a power cut (an empty directory in its
# place), the file emptied, its header zeroed, or the path pointed
# elsewhere. Each would be taken as a new buffer and recovery would end
# without the WAL only the buffer held: refused, pg_wal untouched; the file
# put back, the start restores it and every acknowledged row is there.
my $lost_buffer = "/dev/shm/dd_life_lost_$$.buf";
my $lost = new_primary('lost', $lost_buffer);
my $lost_rows = commits_then_power_cut($lost, 100001);
cmp_ok(read_wal_buffer($lost_buffer)->{tail}, '>', 0, 'lost buffer: it holds WAL after the power cut');
my $kept = "$lost_buffer.kept";
push @cleanup, $kept, "$lost_buffer.elsewhere";
copy_file($lost_buffer, $kept);
my %damage = (
	'missing' => sub { unlink $lost_buffer or die $! },
	'emptied' => sub { truncate($lost_buffer, 0) or die $! },
	'header zeroed' => sub {
		open(my $fh, '+<', $lost_buffer) or die $!;
		binmode $fh;
		print $fh "\0" x 64;
		close $fh;
	},
	'path changed' => sub {
		$lost->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$lost_buffer.elsewhere'\n");
	},
);
my %reason = (
	'missing' => qr/the persistent WAL buffer "\Q$lost_buffer\E" was lost: the file is missing/,
	'emptied' => qr/the persistent WAL buffer "\Q$lost_buffer\E" was lost: the file is empty/,
	'header zeroed' => qr/the persistent WAL buffer "\Q$lost_buffer\E" was lost: its header is zeroed/,
	'path changed' => qr/the persistent WAL buffer "\Q$lost_buffer\E" may hold WAL this data directory lacks, and delayed_durability.wal_buffer_path is now "\Q$lost_buffer.elsewhere\E"/,
);
my $wal_after_cut = pg_wal_digest($lost);
for my $case (sort keys %damage)
{
	$damage{$case}->();
	my $log_at = -s $lost->logfile;
	ok(!$lost->start(fail_ok => 1), "lost buffer, $case: refused");
	like(substr(slurp_file($lost->logfile), $log_at), $reason{$case}, "lost buffer, $case: with the reason");
	is(pg_wal_digest($lost), $wal_after_cut, "lost buffer, $case: pg_wal was not modified");
	ok(!-e "$lost_buffer.elsewhere", "lost buffer, $case: no new buffer was made") if $case eq 'path changed';
	# Put back.
	copy_file($kept, $lost_buffer);
	$lost->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$lost_buffer'\n");
}
# The file moved to another path (a file system mounted elsewhere) and the
# path set to it: restored from there.
my $moved = "$lost_buffer.moved";
push @cleanup, $moved, "$moved.commits";
rename $lost_buffer, $moved or die $!;
$lost->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = '$moved'\n");
$lost->start;
is($lost->safe_psql('postgres', 'SELECT count(*) FROM t'), $lost_rows, 'lost buffer, moved and found at its new path: every acknowledged durable row');
amcheck_clean($lost, 'lost buffer, moved');
like(slurp_file($lost->data_dir . '/delayed_durability/wal_buffer_in_use'), qr/^buffer\t\Q$moved\E$/m,
	'lost buffer, moved: the marker names the new path');
# A clean stop drains the buffer: the path may then be emptied.
$lost->stop;
ok(!-e $lost->data_dir . '/delayed_durability/wal_buffer_in_use', 'a clean stop drains the buffer and removes the marker');
$lost->append_conf('postgresql.conf', "delayed_durability.wal_buffer_path = ''\n");
$lost->start;
is($lost->safe_psql('postgres', 'SELECT count(*) FROM t'), $lost_rows, 'drained, then started without the buffer: every row');
$lost->stop;

# ---- 8. Point-in-time recovery ended by pg_promote(): only an
# end-of-recovery record is written, the first checkpoint comes later, and
# pg_control's copy of the checkpoint recovery started from has taken the
# nextXid of every checkpoint record replayed since. A crash before that
# checkpoint restores the buffer: never refused.
my $source = new_dd_node('pitr_source', init => { allows_streaming => 1, has_archiving => 1 });
# An absolute archive path (18's test framework gives a relative one, which
# the server, in its data directory, cannot use).
my $archive = File::Spec->rel2abs($source->archive_dir);
$source->append_conf('postgresql.conf', qq{archive_command = 'cp "%p" "$archive/%f"'\n});
$source->restart;
$source->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY, payload text)');
$source->backup('pitr_base');
for my $i (1 .. 3)
{
	$source->safe_psql('postgres', "INSERT INTO t SELECT g, 'source' FROM generate_series($i * 1000, $i * 1000 + 99) AS g; CHECKPOINT");
}
my $last_wal = $source->safe_psql('postgres', "SELECT pg_walfile_name(pg_create_restore_point('target'))");
$source->safe_psql('postgres', 'SELECT pg_switch_wal()');
$source->poll_query_until('postgres', "SELECT last_archived_wal >= '$last_wal' FROM pg_stat_archiver") or die 'not archived';
$source->stop;
my $pitr_buffer = "/dev/shm/dd_life_pitr_$$.buf";
my $pitr = PostgreSQL::Test::Cluster->new('pitr');
$pitr->init_from_backup($source, 'pitr_base', has_restoring => 1, standby => 0);
$pitr->append_conf('postgresql.conf', buffer_conf($pitr_buffer) . "recovery_target_name = 'target'\nrecovery_target_action = 'pause'\n"
	  . qq{restore_command = 'cp "$archive/%f" "%p"'\n});
$pitr->start;
$pitr->poll_query_until('postgres', "SELECT pg_get_wal_replay_pause_state() = 'paused'") or die 'not paused';
$pitr->safe_psql('postgres', 'SELECT pg_promote()');
$pitr->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'not promoted';
is(buffer_in_use($pitr), 't', 'point-in-time recovery ended by pg_promote(): the buffer is in use');
$pitr->safe_psql('postgres', join('', map { "INSERT INTO t VALUES ($_, 'after');\n" } 100001 .. 100200));
kill_everything($pitr);
cmp_ok(read_wal_buffer($pitr_buffer)->{tail}, '>', 0, 'killed before any checkpoint: the buffer holds WAL');
ok($pitr->start(fail_ok => 1), 'the next start restores the buffer (not refused)');
is($pitr->safe_psql('postgres', "SELECT count(*) FROM t WHERE payload = 'after'"), '200', 'and every commit acknowledged after the promotion is there');
$pitr->stop;

done_testing();

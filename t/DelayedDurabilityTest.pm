# Helpers shared by the TAP tests: a node with the extension preloaded and
# wide WAL-writer windows, and independent WAL position checks.
package DelayedDurabilityTest;

use strict;
use warnings;
use Digest::MD5;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(usleep);
use Cwd ();

# A test that dies says why only in its log file (the framework sends
# STDERR there), and CI shows only the TAP stream: repeat the reason there.
# Not inside an eval (handled there) nor while compiling.
$SIG{__DIE__} = sub {
	return if !defined $^S || $^S;
	Test::More::diag('died: ' . join('', @_));
};

# poll_query_until() writes its query to psql's standard input. A psql
# that could not connect (a server in the middle of a crash restart) may
# exit before reading it, and IPC::Run then dies of the broken pipe instead
# of the poll trying again. Tests poll through crash restarts: retry those.
{
	no warnings 'redefine';
	my $framework_poll = \&PostgreSQL::Test::Cluster::poll_query_until;
	*PostgreSQL::Test::Cluster::poll_query_until = sub {
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		for (;;)
		{
			my $result = eval { $framework_poll->(@_) };
			return $result unless $@;
			die $@ unless $@ =~ /Broken pipe/ && time < $deadline;
			usleep(100_000);
		}
	};
}

our @EXPORT = qw(new_dd_node commits_with_check count_true rows_in lsn_to_int
  kill_everything zero_wal_after settle_wal_writer pg_wal_digest power_cut
  start_fsync_trace stop_fsync_trace zero_unsynced_wal pause_wal_writer resume_wal_writer pause_wal_receiver
  xids_from_notices wal_valid_end commit_ends);

# fsync is on (the test framework turns it off by default): WAL fsyncs are
# what is measured. The WAL writer flushes at most every wal_writer_delay (10s, its maximum)
# and never because of volume (wal_writer_flush_after = 1GB); nothing else
# in the background writes dirty buffers or checkpoints. A delayed commit
# therefore stays unflushed for seconds, long enough to observe it.
sub new_dd_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opts{init} // {} });
	# shared_buffers: a streaming node gets 1MB from the test framework, and
	# a backend that must evict a dirty page flushes WAL up to it first,
	# which can flush a delayed commit under test (a test that wants
	# evictions sets it back in its own conf).
	$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'delayed_durability'
shared_buffers = 128MB
fsync = on
max_prepared_transactions = 10
wal_writer_delay = 10s
wal_writer_flush_after = 1GB
bgwriter_lru_maxpages = 0
checkpoint_timeout = 1h
autovacuum = off
} . ($opts{conf} // ''));
	$node->start;
	# A database of its own for settle_wal_writer(), whose commits must not
	# show in the counters of the databases a test checks.
	$node->safe_psql('postgres', 'CREATE DATABASE dd_settle');
	for my $db ('template1', 'postgres')
	{
		$node->safe_psql($db, q{
CREATE EXTENSION delayed_durability;
-- End of the WAL inserted so far, computed independently of the extension:
-- pg_current_wal_insert_lsn() points past the page header when the last
-- record ended exactly on a page (24-byte header) or segment (40) boundary.
CREATE FUNCTION wal_end() RETURNS pg_lsn LANGUAGE sql VOLATILE AS $$
  SELECT CASE
    WHEN (i - '0/0'::pg_lsn) % pg_size_bytes(current_setting('wal_segment_size')) = 40 THEN i - 40
    WHEN (i - '0/0'::pg_lsn) % 8192 = 24 THEN i - 24
    ELSE i END
  FROM (SELECT pg_current_wal_insert_lsn() AS i) AS s $$;
CREATE FUNCTION flushed() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT pg_current_wal_flush_lsn() >= wal_end() $$;
-- Was a commit flushed? Judged by the flush position against the insert
-- position noted just before it (CALL mark_wal()): WAL written after the
-- commit (a catalog page pruned by the next read, a hint bit's page image)
-- moves only the insert position, so flushed() right after a commit can
-- read false for a commit that was flushed.
CREATE PROCEDURE mark_wal() LANGUAGE sql AS $$
  SELECT set_config('dd_test.wal_mark', wal_end()::text, false) $$;
CREATE FUNCTION flushed_since_mark() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT pg_current_wal_flush_lsn() > current_setting('dd_test.wal_mark')::pg_lsn $$;
});
	}
	return $node;
}

# Runs one psql session in which each element of @$statements is its own
# transaction. Returns the list of booleans: was its commit flushed before
# it returned?
sub commits_with_check
{
	my ($node, $db, $setup, $statements) = @_;
	# The WAL writer is stopped meanwhile: a commit found flushed was
	# flushed by its own backend.
	my $walwriter = pause_wal_writer($node);
	# Warm the session's caches first: the first call of the SQL functions
	# reads catalog pages, and with wal_log_hints (streaming setups) setting
	# their hint bits after a checkpoint writes WAL that would land between a
	# commit and its check.
	# Flushed is judged by PostgreSQL's flush position against the insert
	# position taken just before the statement: a commit that flushed moved
	# it past that point; WAL written after the commit (a catalog page
	# pruned by the next read, a hint bit's page image) moves only the
	# insert position, so "insert position > flush position" proves nothing.
	my $script = ($setup // '') . "\nSELECT flushed();\n";
	$script .= "SELECT wal_end() AS dd_before \\gset\n$_\n"
	  . "SELECT 'flushed=' || (pg_current_wal_flush_lsn() > :'dd_before'::pg_lsn)::int;\n"
	  for @$statements;
	my $out = $node->safe_psql($db, $script);
	resume_wal_writer($walwriter);
	return map { /^flushed=1$/ ? 1 : 0 } grep { /^flushed=/ } split /\n/, $out;
}

# Makes the WAL writer flush now, so that it leaves WAL unflushed for the
# next wal_writer_delay (10s): an asynchronous commit that completes a WAL
# page wakes it (XLogSetAsyncXactLSN), and with its last flush long ago it
# flushes everything; until wal_writer_delay has passed it then flushes
# nothing more (wal_writer_flush_after = 1GB). Without this its periodic
# cycle may flush at any moment of a test that checks positions.
sub settle_wal_writer
{
	my ($node) = @_;
	my $db = 'dd_settle';
	$node->safe_psql('postgres', 'CREATE DATABASE dd_settle')
	  if $node->safe_psql('postgres', "SELECT count(*) FROM pg_database WHERE datname = '$db'") eq '0';
	my $before = $node->safe_psql($db, 'SELECT pg_current_wal_flush_lsn()');
	$node->safe_psql($db, q{
SET delayed_durability.mode = allowed;
SET synchronous_commit = off;
CREATE TABLE IF NOT EXISTS wal_writer_kick (i int);
INSERT INTO wal_writer_kick SELECT generate_series(1, 400);
});
	# It flushes up to the last completed page in that cycle, at once if
	# its last flush is wal_writer_delay old, else when it is: wait past one
	# wal_writer_delay (10 s).
	for (1 .. 300)
	{
		return if $node->safe_psql($db, "SELECT pg_current_wal_flush_lsn() > '$before'") eq 't';
		usleep(40_000);
	}
	# Without that flush the quiet window a test relies on is not known.
	die 'settle_wal_writer: the WAL writer did not flush within 12 s';
}

# The simulated power cut, from PostgreSQL's own flush position (read right
# before the kill, nothing running): every process killed at once, every WAL
# byte past that position zeroed, the server started again (crash
# recovery). Returns how many bytes were zeroed.
sub power_cut
{
	my ($node) = @_;
	my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
	kill_everything($node);
	my $zeroed = zero_wal_after($node, $flushed_at);
	$node->start;
	return $zeroed;
}

# Evidence from outside the server of what reached the disk: strace records
# every write and sync call of every server process (those running now and
# those forked later) on a WAL segment file, with the bytes written. The WAL
# buffer skips fdatasync calls and adjusts pg_stat_wal, so only this tells
# which WAL bytes were really synced, and with what content.
sub start_fsync_trace
{
	my ($node) = @_;
	my $pm = (split /\n/, slurp_file($node->data_dir . '/postmaster.pid'))[0];
	my @pids = grep { /^\d+$/ && kill(0, $_) } ($pm, split /\s+/, `pgrep -P $pm`);
	my $file = $node->basedir . "/fsync_trace." . time() . ".$$";
	# Only the WAL segment files are traced (strace -P), those there now and
	# the next 64 of the newest one's timeline: the bytes of every other
	# write (the server log, data files) would only swell the trace.
	# zero_unsynced_wal() refuses a trace that missed a segment written.
	# A write through a descriptor opened with O_DSYNC is durable with no
	# sync call: the cut would count it lost.
	my $sync_method = $node->safe_psql('postgres', 'SHOW wal_sync_method');
	die "start_fsync_trace: wal_sync_method = $sync_method makes writes durable without a sync call the trace could see"
	  if $sync_method =~ /^open_/;
	my $dir = Cwd::realpath($node->data_dir . '/pg_wal') or die "pg_wal: $!";
	opendir my $dh, $dir or die "$dir: $!";
	my @present = sort grep { /^[0-9A-F]{24}$/ } readdir $dh;
	closedir $dh;
	die "no WAL segment in $dir" unless @present;
	my $segsize = -s "$dir/$present[-1]";
	my ($tli, $log, $seg) = map { hex } $present[-1] =~ /^(.{8})(.{8})(.{8})$/;
	my %segments = map { $_ => 1 } @present;
	for (1 .. 64)
	{
		($log, $seg) = ($log + 1, 0) if ++$seg >= 2**32 / $segsize;
		$segments{ sprintf('%08X%08X%08X', $tli, $log, $seg) } = 1;
	}
	# File times come from a clock a tick behind: a margin.
	my $since = Time::HiRes::time() - 0.1;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		# Every call that can write or sync a file: a WAL write made by a call
		# the cut cannot place (write, writev) stops the judgement. -x prints
		# the bytes written in hexadecimal, -s all of them (a write is at most
		# the WAL buffers, a few MB).
		[ 'strace', '-f', '-y', '-x', '-s', 16 * 1024 * 1024,
			'-e', 'trace=pwrite64,pwritev,pwritev2,write,writev,fsync,fdatasync,sync_file_range',
			(map { ('-P', "$dir/$_") } sort keys %segments),
			'-o', $file, map { ('-p', $_) } @pids ],
		'>', \$out, '2>', \$err);
	# Attached to every process still alive (a backend that was exiting
	# may be gone: strace then says so) before anything else happens.
	my $settled = sub { (() = $err =~ /Process \d+ attached|No such process/g) >= @pids };
	for (1 .. 500)
	{
		$h->pump_nb;
		last if $settled->();
		usleep(10_000);
	}
	die "strace did not attach: $err" unless $settled->();
	die "strace cannot trace the server here (ptrace not permitted): $err" if $err =~ /Operation not permitted/;
	# A process forked between the listing and the attach would escape
	# (strace -f follows only the forks of a traced process). One that has
	# exited is no escape: once strace has seen its exit it is no longer
	# traced, and it stays a zombie until the postmaster reaps it (a backend
	# of the last query, ending as the trace starts).
	for my $pid (grep { /^\d+$/ } split /\s+/, `pgrep -P $pm`)
	{
		my $status = eval { slurp_file("/proc/$pid/status") } // next;
		my ($state) = $status =~ /^State:\s+(\S)/m;
		next if defined $state && $state =~ /^[ZX]$/;
		my ($traced_by) = $status =~ /^TracerPid:\s+(\d+)/m;
		die "start_fsync_trace: server process $pid escaped the trace (state " . ($state // '?') . ')' if !$traced_by;
	}
	return { harness => $h, file => $file, segments => \%segments, since => $since, dir => $dir, err => \$err };
}

# Stops strace. A trace it could not write whole (a full disk) stops the
# test: the cut would keep what the lost tail wrote. Not what strace says
# of a traced process (attached, detached, gone or killed while stopped:
# "ptrace(PTRACE_LISTEN, …): Input/output error").
sub stop_fsync_trace
{
	my ($trace) = @_;
	$trace->{harness}->signal('INT');
	$trace->{harness}->finish;
	my @said = grep { !/^\S*strace: (?:Process \d+ (?:attached|detached)|(?:attach: )?ptrace\(PTRACE_\w+,|Exit of unknown pid)/ && /\S/ }
	  split /\n/, ${ $trace->{err} };
	# Its own output failing (a full disk, an I/O error writing it).
	my @lost = grep { /No space left|Disk quota|Input\/output error|short write|write/i } @said;
	die "strace: " . join('; ', @lost) if @lost;
	diag("strace: $_") for @said;
}

# The bytes of a string argument as strace prints it with -x: all in
# hexadecimal when any byte is not printable (every WAL page), else C
# escapes. Checked with simple character classes only: a repeated group
# fails past 32766 repetitions in Perl, and a write is megabytes.
my %strace_escape = (n => "\n", t => "\t", r => "\r", v => "\x0b", f => "\f", '\\' => '\\', '"' => '"');
sub strace_bytes
{
	my ($text) = @_;
	# strace's escaped form never begins with \x: "\fx0" is three bytes.
	if ($text =~ /^\\x/ && $text !~ /[^\\x0-9a-f]/)
	{
		# "\xHH" n times: n backslashes, n x's, 2n digits ("abc" is printable).
		my $n = length($text) / 4;
		(my $hex = $text) =~ tr/\\x//d;
		return pack('H*', $hex)
		  if ($text =~ tr/\\//) == $n && ($text =~ tr/x//) == $n && length($hex) == 2 * $n;
	}
	$text =~ s{\\(x[0-9a-f]{2}|[0-7]{1,3}|.)}{
		my $e = $1;
		$e =~ /^x(..)$/ ? chr(hex $1)
		  : $e =~ /^[0-7]/ ? chr(oct $e)
		  : ($strace_escape{$e} // die "strace: unknown escape \\$e")
	}ge;
	return $text;
}

# The file offset and the bytes of a traced pwrite64/pwritev/pwritev2 call,
# from the text after its descriptor: pwrite64(fd, "bytes", count, offset),
# pwritev(fd, [{iov_base="bytes", iov_len=n}, ...], iovcnt, offset[, flags]).
sub strace_write
{
	my ($call, $args) = @_;
	# Hexadecimal (a simple class, any length) or a short printable string.
	my $string = qr/"([\\x0-9a-f]*|(?:[^"\\]|\\.){0,30000})"(\.\.\.)?/;
	if ($call eq 'pwrite64')
	{
		my ($text, $cut, $count, $offset) = $args =~ /^$string, (\d+), (\d+)/ or die "strace: unreadable $call: " . substr($args, 0, 200);
		my $bytes = strace_bytes($text);
		die "strace: $call bytes cut short (-s)" if $cut || length($bytes) != $count;
		return ($offset, $bytes);
	}
	my ($vector, $count, $offset) = $args =~ /^\[(.*?)\], (\d+), (\d+)/s or die "strace: unreadable $call: " . substr($args, 0, 200);
	my ($data, $seen) = ('', 0);
	while ($vector =~ /\{iov_base=$string, iov_len=(\d+)\}/g)
	{
		my ($text, $cut, $len) = ($1, $2, $3);
		my $bytes = strace_bytes($text);
		die "strace: $call bytes cut short (-s)" if $cut || length($bytes) != $len;
		$data .= $bytes;
		$seen++;
	}
	die "strace: $call shows $seen of its $count buffers" unless $seen == $count;
	return ($offset, $data);
}

# The simulated power cut, where the disk really stands: each WAL segment
# file gets back, from the first byte a write left unsynced to its end, what
# the writes a later fsync/fdatasync of that file covered had put there, in
# the order they were written, and zeros where none did. A partly filled
# page PostgreSQL synced and then rewrote with more records goes back to
# what it held at that sync: its records added later were never synced.
# The cut's horizon is the trace's start: WAL written before it counts as
# on disk, except from the first byte a traced write left unsynced on, where
# bytes no traced sync covered are zeros (a page partly synced before the
# trace and rewritten without a sync during it loses its older part too:
# harsher than a disk, never kinder). Returns how many bytes the cut changed
# and the lowest WAL position it changed (undef when none).
sub zero_unsynced_wal
{
	my ($node, $trace) = @_;
	# segment => [number, offset, bytes] of completed writes not yet
	# covered by a sync, and of those a sync covered; pid => the call it is
	# in the middle of, and for a sync the number of the last write
	# completed when it started (it covers those only, whatever other
	# syncs do meanwhile).
	my (%pending, %synced, %unfinished, %covers);
	my $written = 0;
	my $dir = $trace->{dir};
	my $wal_call = qr/^(pwrite64|pwritev2?|fsync|fdatasync|sync_file_range|writev?)\(\d+<\Q$dir\E\/([0-9A-F]{24})>(?:, )?(.*)$/s;
	# The result, after the last string of the line: "= 8192", "= -1 ENOSPC
	# (...)", "= -1 (errno N)" (a call the kill interrupted), "= ?".
	my $result_at_end = qr/\)\s+=\s+(-?\d+|\?)(?:\s[^"]*)?$/;
	open my $fh, '<', $trace->{file} or die "$trace->{file}: $!";
	while (my $line = <$fh>)
	{
		chomp $line;
		my ($pid, $rest) = $line =~ /^(\d+)\s+(.*)$/ or next;
		# Signals, exits, detaching; and a call a process was in when strace
		# attached, which it cannot name (begun before the trace: its
		# horizon).
		next if $rest =~ /^(?:\+\+\+ |--- |<detached|\?\?\?\(|<\.\.\. \?\?\? resumed>)/;
		if ($rest =~ /^(.*) <unfinished \.\.\.>$/)
		{
			$unfinished{$pid} = $1;
			my ($call, $segment) = $1 =~ $wal_call or die "strace: a call the cut cannot read: " . substr($rest, 0, 200);
			$covers{$pid} = $written if $call =~ /^f(?:data)?sync$/;
			next;
		}
		if ($rest =~ /^<\.\.\. \w+ resumed>(.*)$/)
		{
			# A call begun before strace attached: the trace's horizon.
			next unless defined $unfinished{$pid};
			$rest = $unfinished{$pid} . $1;
			delete $unfinished{$pid};
		}
		# Only WAL segment files are traced (-P): anything else unread would
		# be a write the cut misses.
		my ($call, $segment, $args) = $rest =~ $wal_call or die "strace: a call the cut cannot read: " . substr($rest, 0, 200);
		my ($result) = $args =~ $result_at_end or die "strace: no result in: " . substr($rest, 0, 200);
		undef $result if $result eq '?';
		my $covered = delete $covers{$pid} // $written;
		# A WAL write at the file position, which the trace does not show:
		# nothing can say which bytes it wrote.
		die "strace: WAL written with $call, which the simulated power cut cannot place: $rest" if $call =~ /^writev?$/;
		# sync_file_range starts writeback; it makes nothing durable.
		next if $call eq 'sync_file_range';
		if ($call =~ /^pwrite/)
		{
			# A write cut off by the kill (no result) may have reached the
			# page cache: counted whole, as not synced.
			next if defined $result && $result <= 0;
			my ($offset, $bytes) = strace_write($call, $args);
			$bytes = substr($bytes, 0, $result) if defined $result;
			push @{ $pending{$segment} }, [ ++$written, $offset, $bytes ];
		}
		elsif (defined $result && $result == 0)
		{
			my @still;
			for (@{ $pending{$segment} // [] })
			{
				if ($_->[0] <= $covered) { push @{ $synced{$segment} }, $_ } else { push @still, $_ }
			}
			$pending{$segment} = \@still;
		}
	}
	close $fh;
	# Writes interrupted by the kill.
	for my $rest (values %unfinished)
	{
		my ($call, $segment, $args) = $rest =~ $wal_call or next;
		next unless $call =~ /^pwrite/;
		my ($offset, $bytes) = strace_write($call, $args);
		push @{ $pending{$segment} }, [ ++$written, $offset, $bytes ];
	}
	# A segment the trace did not watch, written meanwhile: what reached it
	# is unknown. One written during the trace and gone since: where its
	# bytes went is unknown too.
	opendir my $dh, $dir or die $!;
	for my $segment (grep { /^[0-9A-F]{24}$/ && !$trace->{segments}{$_} } readdir $dh)
	{
		my $mtime = (Time::HiRes::stat("$dir/$segment"))[9];
		die "zero_unsynced_wal: $segment was written during the trace, which did not watch it" if $mtime >= $trace->{since};
	}
	closedir $dh;
	-f "$dir/$_" or die "zero_unsynced_wal: $_, written during the trace, is gone" for keys %pending, keys %synced;
	my ($changed, $lowest) = (0, undef);
	for my $segment (sort keys %pending)
	{
		next unless @{ $pending{$segment} };
		my ($first) = sort { $a <=> $b } map { $_->[1] } @{ $pending{$segment} };
		my $size = -s "$dir/$segment";
		next if $first >= $size;
		my $cut = "\0" x ($size - $first);
		for (@{ $synced{$segment} // [] })
		{
			my (undef, $offset, $bytes) = @$_;
			my $end = $offset + length $bytes;
			$end = $size if $end > $size;
			my $from = $offset > $first ? $offset : $first;
			next if $end <= $from;
			substr($cut, $from - $first, $end - $from) = substr($bytes, $from - $offset, $end - $from);
		}
		open my $w, '+<:raw', "$dir/$segment" or die $!;
		seek $w, $first, 0;
		my $now = '';
		read($w, $now, $size - $first) == $size - $first or die "$segment: short read";
		my $difference = $now ^ $cut;
		my $bytes = ($difference =~ tr/\0//c);
		next unless $bytes;
		$difference =~ /[^\0]/;
		my ($log, $seg) = (hex(substr($segment, 8, 8)), hex(substr($segment, 16, 8)));
		my $lsn = ($log * (2**32 / $size) + $seg) * $size + $first + $-[0];
		$lowest = $lsn if !defined $lowest || $lsn < $lowest;
		seek $w, $first, 0;
		print $w $cut;
		close $w or die $!;
		$changed += $bytes;
	}
	return ($changed, $lowest);
}

# Stops the WAL writer (SIGSTOP) so that nothing flushes WAL in the
# background while a test reads positions: a commit found flushed then was
# flushed by a backend. resume_wal_writer() before stopping the node.
sub pause_wal_writer
{
	my ($node) = @_;
	# Stopped in its sleep only: stopped while it flushes, it would keep
	# WALWriteLock, and every backend that flushes would wait for it for
	# ever.
	return pause_in_sleep($node, 'walwriter', 'WalWriterMain');
}

# The WAL receiver of a standby, stopped while it waits for WAL (stopped
# elsewhere it could hold its shared state's spinlock, which the startup
# process and the report worker read). Returns its pid, for kill 'CONT'.
sub pause_wal_receiver
{
	my ($standby) = @_;
	return pause_in_sleep($standby, 'walreceiver', 'WalReceiverMain');
}

# SIGSTOPs the server process of $backend_type while its wait event is
# $sleep. Its wait event, read live from shared memory once it is stopped,
# says where it is; anywhere else it is let go and stopped again a moment
# later.
sub pause_in_sleep
{
	my ($node, $backend_type, $sleep) = @_;
	my $pid = $node->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = '$backend_type'");
	die "no $backend_type" unless $pid =~ /^\d+$/;
	for my $attempt (1 .. 200)
	{
		kill 'STOP', $pid or die "SIGSTOP $pid: $!";
		# Stopped, not merely asked to: its state letter says so.
		my $stopped = 0;
		for (1 .. 500)
		{
			my $stat = slurp_file("/proc/$pid/stat");
			if ($stat =~ /^\d+ \(.*\) T /) { $stopped = 1; last; }
			usleep(2_000);
		}
		die "the $backend_type $pid did not stop" unless $stopped;
		my $where = eval { $node->safe_psql('postgres', "SELECT wait_event FROM pg_stat_activity WHERE pid = $pid") };
		if (!defined $where)
		{
			kill 'CONT', $pid;
			die $@;
		}
		return $pid if $where eq $sleep;
		kill 'CONT', $pid;
		usleep(20_000);
	}
	die "the $backend_type $pid was never stopped in its sleep";
}

sub resume_wal_writer
{
	my ($pid) = @_;
	kill 'CONT', $pid;
}

# The "xid=N" notices a client printed, in order.
sub xids_from_notices
{
	my ($stderr) = @_;
	return $stderr =~ /xid=(\d+)/g;
}

# The last WAL segment file of timeline $tli in the node's pg_wal: pg_waldump
# reads from a named first segment only up to a named last one.
sub last_segment
{
	my ($node, $tli) = @_;
	opendir my $dh, $node->data_dir . '/pg_wal' or die $!;
	my $prefix = sprintf('%08X', $tli);
	my ($last) = sort { $b cmp $a } grep { /^$prefix[0-9A-F]{16}$/ } readdir $dh;
	return $last;
}

# Where the valid WAL of a stopped node ends, as PostgreSQL's pg_waldump
# reads it from the last checkpoint's redo point: what crash recovery will
# replay, found without the server or the extension. Returns the position
# as an integer.
sub wal_valid_end
{
	my ($node) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_controldata', $node->data_dir ], '>', \$out, '2>', \$err) or die "pg_controldata: $err";
	my ($redo) = $out =~ /Latest checkpoint's REDO location:\s+(\S+)/ or die "no REDO location in: $out";
	my ($redo_file) = $out =~ /Latest checkpoint's REDO WAL file:\s+(\S+)/ or die "no REDO WAL file in: $out";
	my ($segsize) = $out =~ /Bytes per WAL segment:\s+(\d+)/ or die "no segment size in: $out";
	my $last = last_segment($node, hex(substr($redo_file, 0, 8)));
	($out, $err) = ('', '');
	IPC::Run::run([ 'pg_waldump', '-p', $node->data_dir . '/pg_wal', '-s', $redo, $redo_file, $last ], '>', \$out, '2>', \$err);
	# A never-written page after the last record read ("invalid magic
	# number 0000", naming that page on 16 and later, no position on 15):
	# the WAL ends where that record ends, which is before the page when a
	# record torn by it was cut short.
	my ($tot, $lsn) = ($out =~ /len \(rec\/tot\):\s+\d+\/\s*(\d+), tx:\s+\d+, lsn: ([0-9A-F]+\/[0-9A-F]+), [^\n]*\n?\z/);
	return record_end(lsn_to_int($lsn), $tot, $segsize) if defined $lsn && $err =~ /invalid magic number/;
	# "error in WAL record at A: invalid record length at B: ..." (B is where
	# the next record would start: the end of the last one), or an invalid
	# page header at a page's start ("... LSN B, offset ...").
	if ($err =~ /invalid record length at ([0-9A-F]+\/[0-9A-F]+)/ || $err =~ /LSN ([0-9A-F]+\/[0-9A-F]+), offset/
		|| $err =~ /record with incorrect prev-link [0-9A-F\/]+ at ([0-9A-F]+\/[0-9A-F]+)/
		|| $err =~ /(?:invalid|incorrect|contrecord|bad)[^\n]* at ([0-9A-F]+\/[0-9A-F]+)/)
	{
		return lsn_to_int($1);
	}
	die "pg_waldump did not say where the WAL ends: $err";
}

# The end of every commit (and PREPARE) record a stopped node's WAL files
# hold from position $from on, read by pg_waldump: xid (32-bit) => end, one
# map per kind (COMMIT, COMMIT_PREPARED, PREPARE). The end is where the next
# record starts, or the boundary before it when that start is just past a
# page header. Evidence of where each transaction's commit lies that does
# not come from the extension.
sub commit_ends
{
	my ($node, $from) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_controldata', $node->data_dir ], '>', \$out, '2>', \$err) or die "pg_controldata: $err";
	my ($segsize) = $out =~ /Bytes per WAL segment:\s+(\d+)/ or die "no segment size in: $out";
	my ($tli) = $out =~ /Latest checkpoint's TimeLineID:\s+(\d+)/ or die "no timeline in: $out";
	# The start segment is named: without it pg_waldump takes the segment
	# size from whichever file it finds first, maybe a preallocated one.
	my $segno = int($from / $segsize);
	my $per_id = 2**32 / $segsize;
	my $first = sprintf('%08X%08X%08X', $tli, int($segno / $per_id), $segno % $per_id);
	my $last = last_segment($node, $tli);
	($out, $err) = ('', '');
	IPC::Run::run([ 'pg_waldump', '-p', $node->data_dir . '/pg_wal', '-s', sprintf('%X/%X', int($from / 2**32), $from % 2**32), $first, $last ],
		'>', \$out, '2>', \$err);
	my $norm = sub {
		my ($lsn) = @_;
		return $lsn - 40 if $segsize && $lsn % $segsize == 40;
		return $lsn - 24 if $lsn % 8192 == 24;
		return $lsn;
	};
	my (%ends, $pending_kind, $pending_xid, $pending_end);
	for my $line (split /\n/, $out)
	{
		my ($tot, $tx, $lsn, $desc) =
		  $line =~ /len \(rec\/tot\):\s+\d+\/\s*(\d+), tx:\s+(\d+), lsn: ([0-9A-F]+\/[0-9A-F]+), prev [0-9A-F\/]+, desc: (\S+)/ or next;
		my $start = lsn_to_int($lsn);
		$ends{$pending_kind}{$pending_xid} = $norm->($start) if defined $pending_kind;
		undef $pending_kind;
		$pending_end = record_end($start, $tot, $segsize);
		if ($line =~ /rmgr: Transaction/ && $desc =~ /^(COMMIT|COMMIT_PREPARED|PREPARE)$/)
		{
			# COMMIT_PREPARED names the prepared transaction in its description.
			my $xid = $tx;
			($xid) = $line =~ /desc: COMMIT_PREPARED (\d+):/ if $desc eq 'COMMIT_PREPARED';
			($pending_kind, $pending_xid) = ($desc, $xid // $tx);
		}
	}
	$ends{error} = $err;
	$ends{records} = () = $out =~ /^rmgr:/mg;
	# The last record's end, from its length: pg_waldump's error names the
	# next record's start only sometimes (at a never-written page it names
	# the last good record's start on 15, the page's start on 16 and later,
	# past a record torn by it).
	$ends{$pending_kind}{$pending_xid} = $pending_end if defined $pending_kind;
	return \%ends;
}

# Where a WAL record of $tot bytes starting at $start ends, as PostgreSQL
# reserves it: MAXALIGNed, past the page headers of the pages it crosses
# (ending exactly at a page's end, it ends there).
sub record_end
{
	my ($start, $tot, $segsize) = @_;
	my $left = $tot + (8 - $tot % 8) % 8;
	my $pos = $start;
	for (;;)
	{
		my $room = 8192 - $pos % 8192;
		return $pos + $left if $left <= $room;
		$left -= $room;
		$pos += $room;
		$pos += $pos % $segsize == 0 ? 40 : 24;
	}
}

sub count_true { my $n = 0; $n += $_ for @_; return $n; }

sub rows_in
{
	my ($node, $db, $where) = @_;
	return $node->safe_psql($db, "SELECT count(*) FROM t WHERE $where");
}

sub lsn_to_int { my ($hi, $lo) = split m{/}, shift; return hex($hi) * 2**32 + hex($lo); }

# kill -9 of the postmaster and every child at once: nothing runs an exit
# path, as in a power cut.
sub kill_everything
{
	my ($node) = @_;
	my $pm = (split /\n/, slurp_file($node->data_dir . '/postmaster.pid'))[0];
	my @pids = ($pm, split /\s+/, `pgrep -P $pm`);
	@pids = grep { /^\d+$/ } @pids;
	kill 'KILL', @pids;
	for (1 .. 500)
	{
		last unless grep { kill 0, $_ } @pids;
		usleep(10_000);
	}
	# A kill -9'ed postmaster leaves its pid file; the test framework must
	# see the node as down. It also leaves its socket's lock file, which
	# stops the next start if another process got the dead postmaster's pid.
	unlink $node->data_dir . '/postmaster.pid';
	unlink $node->host . '/.s.PGSQL.' . $node->port . '.lock' if $node->host =~ m{^/};
	$node->_update_pid(0);
}

# The simulated power cut: WAL past byte position `from` never reached the
# disk. Returns how many bytes were zeroed.
sub zero_wal_after
{
	my ($node, $from) = @_;
	my $segsize;
	my $zeroed = 0;
	my $dir = $node->data_dir . '/pg_wal';
	opendir my $dh, $dir or die $!;
	for my $f (grep { /^[0-9A-F]{24}$/ } readdir $dh)
	{
		$segsize = -s "$dir/$f";
		my ($log, $seg) = (hex(substr($f, 8, 8)), hex(substr($f, 16, 8)));
		my $start = ($log * (2**32 / $segsize) + $seg) * $segsize;
		next if $start + $segsize <= $from;
		my $offset = $from > $start ? $from - $start : 0;
		open my $fh, '+<:raw', "$dir/$f" or die $!;
		seek $fh, $offset, 0;
		print $fh "\0" x ($segsize - $offset);
		close $fh;
		$zeroed += $segsize - $offset;
	}
	return $zeroed;
}

# A digest of the node's WAL segment files (names and content): equal before
# and after a refused start proves pg_wal was not touched.
sub pg_wal_digest
{
	my ($node) = @_;
	my $dir = $node->data_dir . '/pg_wal';
	my $md5 = Digest::MD5->new;
	opendir my $dh, $dir or die $!;
	for my $f (sort grep { /^[0-9A-F]{24}$/ } readdir $dh)
	{
		open my $fh, '<:raw', "$dir/$f" or die $!;
		$md5->add($f)->addfile($fh);
	}
	return $md5->hexdigest;
}

1;

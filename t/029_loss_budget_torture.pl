# The loss budget under real power cuts, judged by evidence from outside
# the extension. Clients commit only delayed transactions (no durable
# commit, no flush_log(), no sequence) in a forced database; the WAL writer
# is stopped (SIGSTOP), so only a commit that hits its budget flushes; no
# background process writes WAL (wal_level = minimal). At a random moment
# every process is killed and the WAL that strace did not see really synced
# is zeroed. Then:
#   - max_loss_bytes = 16kB: every acknowledged commit that was lost (its
#     row absent) ended at most 16 kB past the end of really synced WAL.
#     Its end is PostgreSQL's insert position read right after its COMMIT
#     returned (one client: nothing else writes WAL in between); the end of
#     the WAL that survived the cut is where pg_waldump finds it ends.
#   - max_loss_time = 200ms: the lost commits were acknowledged within
#     200 ms of each other (each client reads the clock in the INSERT, just
#     before its commit, and right after the commit returned), plus a
#     scheduling tolerance of 100 ms for the two statements around them.
#   - in both, commits were lost (the cut bites) and backends really
#     fdatasync'ed WAL (the budget flushed: strace).
#   - control, no budget: the same cuts lose more than 16 kB of WAL and
#     commits acknowledged more than 200 ms apart: the checks above can fail.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;

my $cycles = $ENV{BUDGET_TORTURE_CYCLES} // 3;
my $seed = $ENV{TORTURE_SEED} // (time() ^ $$);
srand($seed);
diag("loss budget torture: $cycles cycles per budget, seed $seed");
my $byte_budget = 16 * 1024;
my $time_budget = 0.2;
my $tolerance = 0.1;

my $node = new_dd_node('budget_torture', conf => "wal_level = minimal\nmax_wal_senders = 0\n");
$node->safe_psql('postgres', q{
CREATE DATABASE shop;
ALTER DATABASE shop SET delayed_durability.mode = 'forced';
});
$node->safe_psql('shop', 'CREATE TABLE t (client int, k int, at float8, PRIMARY KEY (client, k)); SELECT flush_log();');
my $tmp = PostgreSQL::Test::Utils::tempdir('budget');

# A client: many single-row delayed commits; after each COMMIT returned it
# prints the clock read inside the INSERT (before the commit), the clock
# and PostgreSQL's insert position right after, in one statement.
sub client_script
{
	my ($client, $cycle) = @_;
	my $s = '';
	for my $k (1 .. 30000)
	{
		my $key = $cycle * 100000 + $k;
		$s .= "INSERT INTO t VALUES ($client, $key, extract(epoch FROM clock_timestamp())) RETURNING 'in $key ' || at;\n"
		  . "SELECT 'ack $key ' || extract(epoch FROM clock_timestamp()) || ' ' || (wal_end() - '0/0'::pg_lsn);\n";
	}
	return $s;
}

my (%totals, $run_number);
my $mismatches = 0;
for my $run ([ 'bytes', "max_loss_bytes = '16kB'", 1 ], [ 'time', "max_loss_time = '200ms'", 2 ], [ 'none', '', 2 ])
{
	my ($kind, $setting, $clients) = @$run;
	$node->safe_psql('postgres', 'ALTER DATABASE shop RESET delayed_durability.max_loss_bytes; ALTER DATABASE shop RESET delayed_durability.max_loss_time');
	$node->safe_psql('postgres', "ALTER DATABASE shop SET delayed_durability.$setting") if $setting;
	my ($lost_total, $max_over, $max_span, $syncs_total) = (0, undef, 0, 0);
	$run_number++;
	for my $cycle (map { $run_number * 10 + $_ } 1 .. $cycles)
	{
		$node->safe_psql('shop', 'SELECT flush_log()');
		pause_wal_writer($node);
		my $trace = start_fsync_trace($node);
		my @runs;
		for my $c (1 .. $clients)
		{
			my $file = "$tmp/client$c.sql";
			open my $fh, '>', $file or die $!;
			print $fh client_script($c, $cycle);
			close $fh;
			push @runs, IPC::Run::start([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('shop'), '-f', $file ],
				'>', "$tmp/client$c.out", '2>', "$tmp/client$c.err");
		}
		usleep(int(400_000 + rand(1_200_000)));
		kill_everything($node);
		stop_fsync_trace($trace);
		$_->finish for @runs;
		# Real WAL syncs (the WAL writer was stopped: each was a backend's).
		my $syncs = () = slurp_file($trace->{file}) =~ /\b(?:fdatasync|fsync)\(\d+<[^>]*\/pg_wal\/[0-9A-F]{24}>\)\s+=\s+0/g;
		my ($zeroed) = zero_unsynced_wal($node, $trace);
		# What recovery will replay: the end of the valid WAL after the cut.
		my $durable_end = wal_valid_end($node);
		$node->start;
		# What each client was told, and what survived.
		my %present = map { $_ => 1 } split /\n/, $node->safe_psql('shop', "SELECT client || '/' || k FROM t");
		my @lost;
		for my $c (1 .. $clients)
		{
			my ($at, %in);
			for (split /\n/, slurp_file("$tmp/client$c.out"))
			{
				$in{$1} = $2 if /^in (\d+) (\S+)$/;
				next unless /^ack (\d+) (\S+) (\d+)$/;
				# Recovered when its commit record lies within the valid WAL
				# (the rows agree with pg_waldump), and only then when the
				# position read is its commit's end (one client).
				$mismatches++ if $3 <= $durable_end && !$present{"$c/$1"};
				$mismatches++ if $clients == 1 && $3 > $durable_end && $present{"$c/$1"};
				push @lost, { key => "$c/$1", before => $in{$1}, after => $2, end => $3 } if !$present{"$c/$1"};
			}
		}
		my $acks = () = join('', map { slurp_file("$tmp/client$_.out") } 1 .. $clients) =~ /^ack /mg;
		cmp_ok($acks, '>', 0, "$kind cycle $cycle: the clients were acknowledged ($acks commits)") if !$acks;
		$lost_total += @lost;
		$syncs_total += $syncs;
		if (@lost)
		{
			my ($last_end) = sort { $b <=> $a } map { $_->{end} } @lost;
			my $over = $last_end - $durable_end;
			$max_over = $over if !defined $max_over || $over > $max_over;
			my ($first_before) = sort { $a <=> $b } map { $_->{before} } @lost;
			my ($last_after) = sort { $b <=> $a } map { $_->{after} } @lost;
			$max_span = $last_after - $first_before if $last_after - $first_before > $max_span;
		}
		note(sprintf('%s cycle %d: %d lost, %d real WAL syncs, %d bytes zeroed, lost WAL up to %s bytes past the synced end',
				$kind, $cycle, scalar @lost, $syncs, $zeroed, $max_over // '-'));
	}
	$totals{$kind} = { lost => $lost_total, over => $max_over // 0, span => $max_span, syncs => $syncs_total };
	cmp_ok($lost_total, '>', 0, "$kind: the power cuts lost acknowledged delayed commits ($lost_total)");
}

my ($b, $t, $n) = @totals{qw(bytes time none)};
is($mismatches, 0, 'acknowledged commits are present when they end within the valid WAL pg_waldump finds, and (one client) absent when not');
cmp_ok($b->{over}, '<=', $byte_budget, "max_loss_bytes: every lost commit ended within 16 kB of the really synced WAL (at most $b->{over} bytes past it)");
cmp_ok($b->{syncs}, '>', 0, "max_loss_bytes: the budget made backends really sync WAL ($b->{syncs} syncs)");
cmp_ok($t->{span}, '<=', $time_budget + $tolerance,
	sprintf('max_loss_time: the lost commits were acknowledged within %.3f s of each other (budget 0.2 s + 0.1 s tolerance)', $t->{span}));
cmp_ok($t->{syncs}, '>', 0, "max_loss_time: the budget made backends really sync WAL ($t->{syncs} syncs)");
cmp_ok($n->{over}, '>', $byte_budget, "control without a budget: the cuts lose more than 16 kB of WAL ($n->{over} bytes)");
cmp_ok($n->{span}, '>', $time_budget + $tolerance, sprintf('control without a budget: lost commits span %.3f s', $n->{span}));

$node->stop;
done_testing();

# Crash torture: concurrent clients commit durable, delayed (allowed +
# commit_delayed(), forced, forced after a caught failing statement),
# two-phase and flush_log() work, plus
# cached_nextval() and, in the forced database, commits made durable by a
# table of class durable; at a random moment every server process is killed, and
# half of the time a power cut is simulated by zeroing every WAL byte after
# the last position known to be flushed. After restart the acknowledged work
# is checked against what the policy promises, db_forced's loss budget
# (max_loss_bytes), and the crash report of lost delayed commits. Every
# power cut is decided by strace (what really reached the disk), and every
# durable acknowledgement is checked against its own commit record, found
# by xid in the WAL files with pg_waldump: the flush position the client
# read right after COMMIT must be at or past it.
#
#   TORTURE_CYCLES=N   crash cycles (default 30; scripts/torture.sh --cycles N)
#   TORTURE_SEED=S     replay a run (the seed is printed)
#   TORTURE_WAL_BUFFER=1  with the persistent WAL buffer on /dev/shm: then a
#                      power cut zeroes WAL from the last *real* fsync (read
#                      from the buffer file), and the buffer must restore it
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;
use WalBufferFile;

my $tmp = PostgreSQL::Test::Utils::tempdir('torture');
my $cycles = $ENV{TORTURE_CYCLES} // 30;
my $seed = $ENV{TORTURE_SEED} // (time() ^ $$);
srand($seed);
diag("crash torture: $cycles cycles, seed $seed (TORTURE_SEED=$seed replays it)");

my $wal_buffer = $ENV{TORTURE_WAL_BUFFER} ? "/dev/shm/dd_torture_$$.buf" : undef;
END { unlink $wal_buffer if $wal_buffer; }
diag('with the persistent WAL buffer') if $wal_buffer;

# Default WAL writer timing: the realistic window.
my $node = new_dd_node('torture', conf => q{
wal_writer_delay = 200ms
wal_writer_flush_after = 1MB
max_wal_size = 4GB
} . ($wal_buffer ? "delayed_durability.wal_buffer_path = '$wal_buffer'\n"
	  . "delayed_durability.wal_buffer_allow_volatile = on\n" : ''));
$node->safe_psql('postgres', q{
CREATE DATABASE db_allowed;
CREATE DATABASE db_forced;
ALTER DATABASE db_allowed SET delayed_durability.mode = 'allowed';
ALTER DATABASE db_forced SET delayed_durability.mode = 'forced';
ALTER DATABASE db_forced SET delayed_durability.max_loss_bytes = '32kB';
});
my $loss_budget = 32 * 1024;
for my $db ('postgres', 'db_allowed', 'db_forced')
{
	$node->safe_psql($db, q{
CREATE TABLE IF NOT EXISTS rows_ (client int, txn int, i int, v int);
CREATE TABLE IF NOT EXISTS checks (client int, txn int, n int, total bigint, PRIMARY KEY (client, txn));
CREATE SEQUENCE IF NOT EXISTS torture_seq CACHE 20;
CREATE TABLE IF NOT EXISTS payments_ (client int, txn int);
SELECT flush_log();
});
}
$node->safe_psql('db_forced', "SELECT delayed_durability_set_table_class('payments_', 'durable')");

# One multi-row transaction with its checksum row.
sub txn_sql
{
	my ($client, $txn, $opt_in, $extra) = @_;
	my $n = 1 + int(rand(4));
	my @v = map { int(rand(1000)) } 1 .. $n;
	my $total = 0;
	$total += $_ for @v;
	my $rows = join(', ', map { "($client, $txn, $_, $v[$_ - 1])" } 1 .. $n);
	# The xid, printed before COMMIT: the harness finds the transaction's
	# own commit record in the WAL files by it.
	return "BEGIN;\n" . ($opt_in ? "SELECT 'req ' || commit_delayed();\n" : '')
	  . "INSERT INTO rows_ VALUES $rows;\nINSERT INTO checks VALUES ($client, $txn, $n, $total);\n"
	  . ($extra // '') . "SELECT 'xid ' || pg_current_xact_id();\nCOMMIT;\n";
}

# A value handed out implies its block's recovery value was flushed; the
# flush position read after the call tells the harness so.
# The commit of that transaction (delayed in db_forced) is acknowledged too:
# its receipt goes to the harness for the comparison with the crash report.
# When the call wrote its block's recovery value the transaction has an
# xid, printed before COMMIT as for every other transaction: a crash that
# cuts off the acknowledgement leaves a commit the crash report may list
# and the harness can name (a client's last transaction). When it wrote
# nothing there is no xid (an empty line) and no commit record.
# (No pg_current_xact_id(): an xid with no WAL of its own gets a commit
# PostgreSQL itself does not flush.)
my $seq_sql = "BEGIN;\nSELECT 'seq ' || cached_nextval('torture_seq') || ' ' || pg_current_wal_flush_lsn();\n"
  . "SELECT 'xid ' || pg_current_xact_id_if_assigned();\nCOMMIT;\n"
  . "SELECT 'receipt ' || last_commit_lsn() || ' ' || is_durable(last_commit_lsn());\n";

# A client's script: many transactions, each followed by an acknowledgement
# line printed only once COMMIT returned. Durable acks carry the flush
# position read right after the commit (>= its commit record, <= the real
# flush position); delayed acks carry the insert position after the commit
# (>= its commit record end), the receipt (the end of its commit record) and
# whether that was already flushed when the client heard of the commit.
sub client_script
{
	my ($cycle, $client, $db) = @_;
	my $s = '';
	for my $k (1 .. 20000)
	{
		my $txn = $cycle * 100000 + $k;
		my $dice = rand();
		if ($db eq 'postgres')
		{
			if ($dice < 0.1)
			{
				my $gid = "g_${client}_$txn";
				$s .= "BEGIN;\nINSERT INTO rows_ VALUES ($client, $txn, 1, 7);\n"
				  . "INSERT INTO checks VALUES ($client, $txn, 1, 7);\nSELECT 'xid ' || pg_current_xact_id();\nPREPARE TRANSACTION '$gid';\n"
				  . "SELECT 'ack prepared $txn ' || pg_current_wal_flush_lsn();\n"
				  . "COMMIT PREPARED '$gid';\nSELECT 'ack durable $txn ' || pg_current_wal_flush_lsn();\n";
			}
			elsif ($dice < 0.3)
			{
				$s .= $seq_sql;
			}
			else
			{
				$s .= txn_sql($client, $txn, 0) . "SELECT 'ack durable $txn ' || pg_current_wal_flush_lsn();\n";
			}
		}
		elsif ($db eq 'db_allowed')
		{
			my $delayed = $dice < 0.7;
			$s .= txn_sql($client, $txn, $delayed)
			  . ($delayed
				? "SELECT 'ack delayed $txn ' || pg_current_wal_insert_lsn() || ' ' || last_commit_lsn() || ' ' || is_durable(last_commit_lsn());\n"
				: "SELECT 'ack durable $txn ' || pg_current_wal_flush_lsn();\n");
		}
		else
		{
			if ($dice < 0.05)
			{
				$s .= "SELECT 'ack flush 0 ' || flush_log();\n";
			}
			elsif ($dice < 0.15)
			{
				$s .= $seq_sql;
			}
			elsif ($dice < 0.25)
			{
				# A write to the durable-class table makes the whole commit
				# durable, in this forced database.
				$s .= txn_sql($client, $txn, 0, "INSERT INTO payments_ VALUES ($client, $txn);\n")
				  . "SELECT 'ack durable $txn ' || pg_current_wal_flush_lsn();\n";
			}
			elsif ($dice < 0.35)
			{
				# A statement whose commit PostgreSQL would flush fails and is
				# caught before the commit: the commit stays delayed, recorded
				# and within the budget (no flag may survive the failure).
				# PL/pgSQL cannot EXECUTE COMMIT PREPARED (SPI refuses it
				# before the utility hook): that one fails at top level,
				# under a savepoint, as psql's ON_ERROR_ROLLBACK runs it.
				my $failing = (
					"DO \$\$ BEGIN EXECUTE 'DROP DATABASE IF EXISTS dd_never'; EXCEPTION WHEN others THEN NULL; END \$\$;\n",
					"DO \$\$ BEGIN EXECUTE 'CREATE DATABASE dd_never'; EXCEPTION WHEN others THEN NULL; END \$\$;\n",
					"DO \$\$ BEGIN EXECUTE 'DROP TABLESPACE IF EXISTS dd_never'; EXCEPTION WHEN others THEN NULL; END \$\$;\n",
					"SAVEPOINT caught;\n\\set ON_ERROR_STOP 0\nCOMMIT PREPARED 'dd_never';\n\\set ON_ERROR_STOP 1\nROLLBACK TO SAVEPOINT caught;\n",
				)[ int(rand(4)) ];
				$s .= txn_sql($client, $txn, 0, $failing)
				  . "SELECT 'ack delayed $txn ' || pg_current_wal_insert_lsn() || ' ' || last_commit_lsn() || ' ' || is_durable(last_commit_lsn());\n";
			}
			else
			{
				$s .= txn_sql($client, $txn, 0)
				  . "SELECT 'ack delayed $txn ' || pg_current_wal_insert_lsn() || ' ' || last_commit_lsn() || ' ' || is_durable(last_commit_lsn());\n";
			}
		}
	}
	return $s;
}

my (%durable, %delayed, %prepared, %seq_seen, %acks_of_kind);
my ($durable_lost, $delayed_lost, $delayed_total, $max_lost_distance, $bound_violations) = (0, 0, 0, 0, 0);
my $seq_dups = 0;
my ($report_mismatches, $budget_violations, $reported_total, $budget_checked) = (0, 0, 0, 0);
my $cuts_behind_acks = 0;    # power cuts that removed acknowledged WAL the buffer had to restore
my ($durable_checked, $durable_unflushed, $lost_in_power_cuts) = (0, 0, 0);
# What psql says when the server is killed under it (a backend that notices
# the postmaster's death first says so itself).
my $lost_connection = qr/server closed the connection unexpectedly|connection to server was lost|no connection to the server|terminating connection due to unexpected postmaster exit/;
my @clients = ([ 1, 'postgres' ], [ 2, 'db_allowed' ], [ 3, 'db_forced' ], [ 4, 'db_forced' ]);

for my $cycle (1 .. $cycles)
{
	# Everything before this point is flushed (checkpoint at startup or
	# the previous cycle's checks).
	my $cycle_start_flush = lsn_to_int($node->safe_psql('postgres', 'SELECT flush_log()'));
	# strace records what really reaches the disk, with or without the
	# buffer: every power cut is decided by it. It is attached before the
	# clients connect, so their backends are followed.
	my $trace = start_fsync_trace($node);
	my (@runs, %out);
	for my $c (@clients)
	{
		my ($client, $db) = @$c;
		my $script_file = "$tmp/client$client.sql";
		open my $fh, '>', $script_file or die $!;
		print $fh client_script($cycle, $client, $db);
		close $fh;
		push @runs, IPC::Run::start(
			[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-f', $script_file ],
			'>', "$tmp/client$client.out", '2>', "$tmp/client$client.err");
	}
	usleep(int(200_000 + rand(1_300_000)));
	# The first two cycles are always power cuts, so that every kind of
	# crash is checked at any cycle count, and a cut that finds everything
	# flushed (the WAL writer had just flushed) leaves another to bite.
	my $power_cut = $cycle <= 2 || rand() < 0.5;
	kill_everything($node);
	stop_fsync_trace($trace);
	# Where each transaction's own commit record lies, from the WAL files
	# (pg_waldump), before any cut.
	my $ends = commit_ends($node, $cycle_start_flush);
	$_->finish for @runs;
	$out{ $_->[0] } = slurp_file("$tmp/client$_->[0].out") for @clients;
	# Each client worked, and ended only because the server went away: a
	# client that died at its first statement, or on an error, is a failure.
	for my $i (0 .. $#clients)
	{
		my ($client, $db) = @{ $clients[$i] };
		my $err = slurp_file("$tmp/client$client.err");
		# A client that ran its whole script before the crash ended cleanly.
		next if $runs[$i]->result(0) == 0 && $err eq '';
		my @unexpected = grep {
			!/$lost_connection|This probably means the server terminated abnormally|before or while processing the request|^\s*$/
			  && !/ERROR:  COMMIT PREPARED cannot run inside a transaction block/
		} split /\n/, $err;
		is(join("\n", @unexpected), '', "cycle $cycle: client $client ($db) stderr has only the lost connection")
		  if @unexpected;
		$bound_violations++ if @unexpected;
		like($err, $lost_connection, "cycle $cycle: client $client ($db) lost its connection to the crash")
		  or $bound_violations++
		  unless $err =~ $lost_connection;
		my $acks = () = $out{$client} =~ /^(?:ack|seq) /mg;
		if ($acks < 1)
		{
			fail("cycle $cycle: client $client ($db) got no acknowledgement before the crash");
			$bound_violations++;
		}
	}

	# What the clients were told.
	# A receipt the client saw durable (is_durable) was flushed before the
	# client heard of the commit: the simulated power cut must keep it. The
	# server records no such commit for the crash report (one over its loss
	# budget flushes itself, one already flushed needs no record).
	my ($known_flushed, @cycle_delayed, %receipts, %unacked_xid, @durable_acks) = ($cycle_start_flush);
	for my $c (@clients)
	{
		my ($client, $db) = @$c;
		my $xid;
		for (split /\n/, $out{$client})
		{
			if (/^xid (\d+)$/)
			{
				$xid = $1 % 2**32;
				$unacked_xid{$client} = $xid;
				next;
			}
			# An acknowledgement for the transaction whose xid came last.
			if (/^ack (durable|prepared|delayed) (\d+) (\S+)/ && defined $xid)
			{
				push @durable_acks, [ "$db/$client/$2", $1, $xid, lsn_to_int($3) ] if $1 ne 'delayed';
				# A prepared transaction's xid stays for its COMMIT PREPARED.
				if ($1 ne 'prepared')
				{
					delete $unacked_xid{$client};
					undef $xid;
				}
			}
			$acks_of_kind{$1}++ if /^(?:ack )?(durable|prepared|delayed|flush|seq) /;
			$acks_of_kind{'durable by table'}++ if $db eq 'db_forced' && /^ack durable /;
			if (/^ack (durable|prepared) (\d+) (\S+)$/)
			{
				my $lsn = lsn_to_int($3);
				$known_flushed = $lsn if $lsn > $known_flushed;
				$durable{"$db/$client/$2"} = 1 if $1 eq 'durable';
				$prepared{"$db/$client/$2"} = 1 if $1 eq 'prepared';
			}
			elsif (/^ack flush 0 (\S+)$/)
			{
				my $lsn = lsn_to_int($1);
				$known_flushed = $lsn if $lsn > $known_flushed;
			}
			elsif (/^receipt (\S+) false$/)
			{
				# A cached_nextval() that wrote its block's recovery value
				# (flushed) committed after it, delayed in a forced database:
				# a commit the crash report may rightly list. (When the call
				# wrote nothing, the receipt is the previous commit's, known
				# already.)
				$receipts{ lsn_to_int($1) } //= "$db/$client/seq";
				delete $unacked_xid{$client};
				undef $xid;
			}
			elsif (/^ack delayed (\d+) (\S+) (\S+) (true|false)$/)
			{
				push @cycle_delayed, [ "$db/$client/$1", lsn_to_int($2), lsn_to_int($3) ];
				$receipts{ lsn_to_int($3) } = "$db/$client/$1";
				$known_flushed = lsn_to_int($3) if $4 eq 'true' && lsn_to_int($3) > $known_flushed;
			}
			elsif (/^receipt (\S+) (true|false)$/)
			{
				# In postgres the commit is durable: always flushed here.
				$receipts{ lsn_to_int($1) } //= "$db/$client/seq";
				delete $unacked_xid{$client};
				undef $xid;
				$known_flushed = lsn_to_int($1) if $2 eq 'true' && lsn_to_int($1) > $known_flushed;
			}
			elsif (/^seq (\d+) (\S+)$/)
			{
				# Each database has its own torture_seq.
				$seq_dups++ if $seq_seen{"$db/$1"}++;
				my $lsn = lsn_to_int($2);
				$known_flushed = $lsn if $lsn > $known_flushed;
			}
		}
	}
	# Every durable acknowledgement against its own commit: the flush
	# position the client read right after COMMIT (or PREPARE) returned is at
	# or past the end of that transaction's own record in the WAL files. A
	# durable commit silently delayed fails here even when another client's
	# flush later covered it.
	for my $ack (@durable_acks)
	{
		my ($k, $kind, $xid, $flushed_at) = @$ack;
		my $end = $kind eq 'prepared' ? $ends->{PREPARE}{$xid} : $ends->{COMMIT}{$xid} // $ends->{COMMIT_PREPARED}{$xid};
		$durable_checked++;
		if (!defined $end || $flushed_at < $end)
		{
			$durable_unflushed++;
			diag("pg_waldump from $cycle_start_flush read $ends->{records} records: $ends->{error}") if $durable_unflushed == 1;
			diag(sprintf("cycle %d: %s acknowledgement of %s (xid %d) read flush position %X, its record %s", $cycle, $kind, $k,
					$xid, $flushed_at, defined $end ? sprintf('ends at %X', $end) : 'is not in the WAL files'));
		}
	}
	my $zeroed = 0;
	if ($power_cut)
	{
		# Everything strace did not see really synced is gone; with the
		# buffer, the buffer must bring back what was acknowledged.
		my ($bytes, $first_unsynced) = zero_unsynced_wal($node, $trace);
		$zeroed = $bytes;
		$cuts_behind_acks++ if defined $first_unsynced && $first_unsynced < $known_flushed;
	}
	$node->start;

	# The crash report: one row per crash, exact, listing every acknowledged
	# delayed commit past the end of the recovered WAL. It may list one more
	# per client, whose acknowledgement the crash cut off before the client
	# printed it.
	$node->poll_query_until('postgres', "SELECT count(*) = $cycle FROM delayed_durability_crashes")
	  or die "cycle $cycle: no crash report";
	my ($recovered_end, $exact) = split /\|/, $node->safe_psql('postgres',
		'SELECT recovered_end_lsn, exact FROM delayed_durability_crashes ORDER BY crash_recovered_at DESC LIMIT 1');
	$recovered_end = lsn_to_int($recovered_end);
	my %reported_xid;
	my %reported = map { my ($x, $l) = split /\|/; $reported_xid{ lsn_to_int($l) } = $x % 2**32; lsn_to_int($l) => 1 }
	  split /\n/, $node->safe_psql('postgres',
		'SELECT xid, commit_lsn FROM delayed_durability_lost_commits WHERE crash_recovered_at = (SELECT max(crash_recovered_at) FROM delayed_durability_crashes)');
	$reported_total += keys %reported;
	my @unreported = grep { $_ > $recovered_end && !$reported{$_} } keys %receipts;
	# A commit the clients never heard of can only be a client's last
	# transaction, whose acknowledgement the crash cut off: at most one per
	# client, its xid the last the client printed.
	my %last_unacked = map { $unacked_xid{$_} => 1 } keys %unacked_xid;
	my @unknown_to_clients = grep { !$receipts{$_} } keys %reported;
	my @unexplained = grep { !$last_unacked{ $reported_xid{$_} } } @unknown_to_clients;
	my @wrongly_reported = grep { $_ <= $recovered_end } keys %reported;
	if ($exact ne 't' || @unreported || @wrongly_reported || @unexplained)
	{
		$report_mismatches++;
		diag("cycle $cycle: crash report exact=$exact, " . scalar(@unreported) . ' lost commits not reported, '
			  . scalar(@wrongly_reported) . ' reported but recovered, ' . scalar(@unexplained) . ' unknown to the clients and not their last transaction');
		diag(sprintf('  not reported: %s ending at %X (recovered end %X)', $receipts{$_}, $_, $recovered_end))
		  for (sort { $a <=> $b } @unreported)[ 0 .. ($#unreported < 4 ? $#unreported : 4) ];
	}

	# Atomicity: every transaction is all there or absent, checksum intact.
	my %present;
	for my $db ('postgres', 'db_allowed', 'db_forced')
	{
		my $bad = $node->safe_psql($db, q{
SELECT count(*) FROM checks c
  FULL JOIN (SELECT client, txn, count(*) AS n, sum(v) AS total FROM rows_ GROUP BY 1, 2) r USING (client, txn)
 WHERE c.n IS DISTINCT FROM r.n OR c.total IS DISTINCT FROM r.total});
		is($bad, '0', "cycle $cycle: $db transactions atomic, checksums match") if $bad ne '0';
		$bound_violations++ if $bad ne '0';
		$present{"$db/$_"} = 1 for split /\n/, $node->safe_psql($db, "SELECT client || '/' || txn FROM checks");
	}
	for my $k (keys %durable)
	{
		next if $present{$k};
		$durable_lost++;
		diag("cycle $cycle: acknowledged durable commit $k lost");
	}
	for my $d (@cycle_delayed)
	{
		my ($k, $lsn, $commit_end) = @$d;
		$delayed_total++;
		# The receipt agrees with the table: recovered if and only if its
		# commit record ends within the recovered WAL.
		if (($commit_end <= $recovered_end) != !!$present{$k})
		{
			$report_mismatches++;
			diag("cycle $cycle: delayed commit $k ending at $commit_end is " . ($present{$k} ? 'present' : 'absent')
				  . " with the recovered WAL ending at $recovered_end");
		}
		# db_forced's loss budget: when the WAL was not cut (kill -9), all
		# that was flushed at the crash was recovered, so a lost commit ends
		# at most max_loss_bytes past the end of the recovered WAL. (A
		# simulated power cut here cuts at the last flush the clients saw,
		# which may be behind the real one.)
		if (!$power_cut && !$present{$k} && $k =~ m{^db_forced/})
		{
			$budget_checked++;
			if ($commit_end - $recovered_end > $loss_budget)
			{
				$budget_violations++;
				diag("cycle $cycle: lost commit $k ends " . ($commit_end - $recovered_end) . ' bytes past the recovered WAL');
			}
		}
		next if $present{$k};
		$delayed_lost++;
		$lost_in_power_cuts++ if $power_cut;
		if ($lsn <= $known_flushed)
		{
			$bound_violations++;
			diag("cycle $cycle: delayed commit $k at $lsn lost although WAL up to $known_flushed was flushed");
		}
		$max_lost_distance = $lsn - $known_flushed if $lsn - $known_flushed > $max_lost_distance;
	}
	# Prepared transactions stay prepared or got committed.
	my %in_doubt = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', 'SELECT gid FROM pg_prepared_xacts');
	for my $k (keys %prepared)
	{
		my ($db, $client, $txn) = split m{/}, $k;
		next if $present{$k} || $in_doubt{"g_${client}_$txn"};
		$durable_lost++;
		diag("cycle $cycle: prepared transaction $k vanished");
	}
	$node->safe_psql('postgres', "COMMIT PREPARED '$_'") for keys %in_doubt;
	%prepared = ();
	# Whatever survived this crash was recovered and is durable now: it must
	# survive every later crash too, delayed commits included.
	$durable{$_} = 1 for keys %present;

	# cached_nextval after the crash never repeats a value handed out before.
	for my $db ('postgres', 'db_forced')
	{
		for (split /\n/, $node->safe_psql($db, "SELECT cached_nextval('torture_seq') FROM generate_series(1, 5)"))
		{
			$seq_dups++ if $seq_seen{"$db/$_"}++;
		}
	}
	my ($ret, $amcheck_out, $amcheck_err) = (0, '', '');
	IPC::Run::run([ 'pg_amcheck', '--all', '--install-missing', '-d', 'postgres', '-h', $node->host, '-p', $node->port ],
		'>', \$amcheck_out, '2>', \$amcheck_err) or $ret = $?;
	is($ret, 0, "cycle $cycle: pg_amcheck clean") or diag("$amcheck_out$amcheck_err") if $ret;
	$bound_violations++ if $ret;
	note(sprintf('cycle %d: %s, known flushed %X, %d delayed acks, %s', $cycle,
			$power_cut ? 'power cut' : 'kill -9', $known_flushed, scalar @cycle_delayed,
			$power_cut ? "$zeroed WAL bytes zeroed" : 'WAL intact'));
}

is($durable_lost, 0, "no acknowledged durable commit lost in $cycles crashes");
is($durable_unflushed, 0, "every durable acknowledgement read a flush position at or past its own commit record ($durable_checked checked in the WAL files)");
cmp_ok($durable_checked, '>', 100 * $cycles / 30, 'durable acknowledgements were checked against their own records');
cmp_ok($lost_in_power_cuts, '>', 0, "the power cuts lost acknowledged delayed commits ($lost_in_power_cuts): the cut bites")
  unless $wal_buffer;
is($bound_violations, 0, 'no atomicity, checksum, amcheck or flush-bound violation');
is($seq_dups, 0, 'cached_nextval never handed out a value twice (' . scalar(keys %seq_seen) . ' values)');
is($report_mismatches, 0, "the crash report matched the clients' receipts in every cycle ($reported_total lost commits reported)");
is($budget_violations, 0, "lost db_forced commits within max_loss_bytes of the recovered WAL ($budget_checked checked)");
for my $kind ('durable', 'delayed', 'prepared', 'flush', 'seq', 'durable by table')
{
	cmp_ok($acks_of_kind{$kind} // 0, '>=', $cycles, "$kind acknowledgements parsed (at least one per cycle on average)");
}
cmp_ok(scalar(keys %durable), '>', 100 * $cycles / 30, 'durable commits were acknowledged and checked');
cmp_ok($delayed_total, '>', 100 * $cycles / 30, 'delayed commits were acknowledged and checked');
diag(sprintf('crash torture result: %d cycles, durable commits lost 0 of %d; delayed commits lost %d of %d, '
		  . 'at most %d bytes of WAL past the last known flush', $cycles, scalar(keys %durable), $delayed_lost,
		$delayed_total, $max_lost_distance));

$node->stop;
cmp_ok($cuts_behind_acks, '>', 0, 'some power cuts removed acknowledged WAL that only the buffer held')
  if $wal_buffer;

done_testing();

# Receipts read on a standby after its primary crashed and came back: the
# delayed commits the crash lost never reached the standby, but the WAL the
# restarted primary writes next passes their positions. The standby has no
# crash report of its primary; it must still read them lost, not durable,
# as must the standby once promoted. Judged by the rows present, not by the
# extension's report.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $primary = new_dd_node('sr_primary', init => { allows_streaming => 1 });
$primary->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY);
SELECT flush_log();
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('sr_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;

# Delayed commits, each with its receipt and the end of its commit record.
sub commit_with_receipts
{
	my ($from, $to) = @_;
	my $out = $primary->safe_psql('postgres', join('', map {
		"INSERT INTO t VALUES ($_);\nSELECT '$_ ' || last_commit_receipt();\n"
	} $from .. $to));
	return map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $out;
}

my %receipt = commit_with_receipts(1, 5);
# A commit record of some 12 kB (3000 subtransactions, each with its xid):
# it spans pages, so its start is found further back than the page of its
# end.
my $large = $primary->safe_psql('postgres', q{DO $$ BEGIN
  FOR i IN 1 .. 3000 LOOP BEGIN INSERT INTO t VALUES (5000 + i); EXCEPTION WHEN others THEN NULL; END; END LOOP;
END $$;
SELECT last_commit_receipt();});
$primary->safe_psql('postgres', 'SELECT flush_log()');
$primary->wait_for_catchup($standby);

# ---- the WAL writer stopped: six delayed commits stay in WAL buffers
# (a WAL sender sends only flushed WAL: the standby never gets them).
my $writer = pause_wal_writer($primary);
my %unflushed = commit_with_receipts(101, 106);
my $flushed = lsn_to_int($primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
is(scalar(grep { lsn_to_int((split /:/, $_)[2]) > $flushed } values %unflushed), 6,
	'the six commits end past the primary\'s flush position');
%receipt = (%receipt, %unflushed);
kill_everything($primary);
$primary->start;

# The restarted primary writes past the lost commits' positions (durable
# commits, flushed), and the standby receives and replays that WAL.
$primary->safe_psql('postgres', q{SET delayed_durability.mode = disabled;
INSERT INTO t SELECT g FROM generate_series(1000, 1400) AS g;});
my $written = lsn_to_int($primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
cmp_ok($written, '>', lsn_to_int((split /:/, $unflushed{106})[2]), 'the primary\'s new WAL passes the lost commits\' positions');
$primary->wait_for_catchup($standby);

my %present = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT k FROM t WHERE k < 1000');
my @lost = grep { !$present{$_} } sort { $a <=> $b } keys %receipt;
is(join(',', @lost), '101,102,103,104,105,106', 'the crash lost the six commits the standby never received');

# Each receipt against the rows: durable when its row is there, lost when not.
sub wrong_statuses
{
	my ($node) = @_;
	my @wrong;
	for my $k (sort { $a <=> $b } keys %receipt)
	{
		my $status = $node->safe_psql('postgres', "SELECT status FROM receipt_status('$receipt{$k}')");
		push @wrong, "$k=$status" if $status ne ($present{$k} ? 'durable' : 'lost');
	}
	return join(',', @wrong);
}
is(wrong_statuses($primary), '', 'on the restarted primary every receipt reads durable or lost as the rows say');
is(wrong_statuses($standby), '', 'on the standby, which has no crash report of its primary, every receipt reads as the rows say');
like($standby->safe_psql('postgres', "SELECT detail FROM receipt_status('$receipt{101}')"),
	qr/holds no commit record of transaction \d+: the server that issued the receipt lost the commit in a crash/,
	'the detail says why');

is($standby->safe_psql('postgres', "SELECT count(*) FROM t WHERE k > 5000"), '3000', 'the large commit reached the standby');
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$large')"), 'durable',
	'the receipt of a commit record spanning pages reads durable on the standby');

# A receipt whose position holds a commit record of another transaction, or
# of the same transaction id at another time (ids are handed out again
# after a crash), is not that commit.
my ($system, $tli, $end, $xid, $at) = split /:/, $receipt{3};
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$system:$tli:$end:$xid:$at')"), 'durable',
	'a receipt as issued reads durable');
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$system:$tli:$end:$xid:" . ($at + 1) . "')"), 'lost',
	'the same position and transaction id at another commit time is not that commit');
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$system:$tli:$end:" . ($xid + 1) . ":$at')"), 'lost',
	'the same position with another transaction id is not that commit');

# A segment the server may not read (its permissions, as after a restore
# by another user): the receipt reads unknown, naming why, not an ERROR and
# not durable (a standby has no crash report to stand for it).
my $segment = $standby->data_dir . '/pg_wal/' . $primary->safe_psql('postgres', "SELECT pg_walfile_name('$end')");
my $segment_mode = (stat $segment)[2] & 07777;
chmod 0000, $segment or die "chmod $segment: $!";
my ($unreadable_status, $unreadable_detail) = split /\|/, $standby->safe_psql('postgres', "SELECT status, detail FROM receipt_status('$receipt{3}')");
chmod $segment_mode, $segment or die "chmod $segment: $!";
is($unreadable_status, 'unknown', 'a receipt whose segment the standby may not read reads unknown');
like($unreadable_detail, qr/Permission denied/, 'and the detail names the reason');
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$receipt{3}')"), 'durable', 'readable again, it reads durable');

# ---- the standby promoted: it has no crash report of the old primary
# either, and the lost commits' positions lie before the switch point.
$primary->stop;
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'not promoted';
is(wrong_statuses($standby), '', 'on the promoted standby every receipt still reads as the rows say');

# Its old timeline's segments removed (checkpoints past them, nothing
# keeps them): the records are gone, and a promoted standby has no crash
# report of the old primary to stand for them. No receipt may read
# durable then: a lost one would.
my $first_segment = $standby->safe_psql('postgres', "SELECT pg_walfile_name('" . (split /:/, $receipt{101})[2] . "')");
for (1 .. 3)
{
	$standby->safe_psql('postgres', 'INSERT INTO t SELECT g FROM generate_series(100000, 100100) AS g; SELECT pg_switch_wal(); CHECKPOINT;');
	$standby->safe_psql('postgres', 'DELETE FROM t WHERE k >= 100000');
}
ok(!-e $standby->data_dir . "/pg_wal/$first_segment", "the segment of the lost commits ($first_segment) is removed");
my %after_removal;
for my $k (sort { $a <=> $b } keys %receipt)
{
	my ($status, $detail) = split /\|/, $standby->safe_psql('postgres', "SELECT status, detail FROM receipt_status('$receipt{$k}')");
	$after_removal{$status}++;
	like($detail, qr/its commit record cannot be read here .*cannot tell a commit/, 'and the detail says why') if $k == 101;
}
is(join(',', map { "$_=$after_removal{$_}" } sort keys %after_removal), 'unknown=' . scalar(keys %receipt),
	'with their WAL removed, every receipt of the old timeline reads unknown on the promoted standby, none durable');

done_testing();

# A failover after the old primary's machine lost power: the record of
# acknowledged delayed commits lived in the page cache (it is not on
# persistent memory), so its last entries may be gone. The copy its next
# start saves in crash_record_directory says so, and the failover's list
# taken from it is not exact: it never claims to be the whole loss. The
# listed commits are judged against the rows the new primary has.
use strict;
use warnings;
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

# (absolute: 18's test framework gives relative paths, which the setting refuses)
my $saved_dir = File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('saved_records'));
my $primary = new_dd_node('mr_primary', init => { allows_streaming => 1 },
	conf => "delayed_durability.crash_record_directory = '$saved_dir'\n");
$primary->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY);
SELECT flush_log();
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('mr_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
# A second standby, promoted too, takes the record with its entries gone.
my $standby2 = PostgreSQL::Test::Cluster->new('mr_standby2');
$standby2->init_from_backup($primary, 'b', has_streaming => 1);
$standby2->start;
# Flushed: the standby's catch-up is judged by the primary's write position.
$primary->safe_psql('postgres', 'INSERT INTO t VALUES (1), (2); SELECT flush_log()');
for my $s ($standby, $standby2)
{
	$primary->wait_for_catchup($s);
	is($s->safe_psql('postgres', 'SELECT count(*) FROM t'), '2', 'the standby has the first two rows');
	# Cut off: the six delayed commits below reach only the primary.
	$s->safe_psql('postgres', "ALTER SYSTEM SET primary_conninfo = ''; SELECT pg_reload_conf()");
	$s->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'walreceiver'")
	  or die 'the WAL receiver did not stop';
}
my %receipt = map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $primary->safe_psql('postgres',
	join('', map { "INSERT INTO t VALUES ($_);\nSELECT '$_ ' || last_commit_receipt();\n" } 101 .. 106));
is(scalar(keys %receipt), 6, 'six delayed commits acknowledged with their receipts');

# A machine loses power: every server process dies, and the page cache
# the record lived in is gone. The record's header carries the boot id of
# the machine that wrote it, which is what a restart changes.
sub power_cut_of
{
	my ($node) = @_;
	kill_everything($node);
	my $record = $node->data_dir . '/delayed_durability/commits';
	open my $fh, '+<:raw', $record or die "$record: $!";
	seek $fh, 32, 0;
	print $fh 'another-boot-' . ('0' x 27);
	close $fh or die $!;
}

# First the second standby's machine: a standby's record is always empty,
# and stands for no failover: its next start saves nothing (saved, it would
# take the place of the old primary's record at its own promotion).
power_cut_of($standby2);
$standby2->start;
ok(!$standby2->log_contains(qr/the record of the crashed run .* is saved/), 'a standby\'s empty record is not saved after its machine restarted');

power_cut_of($primary);

for my $s ($standby, $standby2)
{
	$s->promote;
	$s->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'not promoted';
	$s->poll_query_until('postgres', 'SELECT count(*) = 1 FROM delayed_durability_failovers') or die 'no failover row';
}

# The old primary's machine comes back; its start saves the record, marked.
$primary->start;
$primary->stop;
ok($primary->log_contains(qr/the record of the crashed run \(\d+ entries\) is saved in "[^"]+", marked as not surviving the operating-system restart/),
	'the start after the machine restart saves the record, marked as not surviving it');
opendir my $dh, $saved_dir or die $!;
my @saved = grep { /^delayed_durability-\d+-p\d+-\d+-\d+-tl1\.commits(\.reported)?$/ } readdir $dh;
closedir $dh;
is(scalar @saved, 1, 'one saved record') or diag(join ', ', @saved);

my %present = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT k FROM t');
my @lost_keys = grep { !$present{$_} } sort { $a <=> $b } keys %receipt;
is(join(',', @lost_keys), '101,102,103,104,105,106', 'the six commits the standby never received are not on the new primary');

is($standby->safe_psql('postgres', "SELECT delayed_durability_import_failover_record('$saved_dir/$saved[0]')"), '6',
	'the saved record is imported: it still lists the six');
my @listed = split /\n/, $standby->safe_psql('postgres',
	"SELECT xid || ' ' || commit_lsn FROM delayed_durability_lost_commits WHERE lost_in = 'failover' ORDER BY commit_lsn");
my @expected = map { my @f = split /:/, $receipt{$_}; "$f[3] $f[2]" } @lost_keys;
is_deeply(\@listed, \@expected, 'the listed ones are absent from the new primary, by xid and commit position');
my ($lost, $exact, $detail) = split /\|/, $standby->safe_psql('postgres', 'SELECT lost_commits, exact, detail FROM delayed_durability_failovers');
is("$lost $exact", '6 f', 'the failover row is not exact: the record may have lost its last entries with the machine');
like($detail, qr/^6 listed; not exact: the old primary's record did not survive the restart of its machine/, 'and its detail says why');

# The same record with every entry gone with the page cache (zeroed: never
# written): no proof of a record older than the failover. Taken on the
# second promoted standby: nothing listed, not exact, the reason said.
open my $in, '<:raw', "$saved_dir/$saved[0]" or die $!;
my $bytes = do { local $/; <$in> };
close $in;
my $capacity = unpack('V', substr($bytes, 12, 4));
my $entries_at = length($bytes) - 64 * $capacity;
my $emptied = File::Spec->rel2abs($standby2->basedir . '/emptied');
open my $out, '>:raw', $emptied or die $!;
print $out substr($bytes, 0, $entries_at) . ("\0" x (64 * $capacity));
close $out or die $!;
is($standby2->safe_psql('postgres', "SELECT delayed_durability_import_failover_record('$emptied')"), '0',
	'a marked record whose entries are all gone is taken: nothing listed');
like($standby2->safe_psql('postgres', 'SELECT lost_commits || \'|\' || exact || \'|\' || detail FROM delayed_durability_failovers'),
	qr/^0\|false\|0 listed; not exact: the old primary's record did not survive the restart of its machine/,
	'and the failover row stays not exact, saying why');

done_testing();

# The simulated power cut (zero_unsynced_wal) is the evidence every crash
# test judges durability by, so it is checked itself, on the case that
# matters: a WAL page a durable commit synced partly filled, then rewritten
# with delayed commits and never synced again. The disk holds that page as
# it was at the sync; a cut that kept the rewrite would let records no
# fsync covered survive, and a durable commit acknowledged without its
# fsync would pass unseen.
use strict;
use warnings;
use Cwd ();
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

# The cut read from canned traces, in the forms strace prints: what it
# keeps is what a sync covered, however calls interleave.
{
	my $dir = Cwd::realpath(PostgreSQL::Test::Utils::tempdir('canned_wal'));
	my $segment = '000000010000000000000001';
	my $path = "$dir/$segment";
	my $hex = sub { join '', map { sprintf '\\x%02x', ord } split //, $_[0] };
	my $write = sub { my ($pid, $fd, $bytes, $offset) = @_; qq{$pid pwrite64($fd<$path>, "} . $hex->($bytes) . qq{", } . length($bytes) . qq{, $offset} };
	# Writes every traced write to the file as the page cache would hold it,
	# cuts, and returns the file.
	my $cut = sub {
		my (@lines) = @_;
		open my $f, '>:raw', $path or die $!;
		print $f "\0" x 16384;
		for (@lines)
		{
			next unless /pwrite64\(\d+<[^>]*>, "([^"]*)", \d+, (\d+)/;
			my ($h, $at) = ($1, $2);
			$h =~ s/\\x//g;
			seek $f, $at, 0;
			print $f pack('H*', $h);
		}
		close $f;
		open my $t, '>', "$dir/trace" or die $!;
		print $t "$_\n" for @lines;
		close $t;
		zero_unsynced_wal(undef, { file => "$dir/trace", dir => $dir, segments => { $segment => 1 }, since => 9e9 });
		return slurp_file($path);
	};
	my $file = $cut->(
		$write->(100, 3, 'W1', 0) . ') = 2',
		"100 fdatasync(3<$path> <unfinished ...>",
		$write->(200, 4, 'W2', 100) . ') = 2',
		"200 fdatasync(4<$path>) = 0",
		$write->(200, 4, 'W3', 200) . ') = 2',
		'100 <... fdatasync resumed>) = 0');
	ok(substr($file, 0, 2) eq 'W1' && substr($file, 100, 2) eq 'W2' && substr($file, 200, 2) eq "\0\0",
		'overlapping syncs: a write made after both began is not kept by the one that ends last');
	$file = $cut->(
		$write->(100, 3, "AB\0\0", 0) . ') = 4',
		"100 fdatasync(3<$path>) = 0",
		$write->(100, 3, 'ABCD', 0) . ') = 4');
	is(substr($file, 0, 4), "AB\0\0", 'a page synced partly filled, then rewritten: back to its content at the sync');
	$file = $cut->(
		$write->(100, 3, 'W1', 0) . ') = 2',
		"100 fdatasync(3<$path>) = 0",
		$write->(100, 3, 'W2', 100) . ' <unfinished ...>',
		$write->(200, 4, 'W3', 200) . ') = 1',
		"200 fdatasync(4<$path>) = 0",
		'100 +++ killed by SIGKILL +++');
	ok(substr($file, 0, 2) eq 'W1' && substr($file, 100, 2) eq "\0\0" && substr($file, 200, 2) eq "W\0",
		'a write the kill cut off is not kept; of a short write only what it wrote is');
	$file = $cut->(
		qq|100 pwritev(3<$path>, [{iov_base="| . $hex->('P1') . qq|", iov_len=2}, {iov_base="| . $hex->('P2') . qq|", iov_len=2}], 2, 300) = 4|,
		"100 fdatasync(3<$path>) = 0",
		$write->(100, 3, 'Z', 250) . ') = 1');
	ok(substr($file, 250, 1) eq "\0" && substr($file, 300, 4) eq 'P1P2', 'a vector write a sync covered is put back from its bytes');
	ok(!eval { $cut->("100 pwrite64(3<$path>, \"\\x57\\x31\"..., 8192, 0) = 8192"); 1 } && $@ =~ /cut short/,
		'bytes strace cut short stop the cut');
	ok(!eval { $cut->("100 pwrite64(3</elsewhere/$segment>, \"\\x57\", 1, 0) = 1"); 1 } && $@ =~ /cannot read/,
		'a call on a path the cut does not expect stops it');
}

# Small WAL buffers: a backend inserting WAL writes the oldest completed
# pages itself to make room, without syncing them. The WAL writer is
# stopped, so nothing else writes or syncs WAL.
my $node = new_dd_node('cut_model', conf => "delayed_durability.mode = allowed\nwal_buffers = 64kB\n");
$node->safe_psql('postgres', 'CREATE TABLE t (id int PRIMARY KEY, kind text)');
my $flush_lsn = sub { lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()')) };

my $walwriter = pause_wal_writer($node);
my $trace = start_fsync_trace($node);
my $before = lsn_to_int($node->safe_psql('postgres', 'SELECT wal_end()'));
# A durable commit: its backend writes its page, partly filled, and syncs
# it. Another one when that leaves too little room on the page for delayed
# commits.
my ($durable_end, $page_end, $durable) = (0, 0, 0);
while ($durable_end % 8192 == 0 || $page_end - $durable_end < 1024)
{
	$node->safe_psql('postgres', "INSERT INTO t VALUES (-$durable, 'durable')");
	$durable++;
	$durable_end = $flush_lsn->();
	$page_end = (int($durable_end / 8192) + 1) * 8192;
}
cmp_ok($durable_end, '>', $before, 'the durable commit was synced by its backend');
# Small delayed commits, well past the WAL buffers: the page of the durable
# commit, completed, is written again to make room, and not synced.
$node->safe_psql('postgres', "SET synchronous_commit = off;\n"
	  . join("\n", map { "INSERT INTO t VALUES ($_, 'delayed');" } 1 .. 1000));
my $written = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_lsn()'));
cmp_ok($written, '>=', $page_end, 'the page of the durable commit was written again, with delayed commits');
is($flush_lsn->(), $durable_end, 'nothing synced past the durable commit');
kill_everything($node);
stop_fsync_trace($trace);

# Before the cut, the file holds delayed commits on that page: the page
# cache kept what the backend wrote.
my $ends = commit_ends($node, $before);
my @on_page = grep { $_ > $durable_end && $_ <= $page_end } values %{ $ends->{COMMIT} };
cmp_ok(scalar @on_page, '>=', 1, 'delayed commits lie, written, on the page the durable commit synced (' . scalar(@on_page) . ')');

my ($changed, $lowest) = zero_unsynced_wal($node, $trace);
cmp_ok($changed, '>', 0, 'the cut changed WAL');
ok(defined $lowest && $lowest >= $durable_end && $lowest < $page_end,
	'the cut begins on the rewritten page, right after what its sync covered');
# Independent of the extension and of the cut's own figures: the records
# pg_waldump reads, and the rows.
my $after = commit_ends($node, $before);
is(scalar(grep { $_ > $durable_end } values %{ $after->{COMMIT} }), 0, 'no commit record past the sync is left');
$node->start;
is($node->safe_psql('postgres', "SELECT count(*) FROM t WHERE kind = 'durable'"), $durable, 'the durable commit survives the cut');
is($node->safe_psql('postgres', "SELECT count(*) FROM t WHERE kind = 'delayed'"), '0', 'no delayed commit survives: none was synced');
$node->stop;
done_testing();

# README.md's figures come from the committed results files: every figures
# block regenerated from pgbench/results/*/results.json must match the
# README, and no ratio in the prose of the performance and reproduction
# sections may stand outside those tables. A stale figure fails here.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

my $work = $ENV{REPO_WORK} or plan skip_all => 'REPO_WORK not set (run through scripts/test.sh)';
my ($stdout, $stderr);
my $ok = IPC::Run::run([ '/usr/bin/python3', "$work/pgbench/readme_figures.py", '--check', "$work/README.md" ],
	'>', \$stdout, '2>', \$stderr);
ok($ok, 'README figures match the committed results') or diag("$stdout\n$stderr");
my ($blocks) = $stdout =~ /readme_figures: (\d+) blocks/;
cmp_ok($blocks // 0, '>=', 8, 'every figures table is generated (overhead, sequences, table classes, highlights, WAL buffer, versions, loss budget, growth)');

# The check itself must be able to fail: a README with one figure changed.
my $copy = "$work/README.changed.md";
my $text = slurp_file("$work/README.md");
my $changed = $text =~ s/(<!-- figures: highlights [^>]*-->\n(?:.*\n){2}\|[^|]*\| )(\d)/$1 . ($2 + 1) % 10/er;
isnt($changed, $text, 'a figure could be changed in the copy');
open my $fh, '>', $copy or die;
print $fh $changed;
close $fh;
$ok = IPC::Run::run([ '/usr/bin/python3', "$work/pgbench/readme_figures.py", '--check', $copy ],
	'>', \$stdout, '2>', \$stderr);
ok(!$ok, 'a changed figure fails the check');
like($stdout, qr/block 'highlights .*' differs from its results/, 'the failing block is named');

# A ratio in the prose that no table backs fails too.
my $prose = $text =~ s/(## Performance\n)/$1\nThis is 9.99x faster.\n/r;
open $fh, '>', $copy or die;
print $fh $prose;
close $fh;
$ok = IPC::Run::run([ '/usr/bin/python3', "$work/pgbench/readme_figures.py", '--check', $copy ],
	'>', \$stdout, '2>', \$stderr);
ok(!$ok, 'an unbacked prose ratio fails the check');
like($stdout, qr/prose ratio 9\.99x/, 'the unbacked ratio is named');
unlink $copy;

done_testing();

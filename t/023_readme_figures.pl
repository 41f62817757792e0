# The manual's figures come from the committed results files: every figures
# block of README.md and docs/benchmarks.md regenerated from
# pgbench/results/*/results.json must match, and no ratio in the prose of
# the performance and reproduction sections (wherever they are) may stand
# outside those tables. A stale figure fails here.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

my $work = $ENV{REPO_WORK} or plan skip_all => 'REPO_WORK not set (run through scripts/test.sh)';
my $script = "$work/pgbench/readme_figures.py";

sub check
{
	my @files = @_;
	my ($stdout, $stderr);
	my $ok = IPC::Run::run([ '/usr/bin/python3', $script, '--check', @files ], '>', \$stdout, '2>', \$stderr);
	return ($ok, "$stdout$stderr");
}

sub write_copy
{
	my ($path, $text) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
	return $path;
}

# Without arguments the script checks README.md and docs/benchmarks.md.
ok(-f "$work/$_", "$_ is in the work directory") for ('README.md', 'docs/benchmarks.md');
my ($ok, $out) = check();
ok($ok, 'the figures of README.md and docs/benchmarks.md match the committed results') or diag($out);
like($out, qr/^readme_figures: README\.md: \d+ blocks$/m, 'README.md is checked');
like($out, qr/^readme_figures: docs\/benchmarks\.md: \d+ blocks$/m, 'docs/benchmarks.md is checked');
my ($blocks) = $out =~ /^readme_figures: (\d+) blocks/m;
cmp_ok($blocks // 0, '>=', 8,
	'every figures table is generated (overhead, sequences, table classes, highlights, WAL buffer, versions, loss budget, growth)');

# The check itself must be able to fail: docs/benchmarks.md with one figure changed.
my $bench = slurp_file("$work/docs/benchmarks.md");
my $changed = $bench =~ s/(<!-- figures: highlights [^>]*-->\n(?:.*\n){2}\|[^|]*\| )(\d)/$1 . ($2 + 1) % 10/er;
isnt($changed, $bench, 'a figure could be changed in the copy');
my $copy = write_copy("$work/docs/benchmarks.changed.md", $changed);
($ok, $out) = check($copy);
ok(!$ok, 'a changed figure fails the check');
like($out, qr/block 'highlights .*' differs from its results/, 'the failing block is named');

# A ratio in the prose that no table backs fails too.
my $prose = $bench =~ s/(## Performance\n)/$1\nThis is 9.99x faster.\n/r;
isnt($prose, $bench, 'a ratio could be added to the copy\'s Performance section');
write_copy($copy, $prose);
($ok, $out) = check($copy);
ok(!$ok, 'an unbacked prose ratio fails the check');
like($out, qr/prose ratio 9\.99x/, 'the unbacked ratio is named');
unlink $copy;

# README.md is held to the same rules: a stale block, or a performance
# section with a ratio no table of it backs, fails there too.
my $readme = slurp_file("$work/README.md");
my $readme_copy = write_copy("$work/README.changed.md",
	$readme . "\n<!-- figures: highlights pgbench/results/full -->\n| stale |\n<!-- /figures -->\n");
($ok, $out) = check($readme_copy);
ok(!$ok, 'a stale block in README fails the check');
like($out, qr/block 'highlights .*' differs from its results/, 'the README block is named');
write_copy($readme_copy, $readme . "\n## Performance\n\nThis is 9.99x faster.\n");
($ok, $out) = check($readme_copy);
ok(!$ok, 'an unbacked ratio in a performance section of README fails the check');
like($out, qr/prose ratio 9\.99x/, 'the unbacked ratio in README is named');
unlink $readme_copy;

done_testing();

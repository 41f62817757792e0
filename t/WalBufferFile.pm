# An independent reader (and forger) of the persistent WAL buffer file,
# written from the format documented in docs/internals.md, not from the extension's
# code: the tests use it to find the last real WAL fsync position and to
# build damaged or foreign buffers.
package WalBufferFile;

use strict;
use warnings;
use Exporter 'import';

our @EXPORT = qw(read_wal_buffer write_at crc32c header_crc_fix record_crc_fix);

use constant HEADER_SIZE => 4096;

my @table = map {
	my $c = $_;
	$c = ($c & 1) ? (($c >> 1) ^ 0x82F63B78) : ($c >> 1) for 1 .. 8;
	$c
} 0 .. 255;

# CRC-32C (Castagnoli).
sub crc32c
{
	my ($data) = @_;
	my $c = 0xFFFFFFFF;
	$c = $table[ ($c ^ $_) & 0xFF ] ^ ($c >> 8) for unpack('C*', $data);
	return $c ^ 0xFFFFFFFF;
}

sub slurp_raw
{
	my ($path) = @_;
	open my $fh, '<:raw', $path or die "$path: $!";
	local $/;
	my $b = <$fh>;
	close $fh;
	return $b;
}

# Header fields and the committed records (offset in the file, lsn, tli, length).
sub read_wal_buffer
{
	my ($path) = @_;
	my $b = slurp_raw($path);
	my %h;
	@h{qw(magic version segment_size system_id capacity header_crc tail synced_lsn synced_tli)} =
	  unpack('a8 V V Q< Q< V x4 Q< Q< V', substr($b, 0, 60));
	# The owner: the data directory of the server that formatted the buffer.
	my ($owner_len, $owner_crc) = unpack('V V', substr($b, 64, 8));
	$h{owner} = $owner_len ? substr($b, 128, $owner_len) : undef;
	$h{owner_ok} = !$owner_len || crc32c($h{owner}) == $owner_crc;
	$h{records} = [];
	my $off = 0;
	while ($off < $h{tail})
	{
		my ($lsn, $len, $tli, $crc, $zeros) = unpack('Q< V V V V', substr($b, HEADER_SIZE + $off, 24));
		push @{ $h{records} }, { offset => HEADER_SIZE + $off, lsn => $lsn, len => $len, tli => $tli, zeros => $zeros };
		$off += 24 + int(($len + 7) / 8) * 8;
	}
	return \%h;
}

sub write_at
{
	my ($path, $offset, $bytes) = @_;
	open my $fh, '+<:raw', $path or die "$path: $!";
	seek $fh, $offset, 0;
	print $fh $bytes;
	close $fh;
}

# Recomputes the header checksum after a forged change of its fixed fields.
sub header_crc_fix
{
	my ($path) = @_;
	my $b = slurp_raw($path);
	write_at($path, 32, pack('V', crc32c(substr($b, 0, 32))));
}

# Recomputes a record's checksum after a forged change.
sub record_crc_fix
{
	my ($path, $record) = @_;
	my $b = slurp_raw($path);
	my $o = $record->{offset};
	my $crc = crc32c(substr($b, $o, 16) . substr($b, $o + 20, 4) . substr($b, $o + 24, $record->{len}));
	write_at($path, $o + 16, pack('V', $crc));
}

1;

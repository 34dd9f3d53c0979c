# 006_numeric.pl — a model whose forward pass produces a NaN.
#
# The node serves a copy of the fixture whose embedding row of <audio|>
# (id 22) is NaN.  The output head shares that table, so every logits row
# holds a NaN at 22, an id the generation config suppresses (-inf before
# the choice): only a prompt holding <audio|> itself (allow_control_tokens)
# gets NaN logits.  The KV cache is bf16, which keeps the NaN keys and
# values of that position NaN for the positions after it (the default
# turboquant_k8v4 codes clamp a NaN to a finite value).
#   - gemma_generate on such a prompt fails with XX000, the engine's message,
#     a detail and a hint; a clean prompt is answered;
#   - a table job over rows with and without it: those rows go to
#     gemma_job_errors with XX000 (not retried), the others get
#     gemma_generate's answers, and the job is done;
#   - nothing is left in flight or in the KV pool.
use strict;
use warnings;

use File::Copy qw(copy);
use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;

my $NAN_ID = 22;

# Copy the model directory $from to $to with the embedding row $id NaN.
sub nan_model_copy
{
	my ($from, $to, $id) = @_;

	mkdir $to or die "mkdir $to: $!";
	opendir(my $dh, $from) or die "$from: $!";
	foreach my $f (grep { -f "$from/$_" } readdir $dh)
	{
		copy("$from/$f", "$to/$f") or die "copy $f: $!";
	}
	closedir $dh;
	open(my $fh, '+<:raw', "$to/model.safetensors") or die "model.safetensors: $!";
	read($fh, my $len, 8) == 8 or die 'short safetensors header';
	my $hlen = unpack('Q<', $len);
	read($fh, my $header, $hlen) == $hlen or die 'short safetensors header';
	my $t = decode_json($header)->{'model.language_model.embed_tokens.weight'}
	  or die 'no embedding table';
	die "embedding of dtype $t->{dtype}" unless $t->{dtype} eq 'BF16';
	my $dim = $t->{shape}[1];
	seek($fh, 8 + $hlen + $t->{data_offsets}[0] + $id * $dim * 2, 0) or die "seek: $!";
	print $fh pack('v', 0x7FC0) x $dim;	# bf16 quiet NaNs
	close($fh) or die "close: $!";
}

my $model = PostgreSQL::Test::Utils::tempdir() . '/nan-model';
nan_model_copy($ENV{G4_MODEL_DIR}, $model, $NAN_ID);

my $node = G4Test::new_node('numeric', "max_worker_processes = 16\ngemma4.kv_cache_dtype = bf16\n", $model);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model is ready');

# ---- one request ---------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION try_generate(p text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  s text; m text; d text; h text;
BEGIN
  RETURN 'ok: ' || gemma_generate(p, max_tokens => 4, allow_control_tokens => true);
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL,
                          h = PG_EXCEPTION_HINT;
  RETURN concat_ws(' | ', s, m, d, h);
END $$});
like(
	$node->safe_psql('postgres', q{SELECT try_generate('Say <audio|> twice')}),
	qr/^XX000 \| the model produced a non-finite value: NaN in the logits choosing output token 1 \| .*NaN.*not the request's input.* \| Check the model files/,
	'a NaN in the logits: XX000 with the message, a detail and a hint');
like($node->safe_psql('postgres', q{SELECT try_generate('Say hello twice')}),
	qr/^ok: ./, 'a clean prompt is answered');

# ---- a table job ------------------------------------------------------------------
$node->safe_psql(
	'postgres', q{
CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL, answer text);
INSERT INTO notes SELECT i, CASE WHEN i % 3 = 2 THEN 'note ' || i || ' <audio|>' ELSE 'note ' || i END
  FROM generate_series(1, 9) i;
});
my $opts = q{'{"max_tokens": 4, "allow_control_tokens": true}'};
my $job = $node->safe_psql('postgres', "SELECT gemma_job_create('notes', 'answer', 'body', options => $opts)");
ok($node->poll_query_until('postgres', "SELECT state <> 'running' FROM gemma_jobs WHERE job = $job"),
	'the job ends');
is($node->safe_psql('postgres', "SELECT state, rows_done, rows_failed FROM gemma_jobs WHERE job = $job"),
	'done|6|3', 'the job is done: 6 rows answered, 3 failed');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(row_key || ':' || sqlstate || ':' || (message LIKE 'the model produced a non-finite value%'), ',' ORDER BY row_key::int) "
		  . "FROM gemma_job_errors WHERE job_id = $job"),
	'2:XX000:true,5:XX000:true,8:XX000:true',
	'the rows holding <audio|> failed with XX000 and the engine\'s message');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM notes WHERE id % 3 <> 2 "
		  . "AND answer = gemma_generate(body, max_tokens => 4, allow_control_tokens => true)"),
	'6', 'the other rows hold what gemma_generate gives them');
ok(G4Test::wait_idle($node), 'nothing in flight, the KV pool empty');

$node->stop;
done_testing();

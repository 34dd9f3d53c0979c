# 005_speculative.pl — speculative decoding through SQL.
#
# A server with the fixture's MTP assistant (gemma4.draft_model_dir) drafts
# and verifies: greedy answers equal those with drafting turned off (per
# call, per gemma_chat option and per session), seeded sampled answers
# repeat, and gemma_stats reports the drafting.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin";
use G4Test;
use PostgreSQL::Test::Utils;
use Test::More;

my $draft = $ENV{G4_DRAFT_DIR};
plan skip_all => 'no assistant model (G4_DRAFT_DIR; run-pg-tests.sh makes one)'
  unless $draft && -f "$draft/config.json";

my $node = G4Test::new_node('speculative', "gemma4.draft_model_dir = '$draft'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gemma4');
is($node->safe_psql('postgres', 'SELECT gemma_wait_ready(60000)'), 't', 'the model and its assistant are ready');
is($node->safe_psql('postgres', 'SELECT spec_tokens FROM gemma_stats'), '4', 'k is num_speculative_tokens');

sub drafted
{
	return $node->safe_psql('postgres', 'SELECT spec_drafted FROM gemma_stats');
}

# greedy: the same answers with and without drafting
for my $prompt ('The capital of France is', 'Databases store rows in pages', 'def fib(n):')
{
	my $before = drafted();
	my $with = $node->safe_psql('postgres', "SELECT gemma_complete('$prompt', max_tokens => 48)");
	cmp_ok(drafted(), '>', $before, "'$prompt': drafted");
	$before = drafted();
	my $without =
	  $node->safe_psql('postgres', "SELECT gemma_complete('$prompt', max_tokens => 48, speculative => false)");
	is(drafted(), $before, "'$prompt': nothing drafted with speculative => false");
	is($with, $without, "'$prompt': the same answer with and without drafting");
}

# several sessions at once, drafting, against the answers alone
my @sql = map { "SELECT gemma_generate('Tell me about item $_', max_tokens => 32)" } 0 .. 5;
my @alone = map { $node->safe_psql('postgres', $_ =~ s/32\)/32, speculative => false)/r) } @sql;
my @sessions = map { $node->background_psql('postgres') } @sql;
G4Test::start_query($sessions[$_], $sql[$_]) for 0 .. $#sql;
for my $i (0 .. $#sql)
{
	my ($out, $err) = G4Test::finish_query($sessions[$i]);
	is($out, $alone[$i], "concurrent session $i: the answer without drafting");
	$sessions[$i]->quit;
}

# the session switch and the gemma_chat option
my $before = drafted();
my $chat = q{SELECT gemma_chat('[{"role": "user", "content": "Hello"}]', '{"max_tokens": 24, "speculative": false}')->>'content'};
my $chat_plain = $node->safe_psql('postgres', $chat);
is(drafted(), $before, 'gemma_chat with "speculative": false drafts nothing');
$node->safe_psql('postgres', "SET gemma4.speculative = off; SELECT gemma_generate('Hello', max_tokens => 24)");
is(drafted(), $before, 'gemma4.speculative = off drafts nothing');
is($node->safe_psql('postgres', $chat =~ s/false/true/r), $chat_plain, 'gemma_chat: the same answer drafting');

# seeded sampling with drafting repeats
my $sampled = "SELECT gemma_complete('Once upon a time', max_tokens => 32, temperature => 0.8, seed => 42)";
is($node->safe_psql('postgres', $sampled), $node->safe_psql('postgres', $sampled), 'a seeded sampled answer repeats');

my ($acc, $len, $pos) = split /\|/, $node->safe_psql('postgres',
	'SELECT spec_acceptance IS NOT NULL, spec_mean_accepted_length >= 1, array_length(spec_position_acceptance, 1) BETWEEN 1 AND 4 FROM gemma_stats');
is("$acc$len$pos", 'ttt', 'gemma_stats reports acceptance, mean accepted length and per-position acceptance');

G4Test::wait_idle($node);
$node->stop;
done_testing();

# G4Test.pm — helpers shared by the gemma4 TAP suites.
package G4Test;

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Spec;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The settings every test instance shares (test/pg/instance.conf), found
# when the module loads, before any test changes directory.
my $instance_conf = File::Spec->rel2abs(dirname(__FILE__) . '/../instance.conf');

# A node serving the tiny fixture model on the CPU backend.  Extra
# postgresql.conf lines may be passed, and another model directory.
sub new_node
{
	my ($name, $extra, $model) = @_;
	$model //= $ENV{G4_MODEL_DIR} or die "G4_MODEL_DIR is not set";
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init(extra => [ '--encoding=UTF8', '--no-locale' ]);
	$node->append_conf('postgresql.conf', slurp_file($instance_conf));
	$node->append_conf(
		'postgresql.conf', qq{
gemma4.model_dir = '$model'
max_connections = 60
log_statement = none
} . ($extra // ''));
	return $node;
}

# Wait until no request is in flight and the KV pool is empty (the
# framework's timeout, 180 s by default); when it never happens, show
# what is left.
sub wait_idle
{
	my ($node) = @_;

	return 1
	  if $node->poll_query_until(
		'postgres', q{
SELECT NOT EXISTS (SELECT FROM gemma_requests)
   AND (SELECT sum(blocks_used) FROM gemma_kv_pool) = 0
   AND (SELECT max(sequences_live) FROM gemma_kv_pool) = 0
   AND (SELECT requests_active FROM gemma_stats) = 0});
	foreach my $view ('gemma_requests', 'gemma_kv_pool', 'gemma_stats')
	{
		diag("$view:\n"
			  . $node->safe_psql('postgres', "SELECT * FROM $view", extra_params => ['--expanded']));
	}
	return 0;
}

# Send a query to a background psql session without waiting for it.
sub start_query
{
	my ($session, $sql) = @_;

	$session->{timeout}->start();
	$session->{stdin} .= "$sql;\n\\echo '__G4_DONE__'\n\\warn '__G4_DONE__'\n";
	$session->{run}->pump_nb();
}

# Wait for the query sent by start_query; returns (stdout, stderr).
sub finish_query
{
	my ($session) = @_;
	my $done = qr/__G4_DONE__\r?\n/;

	$session->{run}->pump()
	  until ($session->{stdout} =~ $done && $session->{stderr} =~ $done)
	  || $session->{timeout}->is_expired;
	die "query timed out" if $session->{timeout}->is_expired;
	my ($out, $err) = ($session->{stdout}, $session->{stderr});
	$out =~ s/\r?\n?__G4_DONE__\r?\n//;
	$err =~ s/\r?\n?__G4_DONE__\r?\n//;
	$session->{stdout} = '';
	$session->{stderr} = '';
	return ($out, $err);
}

# Dynamic shared memory segments a process has mapped.
sub dsm_mappings
{
	my ($pid) = @_;
	my $maps = slurp_file("/proc/$pid/maps");

	return scalar(() = $maps =~ m{/dev/shm/PostgreSQL\.}g);
}

1;

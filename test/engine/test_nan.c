/*
 * test_nan.c — a forward pass that produces a NaN fails only the sequences
 * whose logits hold it, with G4_ERR_NUMERIC, instead of emitting a token:
 * in a batch (in every KV dtype), in a verify step of speculative
 * decoding, and in scoring, and their blocks leave the prefix cache; a
 * NaN in the assistant's logits only ends the drafts.  The scenarios
 * (nan_cases.c) on the CPU backend; test/gpu/test_gpu_nan.c runs them on
 * the CUDA backend.
 */
#include "harness.h"
#include "nan_cases.h"
#include "test.h"

G4_TEST(nan_logits_fail_only_their_sequence)
{
	H_NEED_FIXTURE(model);
	nan_case_batch(model, G4_BACKEND_CPU);
}

G4_TEST(nan_blocks_leave_the_prefix_cache)
{
	H_NEED_FIXTURE(model);
	nan_case_prefix(model, G4_BACKEND_CPU);
}

G4_TEST(nan_logits_fail_a_verify_step)
{
	H_NEED_FIXTURE(model);
	nan_case_verify(model, G4_BACKEND_CPU);
}

G4_TEST(nan_draft_logits_end_the_drafts)
{
	H_NEED_FIXTURE(model);
	nan_case_drafts(model, G4_BACKEND_CPU);
}

G4_TEST(nan_logits_fail_scoring)
{
	H_NEED_FIXTURE(model);
	nan_case_score(model, G4_BACKEND_CPU);
}

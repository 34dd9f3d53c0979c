/*
 * test_gpu_nan.c — the scenarios of test/engine/nan_cases.c on the CUDA
 * backend: tokens chosen by the device sampler (G4_SAMPLE_NAN for a NaN
 * row), greedy verify steps on device ids, and draft rounds whose device
 * argmax gives G4_SAMPLE_NAN to the next pass's embed_concat (step graphs
 * recorded and replayed).
 */
#include "harness.h"
#include "nan_cases.h"
#include "test.h"

#define NEED_GPU_MODEL() \
	const char *model = h_fixture_model(); \
	if (!g4_backend_cuda_available()) G4_SKIP("no CUDA device"); \
	if (!model) G4_SKIP("G4_FIXTURE_MODEL not set")

G4_TEST(gpu_nan_logits_fail_only_their_sequence)
{
	NEED_GPU_MODEL();
	nan_case_batch(model, G4_BACKEND_CUDA);
}

G4_TEST(gpu_nan_blocks_leave_the_prefix_cache)
{
	NEED_GPU_MODEL();
	nan_case_prefix(model, G4_BACKEND_CUDA);
}

G4_TEST(gpu_nan_logits_fail_a_verify_step)
{
	NEED_GPU_MODEL();
	nan_case_verify(model, G4_BACKEND_CUDA);
}

G4_TEST(gpu_nan_draft_logits_end_the_drafts)
{
	NEED_GPU_MODEL();
	nan_case_drafts(model, G4_BACKEND_CUDA);
}

G4_TEST(gpu_nan_logits_fail_scoring)
{
	NEED_GPU_MODEL();
	nan_case_score(model, G4_BACKEND_CUDA);
}

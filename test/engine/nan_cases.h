/*
 * nan_cases.h — a forward pass that produces a NaN, on a given backend:
 * the scenarios test_nan.c runs on the CPU and test/gpu/test_gpu_nan.c on
 * the CUDA backend, where tokens are chosen on the device.
 *
 * The NaN comes from a copy of the fixture (in the test's tmp dir) whose
 * embedding row of <audio|> (NAN_CASE_ID) is NaN.  The embedding is tied
 * to the output head, so every logits row gets a NaN at that id too; it is
 * one of the ids the generation config suppresses, so that NaN is
 * overwritten with -inf before the choice, and only a sequence whose prompt
 * holds the id (its hidden states NaN from there on, through the KV pool:
 * a quantised slot holding a NaN stores a NaN scale) has NaN rows.  The same copy of the assistant makes every draft
 * pass's row NaN.
 *
 * Each scenario reports its failures through the test harness and returns.
 */
#ifndef G4_NAN_CASES_H
#define G4_NAN_CASES_H

#define NAN_CASE_ID 22

/* In one batch, the golden prompt and two holding the NaN id (greedy,
 * sampled), in each KV dtype: the two fail at their first token with
 * G4_ERR_NUMERIC, having emitted nothing; the golden prompt finishes (with
 * transformers' greedy tokens in the f32 pool); the pool holds no block
 * afterwards. */
void		nan_case_batch(const char *model, int backend);

/* The prefix cache offers no block of a sequence that met a NaN, not even
 * one it took from the cache: the repeat of a prompt holding the NaN id
 * takes nothing from it, where the repeat of a clean prompt does. */
void		nan_case_prefix(const char *model, int backend);

/* A verify step whose rows after an accepted draft hold a NaN fails the
 * sequence at the first of them, greedy and sampled (the draft, the NaN
 * id, is accepted by force: bench_force_accept). */
void		nan_case_verify(const char *model, int backend);

/* An assistant whose every row is NaN drafts nothing, and the target's
 * output is untouched: transformers' greedy tokens, no failure. */
void		nan_case_drafts(const char *model, int backend);

/* Scoring hands out no row holding a NaN: with the NaN copy (every row
 * holds one, at the suppressed id: scoring suppresses nothing) it fails at
 * the first row asked for, naming its position; the pool is empty
 * afterwards and the engine serves the golden prompt. */
void		nan_case_score(const char *model, int backend);

#endif

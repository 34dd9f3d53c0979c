/*
 * matmul_input.cu — a matmul's activations as bf16 [n][Kp] (zero past K),
 * what the tensor-core matmuls read (the warpgroup-MMA kernel's tensor
 * copies, the mma.sync gemm, cuBLASLt).
 *
 * The kernels that make a matmul's input (rmsnorm, add_rmsnorm's next
 * norm, GEGLU, the kernels that finish attention) write this bf16 copy
 * beside their float32 output when given a buffer (g4c_act_bf16_offer):
 * the matmul that follows them then needs no conversion kernel, one
 * dependent kernel fewer in the decode step's chain before each of a
 * layer's four matmuls (the first three: decode B=16 2,491 -> 2,558
 * tok/s, B=64 6,038 -> 6,262; attention's copy within the runs' spread;
 * RESULTS.md, runs 80-86).  The copy stands for its float32 source only
 * until the next write that may touch an activation (c->writes), so a
 * matmul takes it only straight after its producer; anywhere else it
 * converts.  Both ways give the same bytes: the same rounding
 * (g4_f32_to_bf16) of the same floats.
 */
#include "matmul.cuh"

__global__ void
to_bf16_kernel(const float *x, int n, int K, int Kp, uint16_t *xb)
{
	size_t		total = (size_t) n * (size_t) Kp;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t) gridDim.x * blockDim.x)
	{
		size_t		r = i / (size_t) Kp;
		int			k = (int) (i - r * (size_t) Kp);

		xb[i] = k < K ? g4_f32_to_bf16(x[r * (size_t) K + (size_t) k]) : 0;
	}
}

static int
to_bf16(g4_cuda *c, const float *x, int n, int K, int Kp, uint16_t *xb)
{
	return g4c_launch(c, "matmul (to bf16)", to_bf16_kernel, dim3(g4c_stride_grid(c, (size_t) n * (size_t) Kp, 32)),
					  dim3(256), 0, x, n, K, Kp, xb);
}

uint16_t *
g4c_act_bf16_offer_in(g4_cuda *c, const float *y, int n, int K, uint16_t *room)
{
	c->act_bf16_of = NULL;
	/* K a multiple of 64: the copy is already the padded [n][Kp] layout */
	if (n <= 0 || K % 64 != 0 || !room)
		return NULL;
	c->act_bf16_of = y;
	c->act_bf16_at = room;
	c->act_bf16_n = n;
	c->act_bf16_K = K;
	c->act_bf16_write = c->writes + 1;	/* the producer's launch, next */
	return room;
}

uint16_t *
g4c_act_bf16_offer(g4_cuda *c, const float *y, int n, int K)
{
	if ((size_t) n * (size_t) K * 2 > G4C_ACT_BF16_BYTES)
	{
		c->act_bf16_of = NULL;
		return NULL;
	}
	return g4c_act_bf16_offer_in(c, y, n, K, (uint16_t *) c->act_bf16);
}

/* The producer's copy of x [n][K] when nothing was written since it, else
 * NULL.  Taken once: the matmul's own launches end it anyway. */
static const uint16_t *
act_bf16_take(g4_cuda *c, const float *x, int n, int K)
{
	int			ok = c->act_bf16_of == x && c->writes == c->act_bf16_write && n <= c->act_bf16_n &&
		K == c->act_bf16_K;

	c->act_bf16_of = NULL;
	return ok ? (const uint16_t *) c->act_bf16_at : NULL;
}

const uint16_t *
g4c_matmul_input(g4_cuda *c, const float *x, int n, int K, int Kp, size_t extra, void **extra_at)
{
	const uint16_t *copy = act_bf16_take(c, x, n, K);
	size_t		xb_bytes = copy ? 0 : ((size_t) n * (size_t) Kp * 2 + 255) & ~(size_t) 255;
	unsigned char *scratch = NULL;

	if (xb_bytes + extra > 0)
	{
		scratch = (unsigned char *) g4c_scratch(c, xb_bytes + extra);
		if (!scratch)
			return NULL;
	}
	if (extra_at)
		*extra_at = extra > 0 ? scratch + xb_bytes : NULL;
	if (copy)
		return copy;
	if (to_bf16(c, x, n, K, Kp, (uint16_t *) scratch) != G4_OK)
		return NULL;
	return (const uint16_t *) scratch;
}

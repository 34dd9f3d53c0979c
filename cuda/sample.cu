/*
 * sample.cu — choosing the next token on the device, so only token ids cross
 * to the host.
 *
 * One block per logits row makes g4_sample's choice (sampler.c; the order and
 * arithmetic are stated with g4_row_sampling in backend.h) without sorting:
 *  - greedy: the first largest logit, the suppressed ids excluded;
 *  - else e = exp((logit - max) / T) is written over the row, and the kept
 *    set is always a prefix of the sampling order (larger e first, smaller id
 *    on ties), held as its boundary: the last kept (e, id).  min-p sets the
 *    first boundary; top-k and top-p each move it to the first element at
 *    which a running sum in that order reaches a target (a count of k, a
 *    weight of top_p of the kept weight).  That element is found by a radix
 *    search over the bits of e (positive floats order as their bit patterns):
 *    four passes of 8-bit histograms narrow down its value, one pass in id
 *    order picks it among equal values.
 *  - the draw walks the kept ids in id order: one pass of per-thread sums
 *    over contiguous id ranges, a block scan, and a walk of the one range in
 *    which the running weight exceeds u times the kept weight.
 * Weights are e · 2^40 truncated to 64-bit integers, as on the host: every
 * sum is exact whatever the order the threads add in, so the same logits and
 * draw give the same token on every run, and the host's token where the two
 * backends' exp agree.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)

/* ---- greedy choice ------------------------------------------------------------ */

/* (v, i) beats (bv, bi): larger, or equal with the smaller index; NaN never */
__device__ __forceinline__ bool
beats(float v, int i, float bv, int bi)
{
	return v > bv || (v == bv && (bi < 0 || i < bi));
}

/* The warp's best (bv, bi), in every lane. */
__device__ __forceinline__ void
warp_argmax(float &bv, int &bi)
{
	for (int o = 16; o > 0; o >>= 1)
	{
		float		ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int			oi = __shfl_xor_sync(0xffffffffu, bi, o);

		if (oi >= 0 && beats(ov, oi, bv, bi))
		{
			bv = ov;
			bi = oi;
		}
	}
}

/* The host loop's argmax of row[0..vocab): the first largest, a NaN first
 * element never replaced.  Returned in every thread. */
__device__ int
block_argmax(const float *row, int vocab)
{
	__shared__ float sv[SAMPLE_WARPS];
	__shared__ int si[SAMPLE_WARPS];
	__shared__ int best;
	float		bv = -INFINITY;
	int			bi = -1;
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;

	for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS)
	{
		float		v = row[i];

		if (beats(v, i, bv, bi))
		{
			bv = v;
			bi = i;
		}
	}
	warp_argmax(bv, bi);
	if (lane == 0)
	{
		sv[w] = bv;
		si[w] = bi;
	}
	__syncthreads();
	if (w == 0)
	{
		bv = sv[lane];
		bi = si[lane];
		warp_argmax(bv, bi);
		if (lane == 0)
			best = (isnan(row[0]) || bi < 0) ? 0 : bi;
	}
	__syncthreads();
	return best;
}

/* ---- block scans and sums ------------------------------------------------------ */

/* Exclusive prefix sum of one value per thread, in thread order; *total gets
 * the sum.  Every thread of the block must call it. */
__device__ uint64_t
block_exclusive_scan(uint64_t v, uint64_t *total)
{
	__shared__ uint64_t warp_sums[SAMPLE_WARPS];
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;
	uint64_t	incl = v;

	for (int o = 1; o < 32; o <<= 1)
	{
		uint64_t	up = __shfl_up_sync(0xffffffffu, incl, o);

		if (lane >= o)
			incl += up;
	}
	if (lane == 31)
		warp_sums[w] = incl;
	__syncthreads();
	if (w == 0)
	{
		uint64_t	s = warp_sums[lane];

		for (int o = 1; o < 32; o <<= 1)
		{
			uint64_t	up = __shfl_up_sync(0xffffffffu, s, o);

			if (lane >= o)
				s += up;
		}
		warp_sums[lane] = s;	/* inclusive over warps */
	}
	__syncthreads();
	*total = warp_sums[SAMPLE_WARPS - 1];
	v = incl - v + (w > 0 ? warp_sums[w - 1] : 0);
	__syncthreads();			/* warp_sums is reused by the next call */
	return v;
}

/* ---- the sampling order and its weights ----------------------------------------- */

__device__ __forceinline__ uint64_t
fixed_weight(uint32_t key)
{
	return __float2ull_rz(__uint_as_float(key) * G4_SAMPLE_FIXED_ONE);
}

/* The kept set: every (key, id) at or before the boundary (bkey, bid). */
struct kept_set
{
	uint32_t	bkey;
	int			bid;
};

__device__ __forceinline__ bool
kept(const kept_set &s, uint32_t key, int id)
{
	return key > s.bkey || (key == s.bkey && id <= s.bid);
}

/* A running sum reaches the target (>= for the filters, > for the draw). */
__device__ __forceinline__ bool
reaches(uint64_t sum, double target, bool strict)
{
	return strict ? (double) sum > target : (double) sum >= target;
}

/* This thread's contiguous range of ids, for the passes in id order. */
__device__ __forceinline__ void
id_range(int vocab, int *lo, int *hi)
{
	int			chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;

	*lo = min(vocab, (int) threadIdx.x * chunk);
	*hi = min(vocab, *lo + chunk);
}

/* Histogram adds through a two-entry cache of (bin, sum) in registers: the
 * early passes put most elements into a few bins, which would otherwise
 * serialise on the same shared-memory words (a 64-bit shared atomic add is a
 * compare-and-swap loop).  For the same reason every pair of warps adds into
 * its own copy of the histogram; the copies are summed before the scan. */
#define HIST_COPIES 16
struct bin_cache
{
	int			b0,
				b1;
	uint64_t	w0,
				w1;
};

__device__ __forceinline__ void
cache_add(bin_cache &c, uint64_t *hist, int bin, uint64_t w)
{
	if (bin == c.b0)
		c.w0 += w;
	else if (bin == c.b1)
		c.w1 += w;
	else
	{
		if (c.b1 >= 0)
			atomicAdd((unsigned long long *) &hist[c.b1], (unsigned long long) c.w1);
		c.b1 = c.b0;
		c.w1 = c.w0;
		c.b0 = bin;
		c.w0 = w;
	}
}

__device__ __forceinline__ void
cache_flush(bin_cache &c, uint64_t *hist)
{
	if (c.b0 >= 0)
		atomicAdd((unsigned long long *) &hist[c.b0], (unsigned long long) c.w0);
	if (c.b1 >= 0)
		atomicAdd((unsigned long long *) &hist[c.b1], (unsigned long long) c.w1);
}

/*
 * Move the boundary of `s` to the first kept element, in the sampling order,
 * at which the running sum of weights (1 per element when `count`) reaches
 * `param` (count) or `param` times the kept weight.  The set is unchanged when
 * the whole set does not reach it.  Called by every thread.
 */
__device__ void
narrow(const float *row, int vocab, kept_set &s, bool count, double param)
{
	__shared__ uint64_t copies[HIST_COPIES][256];
	__shared__ uint64_t hist[256];
	__shared__ uint32_t prefix;
	__shared__ uint64_t acc;	/* weight of the kept elements before the prefix's range */
	__shared__ double target;
	__shared__ bool unchanged;
	kept_set	cur = s;

	if (threadIdx.x == 0)
	{
		prefix = 0;
		acc = 0;
		unchanged = false;
	}
	for (int shift = 24; shift >= 0; shift -= 8)
	{
		bin_cache	c = {-1, -1, 0, 0};
		uint32_t	high_mask = shift == 24 ? 0u : ~0u << (shift + 8);
		uint64_t   *mine = copies[(threadIdx.x >> 5) % HIST_COPIES];

		for (int b = threadIdx.x; b < HIST_COPIES * 256; b += SAMPLE_THREADS)
			copies[b / 256][b % 256] = 0;
		__syncthreads();
		for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS)
		{
			uint32_t	key = __float_as_uint(row[i]);

			if (kept(cur, key, i) && (key & high_mask) == (prefix & high_mask))
				cache_add(c, mine, (int) ((key >> shift) & 255u), count ? 1 : fixed_weight(key));
		}
		cache_flush(c, mine);
		__syncthreads();
		for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS)
		{
			uint64_t	sum = 0;

			for (int k = 0; k < HIST_COPIES; k++)
				sum += copies[k][b];
			hist[b] = sum;
		}
		__syncthreads();
		if (threadIdx.x == 0)
		{
			int			b;

			if (shift == 24)
			{
				uint64_t	total = 0;

				for (b = 0; b < 256; b++)
					total += hist[b];
				target = count ? param : param * (double) total;
				unchanged = !reaches(total, target, false);
			}
			for (b = 255; b > 0 && !unchanged; b--)
			{
				if (reaches(acc + hist[b], target, false))
					break;
				acc += hist[b];
			}
			prefix |= (uint32_t) b << shift;
		}
		__syncthreads();
		if (unchanged)
			return;
	}

	/* among the kept elements of value `prefix`, in id order, the first at
	 * which the sum reaches the target: all weigh the same */
	{
		__shared__ int found;
		uint32_t	key = prefix;
		uint64_t	w = count ? 1 : fixed_weight(key);
		uint64_t	n = 0,
					before,
					ties;
		int			lo,
					hi;

		if (threadIdx.x == 0)
			found = -1;
		id_range(vocab, &lo, &hi);
		for (int i = lo; i < hi; i++)
			n += __float_as_uint(row[i]) == key && kept(cur, key, i);
		before = block_exclusive_scan(n, &ties);
		if (n > 0 && reaches(acc + (before + n) * w, target, false) && !reaches(acc + before * w, target, false))
		{
			for (int i = lo; i < hi; i++)
				if (__float_as_uint(row[i]) == key && kept(cur, key, i) &&
					reaches(acc + ++before * w, target, false))
				{
					found = i;
					break;
				}
		}
		__syncthreads();
		if (found >= 0)			/* always, by construction: the last pass's bin reached */
		{
			s.bkey = key;
			s.bid = found;
		}
		__syncthreads();
	}
}

/* The draw: the first kept id, in id order, at which the running weight
 * exceeds u times the kept weight (the last kept id if rounding leaves it
 * unreached).  Returned in every thread. */
__device__ int
draw(const float *row, int vocab, const kept_set &s, double u)
{
	__shared__ int chosen;
	uint64_t	sum = 0,
				before,
				total;
	int			last = -1;
	int			lo,
				hi;

	if (threadIdx.x == 0)
		chosen = -1;
	id_range(vocab, &lo, &hi);
	for (int i = lo; i < hi; i++)
	{
		uint32_t	key = __float_as_uint(row[i]);

		if (kept(s, key, i))
		{
			sum += fixed_weight(key);
			last = i;
		}
	}
	before = block_exclusive_scan(sum, &total);
	{
		double		target = u * (double) total;

		if (reaches(before + sum, target, true) && !reaches(before, target, true))
		{
			for (int i = lo; i < hi; i++)
			{
				uint32_t	key = __float_as_uint(row[i]);

				if (kept(s, key, i))
				{
					before += fixed_weight(key);
					if (reaches(before, target, true))
					{
						chosen = i;
						break;
					}
				}
			}
		}
	}
	__syncthreads();
	if (chosen < 0)
	{
		/* unreached: the largest kept id */
		__shared__ int largest;

		if (threadIdx.x == 0)
			largest = -1;
		__syncthreads();
		if (last >= 0)
			atomicMax(&largest, last);
		__syncthreads();
		return largest;
	}
	return chosen;
}

/* ---- the kernel ------------------------------------------------------------------ */

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(float *logits, int vocab, const int32_t *suppress, int n_suppress, const g4_row_sampling *rows,
			  int32_t *ids)
{
	float	   *row = logits + (size_t) blockIdx.x * (size_t) vocab;
	g4_row_sampling p = rows[blockIdx.x];
	kept_set	s;
	int			best;
	float		maxl;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < n_suppress; i += SAMPLE_THREADS)
		if (suppress[i] >= 0 && suppress[i] < vocab)
			row[suppress[i]] = -INFINITY;
	__syncthreads();
	best = block_argmax(row, vocab);
	maxl = row[best];
	if (p.temperature == 0.0f || !isfinite(maxl))
	{
		if (threadIdx.x == 0)
			ids[blockIdx.x] = best;
		return;
	}
	__syncthreads();			/* every thread has read maxl */
	for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS)
	{
		float		e = expf(__fdiv_rn(__fsub_rn(row[i], maxl), p.temperature));

		row[i] = e >= 0.0f ? e : 0.0f;	/* NaN never survives */
	}
	__syncthreads();
	s.bkey = __float_as_uint(p.min_p > 0.0f ? p.min_p : 0x1p-149f);
	s.bid = vocab;
	if (p.top_k > 0)
		narrow(row, vocab, s, true, (double) p.top_k);
	if (p.top_p < 1.0f)
		narrow(row, vocab, s, false, (double) p.top_p);
	best = draw(row, vocab, s, p.u);
	if (threadIdx.x == 0)
		ids[blockIdx.x] = best;
}

/* The greedy choice alone, left on the device (the draft model's next
 * input): no suppressed ids, logits unchanged. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
argmax_kernel(const float *logits, int vocab, int32_t *ids)
{
	int			best;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	best = block_argmax(logits + (size_t) blockIdx.x * (size_t) vocab, vocab);
	if (threadIdx.x == 0)
		ids[blockIdx.x] = best;
}

int
g4c_argmax(g4_backend *be, const float *logits, int n, int vocab, int32_t *ids)
{
	g4_cuda    *c = g4c_of(be);

	if (n <= 0)
		return G4_OK;
	return g4c_launch(c, "argmax", argmax_kernel, dim3(n), dim3(SAMPLE_THREADS), 0, logits, vocab, ids);
}

/* Grow a device (and optionally pinned host) staging array to n entries. */
static int
grow(g4_cuda *c, void **dev, void **host, int *cap, int n, size_t elem)
{
	int			want;

	if (n <= *cap)
		return G4_OK;
	want = n < 64 ? 64 : n;
	if (host && *host)
		cudaFreeHost(*host);
	if (*dev)
		cudaFree(*dev);
	*dev = NULL;
	if (host)
		*host = NULL;
	*cap = 0;
	G4C_CHECK(c, cudaMalloc(dev, (size_t) want * elem));
	if (host)
		G4C_CHECK(c, cudaMallocHost(host, (size_t) want * elem));
	*cap = want;
	return G4_OK;
}

int
g4c_sample(g4_backend *be, float *logits, int n, int vocab, const int32_t *suppress, int n_suppress,
		   const g4_row_sampling *rows, int32_t *ids)
{
	g4_cuda    *c = g4c_of(be);

	if (n <= 0)
		return G4_OK;
	if (c->capturing)
		return G4_ERR_INTERNAL;
	if (grow(c, (void **) &c->d_ids, (void **) &c->h_ids, &c->cap_ids, n, sizeof(int32_t)) != G4_OK ||
		grow(c, (void **) &c->d_rows, (void **) &c->h_rows, &c->cap_rows, n, sizeof(g4_row_sampling)) != G4_OK ||
		grow(c, (void **) &c->d_suppress, NULL, &c->cap_suppress, n_suppress, sizeof(int32_t)) != G4_OK)
		return c->err_code;
	/* the pinned staging is idle: every call ends with a stream sync, so the
	 * rows are copied and the sampler queued while the forward still runs */
	memcpy(c->h_rows, rows, (size_t) n * sizeof(g4_row_sampling));
	G4C_CHECK(c, cudaMemcpyAsync(c->d_rows, c->h_rows, (size_t) n * sizeof(g4_row_sampling),
								 cudaMemcpyHostToDevice, c->stream));
	if (n_suppress > 0)
		G4C_CHECK(c, cudaMemcpyAsync(c->d_suppress, suppress, (size_t) n_suppress * sizeof(int32_t),
									 cudaMemcpyHostToDevice, c->stream));
	if (g4c_launch(c, "sample", sample_kernel, dim3(n), dim3(SAMPLE_THREADS), 0, logits, vocab,
				   (const int32_t *) c->d_suppress, n_suppress, (const g4_row_sampling *) c->d_rows,
				   c->d_ids) != G4_OK)
		return c->err_code;
	G4C_CHECK(c, cudaMemcpyAsync(c->h_ids, c->d_ids, (size_t) n * sizeof(int32_t), cudaMemcpyDeviceToHost,
								 c->stream));
	G4C_CHECK(c, cudaStreamSynchronize(c->stream));
	if (c->err_code != G4_OK)
		return c->err_code;
	memcpy(ids, c->h_ids, (size_t) n * sizeof(int32_t));
	return G4_OK;
}

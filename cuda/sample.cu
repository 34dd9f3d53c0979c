/*
 * sample.cu — choosing the next token on the device, so only token ids cross
 * to the host.
 *
 * Each logits row is split over `split` blocks of contiguous ids (more blocks
 * the fewer the rows, so that one row fills the GPU), and g4_sample's choice
 * (sampler.c; the order and arithmetic are stated with g4_row_sampling in
 * backend.h) is made without sorting, in passes of one kernel launch each:
 *  - greedy: the first largest logit, the suppressed ids excluded (each block
 *    its range's best, then every block combines the blocks' bests).  That
 *    scan also tells whether the row holds a NaN (a block's best is NaN when
 *    its range holds one): such a row gets G4_SAMPLE_NAN at any
 *    temperature, and no later pass touches it;
 *  - else e = exp((logit - max) / T) is written over the row, and the kept
 *    set is always a prefix of the sampling order (larger e first, smaller id
 *    on ties), held as its boundary: the last kept (e, id).  min-p sets the
 *    first boundary; top-k and top-p each move it to the first element at
 *    which a running sum in that order reaches a target (a count of k, a
 *    weight of top_p of the kept weight).  That element is found by a radix
 *    search over the bits of e (positive floats order as their bit patterns):
 *    four passes of 8-bit histograms (each block its range's, then one block
 *    per row adds them and picks the bin) narrow down its value, and two
 *    passes in id order pick it among equal values (each block's count, then
 *    the one block whose range holds the target walks it);
 *  - the draw walks the kept ids in id order: each block's kept weight, then
 *    the one block whose range holds u times the kept weight finds the id
 *    (per-thread sums over contiguous ids, a block scan, a walk of one
 *    thread's range).
 * Weights are e · 2^40 truncated to 64-bit integers, as on the host: every
 * sum is exact whatever the order and the split it is added in, so the same
 * logits and draw give the same token on every run and at every split, and
 * the host's token where the two backends' exp agree.
 */
#include <math.h>
#include <string.h>

#include "cuda_common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
/* blocks per row: two per SM shared by the rows, at most 64, and at least
 * 4 ids per thread in each */
#define SAMPLE_MAX_SPLIT 64
#define SAMPLE_MIN_BLOCK_IDS (SAMPLE_THREADS * 4)

/* ---- greedy choice ------------------------------------------------------------ */

/* (v, i) beats (bv, bi): larger, or equal with the smaller index; NaN never
 * (a NaN is reported beside the best, block_best) */
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

/* The best (first largest) of row[lo..hi) in thread 0, index -1 when there
 * is none; its value is NaN when the range holds a NaN (the index is then
 * the best of the others).  Every thread of the block must call it. */
__device__ void
block_best(const float *row, int lo, int hi, float *best_v, int *best_i)
{
	__shared__ float sv[SAMPLE_WARPS];
	__shared__ int si[SAMPLE_WARPS];
	float		bv = -INFINITY;
	int			bi = -1;
	int			has_nan = 0;
	int			lane = threadIdx.x & 31;
	int			w = threadIdx.x >> 5;

	for (int i = lo + (int) threadIdx.x; i < hi; i += SAMPLE_THREADS)
	{
		float		v = row[i];

		if (beats(v, i, bv, bi))
		{
			bv = v;
			bi = i;
		}
		has_nan |= isnan(v);
	}
	warp_argmax(bv, bi);
	if (lane == 0)
	{
		sv[w] = bv;
		si[w] = bi;
	}
	/* the barrier that publishes the warps' bests ORs the threads' flags */
	has_nan = __syncthreads_or(has_nan);
	if (w == 0)
	{
		bv = sv[lane];
		bi = si[lane];
		warp_argmax(bv, bi);
		*best_v = has_nan ? NAN : bv;
		*best_i = bi;
	}
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

/* This thread's contiguous part of the block's ids [lo, hi), for the passes
 * in id order. */
__device__ __forceinline__ void
id_range(int lo, int hi, int *tlo, int *thi)
{
	int			chunk = (hi - lo + SAMPLE_THREADS - 1) / SAMPLE_THREADS;

	*tlo = min(hi, lo + (int) threadIdx.x * chunk);
	*thi = min(hi, *tlo + chunk);
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

/* ---- the passes ------------------------------------------------------------------- */

/* One row's progress from pass to pass. */
struct row_state
{
	kept_set	s;				/* the kept set so far */
	int			done;			/* greedy, or no finite best: the id is written */
	/* the narrowing in progress */
	uint32_t	prefix;			/* the boundary's high bits found so far */
	int			unchanged;		/* the whole set does not reach the target */
	uint64_t	acc;			/* kept weight before the prefix's range */
	double		target;
};

/* The passes' device memory: per row, and per row and block. */
struct sample_work
{
	row_state  *st;				/* [n] */
	float	   *best_v;			/* [n][split] */
	int		   *best_i;			/* [n][split] */
	uint64_t   *hist;			/* [n][split][256] */
	uint64_t   *part;			/* [n][split]: a count or a weight */
	int		   *last;			/* [n][split]: the last kept id, -1 if none */
};

/* Whether narrowing `which` (0 top-k, 1 top-p) applies to the row. */
__host__ __device__ __forceinline__ bool
narrows(const g4_row_sampling &p, int which)
{
	return which == 0 ? p.top_k > 0 : p.top_p < 1.0f;
}

/* Sum of v[0..k) in thread 0 (k at most the split). */
__device__ __forceinline__ uint64_t
sum_before(const uint64_t *v, int k)
{
	uint64_t	s = 0;

	for (int j = 0; j < k; j++)
		s += v[j];
	return s;
}

/* The suppressed ids set to -inf, then each block's best. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_best_kernel(float *logits, int vocab, int split, int chunk, const int32_t *suppress, int n_suppress,
				   sample_work w)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	float	   *row = logits + (size_t) r * (size_t) vocab;
	float		bv;
	int			bi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	for (int i = threadIdx.x; i < n_suppress; i += SAMPLE_THREADS)
		if (suppress[i] >= lo && suppress[i] < hi)
			row[suppress[i]] = -INFINITY;
	__syncthreads();
	block_best(row, lo, hi, &bv, &bi);
	if (threadIdx.x == 0)
	{
		w.best_v[r * split + b] = bv;
		w.best_i[r * split + b] = bi;
	}
}

/* The row's best from the blocks' (every block computes it): greedy rows,
 * and rows without a finite best (a NaN: G4_SAMPLE_NAN; all -inf: the
 * first id) get their id; the others e written over the row and the min-p
 * kept set. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_exp_kernel(float *logits, int vocab, int split, int chunk, const g4_row_sampling *rows, int32_t *ids,
				  sample_work w)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	float	   *row = logits + (size_t) r * (size_t) vocab;
	__shared__ float maxl;
	__shared__ int best;
	g4_row_sampling p = rows[r];

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (threadIdx.x == 0)
	{
		float		bv = -INFINITY;
		int			bi = -1;
		bool		has_nan = false;

		for (int k = 0; k < split; k++)
		{
			float		v = w.best_v[r * split + k];
			int			i = w.best_i[r * split + k];

			has_nan |= isnan(v);
			if (i >= 0 && beats(v, i, bv, bi))
			{
				bv = v;
				bi = i;
			}
		}
		/* g4_argmax: a NaN anywhere is no choice; else some block's range
		 * held a value that is no NaN, so bi >= 0 */
		best = has_nan ? G4_SAMPLE_NAN : bi;
		maxl = has_nan ? NAN : bv;
	}
	__syncthreads();
	if (p.temperature == 0.0f || !isfinite(maxl))
	{
		if (threadIdx.x == 0 && b == 0)
		{
			ids[r] = best;
			w.st[r].done = 1;
		}
		return;
	}
	if (threadIdx.x == 0 && b == 0)
	{
		w.st[r].done = 0;
		w.st[r].s.bkey = __float_as_uint(p.min_p > 0.0f ? p.min_p : 0x1p-149f);
		w.st[r].s.bid = vocab;
	}
	/* no NaN: the row holds none, and maxl is finite */
	for (int i = lo + (int) threadIdx.x; i < hi; i += SAMPLE_THREADS)
		row[i] = expf(__fdiv_rn(__fsub_rn(row[i], maxl), p.temperature));
}

/*
 * Narrowing `which` moves the kept set's boundary to the first kept element,
 * in the sampling order, at which the running sum of weights (1 per element
 * for top-k) reaches top_k, or top_p times the kept weight; the set is
 * unchanged when the whole set does not reach it.
 *
 * Histogram pass at `shift`: each block's 8-bit histogram of the kept
 * elements whose higher bits are the prefix found so far.
 */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_hist_kernel(const float *logits, int vocab, int split, int chunk, const g4_row_sampling *rows,
				   sample_work w, int which, int shift)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	const float *row = logits + (size_t) r * (size_t) vocab;
	__shared__ uint64_t copies[HIST_COPIES][256];
	const row_state *st = &w.st[r];
	bool		count = which == 0;
	bin_cache	c = {-1, -1, 0, 0};
	uint32_t	high_mask = shift == 24 ? 0u : ~0u << (shift + 8);
	uint64_t   *mine = copies[(threadIdx.x >> 5) % HIST_COPIES];
	kept_set	cur;
	uint32_t	prefix;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (!narrows(rows[r], which) || st->done || (shift < 24 && st->unchanged))
		return;
	cur = st->s;
	prefix = st->prefix;
	for (int k = threadIdx.x; k < HIST_COPIES * 256; k += SAMPLE_THREADS)
		copies[k / 256][k % 256] = 0;
	__syncthreads();
	for (int i = lo + (int) threadIdx.x; i < hi; i += SAMPLE_THREADS)
	{
		uint32_t	key = __float_as_uint(row[i]);

		if (kept(cur, key, i) && (key & high_mask) == (prefix & high_mask))
			cache_add(c, mine, (int) ((key >> shift) & 255u), count ? 1 : fixed_weight(key));
	}
	cache_flush(c, mine);
	__syncthreads();
	for (int k = threadIdx.x; k < 256; k += SAMPLE_THREADS)
	{
		uint64_t	sum = 0;

		for (int j = 0; j < HIST_COPIES; j++)
			sum += copies[j][k];
		w.hist[((size_t) r * split + b) * 256 + k] = sum;
	}
}

/* Selection after the histogram pass at `shift`, one block of 256 threads
 * per row: the blocks' histograms added, and the bin in which the running
 * sum from the top reaches the target (set at the first pass). */
__global__ void __launch_bounds__(256)
sample_select_kernel(const g4_row_sampling *rows, int split, sample_work w, int which, int shift)
{
	__shared__ uint64_t hist[256];
	int			r = blockIdx.x;
	row_state  *st = &w.st[r];
	g4_row_sampling p = rows[r];
	bool		count = which == 0;
	uint64_t	sum = 0;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (!narrows(p, which) || st->done || (shift < 24 && st->unchanged))
		return;
	for (int k = 0; k < split; k++)
		sum += w.hist[((size_t) r * split + k) * 256 + threadIdx.x];
	hist[threadIdx.x] = sum;
	__syncthreads();
	if (threadIdx.x == 0)
	{
		int			bin;

		if (shift == 24)
		{
			uint64_t	total = 0;
			double		param = count ? (double) p.top_k : (double) p.top_p;

			for (bin = 0; bin < 256; bin++)
				total += hist[bin];
			st->target = count ? param : param * (double) total;
			st->unchanged = !reaches(total, st->target, false);
			st->prefix = 0;
			st->acc = 0;
		}
		if (st->unchanged)
			return;
		for (bin = 255; bin > 0; bin--)
		{
			if (reaches(st->acc + hist[bin], st->target, false))
				break;
			st->acc += hist[bin];
		}
		st->prefix |= (uint32_t) bin << shift;
	}
}

/* How many kept elements in this thread's ids have value `key`. */
__device__ __forceinline__ uint64_t
count_ties(const float *row, int tlo, int thi, const kept_set &cur, uint32_t key)
{
	uint64_t	n = 0;

	for (int i = tlo; i < thi; i++)
		n += __float_as_uint(row[i]) == key && kept(cur, key, i);
	return n;
}

/* Among the kept elements of the value found (all weigh the same), each
 * block's count. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_ties_kernel(const float *logits, int vocab, int split, int chunk, const g4_row_sampling *rows,
				   sample_work w, int which)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	const float *row = logits + (size_t) r * (size_t) vocab;
	const row_state *st = &w.st[r];
	uint64_t	total;
	int			tlo,
				thi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (!narrows(rows[r], which) || st->done || st->unchanged)
		return;
	id_range(lo, hi, &tlo, &thi);
	block_exclusive_scan(count_ties(row, tlo, thi, st->s, st->prefix), &total);
	if (threadIdx.x == 0)
		w.part[r * split + b] = total;
}

/* The block whose range holds it finds the first of them, in id order, at
 * which the sum reaches the target: the new boundary (always found, by
 * construction: the last histogram pass's bin reached). */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_boundary_kernel(const float *logits, int vocab, int split, int chunk, const g4_row_sampling *rows,
					   sample_work w, int which)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	const float *row = logits + (size_t) r * (size_t) vocab;
	row_state  *st = &w.st[r];
	__shared__ uint64_t base;
	__shared__ bool here;
	uint32_t	key;
	uint64_t	wt,
				n,
				before,
				total;
	kept_set	cur;
	int			tlo,
				thi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (!narrows(rows[r], which) || st->done || st->unchanged)
		return;
	key = st->prefix;
	wt = which == 0 ? 1 : fixed_weight(key);
	if (threadIdx.x == 0)
	{
		uint64_t	mine = w.part[r * split + b];

		base = sum_before(w.part + (size_t) r * split, b);
		here = mine > 0 && reaches(st->acc + (base + mine) * wt, st->target, false) &&
			!reaches(st->acc + base * wt, st->target, false);
	}
	__syncthreads();
	if (!here)
		return;
	/* only this block reads the kept set, and writes it after the scan's
	 * barriers */
	cur = st->s;
	id_range(lo, hi, &tlo, &thi);
	n = count_ties(row, tlo, thi, cur, key);
	before = base + block_exclusive_scan(n, &total);
	if (n > 0 && reaches(st->acc + (before + n) * wt, st->target, false) &&
		!reaches(st->acc + before * wt, st->target, false))
	{
		for (int i = tlo; i < thi; i++)
			if (__float_as_uint(row[i]) == key && kept(cur, key, i) &&
				reaches(st->acc + ++before * wt, st->target, false))
			{
				st->s.bkey = key;
				st->s.bid = i;
				break;
			}
	}
}

/* This thread's kept weight and its last kept id (-1 if none). */
__device__ __forceinline__ uint64_t
kept_weight(const float *row, int tlo, int thi, const kept_set &s, int *last)
{
	uint64_t	sum = 0;

	*last = -1;
	for (int i = tlo; i < thi; i++)
	{
		uint32_t	key = __float_as_uint(row[i]);

		if (kept(s, key, i))
		{
			sum += fixed_weight(key);
			*last = i;
		}
	}
	return sum;
}

/* The draw, first pass: each block's kept weight and last kept id. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_weight_kernel(const float *logits, int vocab, int split, int chunk, sample_work w)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	const float *row = logits + (size_t) r * (size_t) vocab;
	const row_state *st = &w.st[r];
	__shared__ int largest;
	uint64_t	total;
	int			last,
				tlo,
				thi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (st->done)
		return;
	if (threadIdx.x == 0)
		largest = -1;
	id_range(lo, hi, &tlo, &thi);
	block_exclusive_scan(kept_weight(row, tlo, thi, st->s, &last), &total);	/* its barriers order `largest` */
	if (last >= 0)
		atomicMax(&largest, last);
	__syncthreads();
	if (threadIdx.x == 0)
	{
		w.part[r * split + b] = total;
		w.last[r * split + b] = largest;
	}
}

/* The draw: the first kept id, in id order, at which the running weight
 * exceeds u times the kept weight, found by the block whose range holds it;
 * the last kept id if rounding leaves it unreached. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw_kernel(const float *logits, int vocab, int split, int chunk, const g4_row_sampling *rows,
				   int32_t *ids, sample_work w)
{
	int			r = blockIdx.y,
				b = blockIdx.x,
				lo = min(vocab, b * chunk),
				hi = min(vocab, lo + chunk);
	const float *row = logits + (size_t) r * (size_t) vocab;
	const row_state *st = &w.st[r];
	const uint64_t *part = w.part + (size_t) r * split;
	__shared__ uint64_t base;
	__shared__ double target;
	__shared__ bool here;
	uint64_t	sum,
				before,
				total;
	int			last,
				tlo,
				thi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	if (st->done)
		return;
	if (threadIdx.x == 0)
	{
		uint64_t	all = sum_before(part, split);

		base = sum_before(part, b);
		target = rows[r].u * (double) all;
		here = reaches(base + part[b], target, true) && !reaches(base, target, true);
		if (b == 0 && !reaches(all, target, true))
		{
			int			largest = -1;

			for (int k = 0; k < split; k++)
				largest = max(largest, w.last[r * split + k]);
			ids[r] = largest;
		}
	}
	__syncthreads();
	if (!here)
		return;
	id_range(lo, hi, &tlo, &thi);
	sum = kept_weight(row, tlo, thi, st->s, &last);
	before = base + block_exclusive_scan(sum, &total);
	if (reaches(before + sum, target, true) && !reaches(before, target, true))
	{
		for (int i = tlo; i < thi; i++)
		{
			uint32_t	key = __float_as_uint(row[i]);

			if (kept(st->s, key, i))
			{
				before += fixed_weight(key);
				if (reaches(before, target, true))
				{
					ids[r] = i;
					break;
				}
			}
		}
	}
}

/* ---- the call ------------------------------------------------------------------- */

/* The greedy choice alone, left on the device (the draft model's next
 * input): no suppressed ids, logits unchanged. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
argmax_kernel(const float *logits, int vocab, int32_t *ids)
{
	const float *row = logits + (size_t) blockIdx.x * (size_t) vocab;
	float		bv;
	int			bi;

	g4c_pdl_trigger();
	g4c_pdl_wait();
	block_best(row, 0, vocab, &bv, &bi);
	/* g4_argmax: a row holding a NaN is no choice */
	if (threadIdx.x == 0)
		ids[blockIdx.x] = isnan(bv) ? G4_SAMPLE_NAN : bi;
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

/* Blocks per row: the rows' blocks in one wave of two per SM, within the
 * limits above. */
static int
sample_split(const g4_cuda *c, int n, int vocab)
{
	int			split = 2 * c->sm_count / n;
	int			by_ids = (vocab + SAMPLE_MIN_BLOCK_IDS - 1) / SAMPLE_MIN_BLOCK_IDS;

	if (split > SAMPLE_MAX_SPLIT)
		split = SAMPLE_MAX_SPLIT;
	if (split > by_ids)
		split = by_ids;
	return split > 1 ? split : 1;
}

/* The passes' memory, carved from one device buffer. */
static int
sample_work_carve(g4_cuda *c, int n, int split, sample_work *w)
{
	size_t		cells = (size_t) n * (size_t) split;
	size_t		bytes = (size_t) n * sizeof(row_state) + cells * (256 + 1) * sizeof(uint64_t) +
		cells * (sizeof(float) + 2 * sizeof(int));
	unsigned char *p;

	if (bytes > (size_t) 1 << 30)
		return G4_ERR_INTERNAL;
	if (grow(c, &c->d_sample_work, NULL, &c->cap_sample_work, (int) bytes, 1) != G4_OK)
		return c->err_code;
	/* largest alignment first */
	p = (unsigned char *) c->d_sample_work;
	w->st = (row_state *) p;
	p += (size_t) n * sizeof(row_state);
	w->hist = (uint64_t *) p;
	p += cells * 256 * sizeof(uint64_t);
	w->part = (uint64_t *) p;
	p += cells * sizeof(uint64_t);
	w->best_v = (float *) p;
	p += cells * sizeof(float);
	w->best_i = (int *) p;
	p += cells * sizeof(int);
	w->last = (int *) p;
	return G4_OK;
}

int
g4c_sample(g4_backend *be, float *logits, int n, int vocab, const int32_t *suppress, int n_suppress,
		   const g4_row_sampling *rows, int32_t *ids)
{
	g4_cuda    *c = g4c_of(be);
	int			split,
				chunk;
	int			sampled = 0,
				narrow[2] = {0, 0};
	sample_work w;
	const g4_row_sampling *d_rows;
	dim3		grid,
				block(SAMPLE_THREADS);

	if (n <= 0)
		return G4_OK;
	if (c->capturing)
		return G4_ERR_INTERNAL;
	split = sample_split(c, n, vocab);
	chunk = (vocab + split - 1) / split;
	grid = dim3((unsigned) split, (unsigned) n);
	if (grow(c, (void **) &c->d_ids, (void **) &c->h_ids, &c->cap_ids, n, sizeof(int32_t)) != G4_OK ||
		grow(c, (void **) &c->d_rows, (void **) &c->h_rows, &c->cap_rows, n, sizeof(g4_row_sampling)) != G4_OK ||
		grow(c, (void **) &c->d_suppress, NULL, &c->cap_suppress, n_suppress, sizeof(int32_t)) != G4_OK ||
		sample_work_carve(c, n, split, &w) != G4_OK)
		return c->err_code != G4_OK ? c->err_code : G4_ERR_INTERNAL;
	/* the passes each launch only where some row needs them */
	for (int i = 0; i < n; i++)
		if (rows[i].temperature != 0.0f)
		{
			sampled = 1;
			narrow[0] |= narrows(rows[i], 0);
			narrow[1] |= narrows(rows[i], 1);
		}
	/* the pinned staging is idle: every call ends with a stream sync, so the
	 * rows are copied and the sampler queued while the forward still runs */
	memcpy(c->h_rows, rows, (size_t) n * sizeof(g4_row_sampling));
	G4C_CHECK(c, cudaMemcpyAsync(c->d_rows, c->h_rows, (size_t) n * sizeof(g4_row_sampling),
								 cudaMemcpyHostToDevice, c->stream));
	if (n_suppress > 0)
		G4C_CHECK(c, cudaMemcpyAsync(c->d_suppress, suppress, (size_t) n_suppress * sizeof(int32_t),
									 cudaMemcpyHostToDevice, c->stream));
	d_rows = c->d_rows;
	if (g4c_launch(c, "sample (best)", sample_best_kernel, grid, block, 0, logits, vocab, split, chunk,
				   (const int32_t *) c->d_suppress, n_suppress, w) != G4_OK ||
		g4c_launch(c, "sample (exp)", sample_exp_kernel, grid, block, 0, logits, vocab, split, chunk, d_rows,
				   c->d_ids, w) != G4_OK)
		return c->err_code;
	for (int which = 0; which < 2; which++)
	{
		if (!narrow[which])
			continue;
		for (int shift = 24; shift >= 0; shift -= 8)
			if (g4c_launch(c, "sample (histogram)", sample_hist_kernel, grid, block, 0, (const float *) logits,
						   vocab, split, chunk, d_rows, w, which, shift) != G4_OK ||
				g4c_launch(c, "sample (bin)", sample_select_kernel, dim3((unsigned) n), dim3(256), 0, d_rows,
						   split, w, which, shift) != G4_OK)
				return c->err_code;
		if (g4c_launch(c, "sample (ties)", sample_ties_kernel, grid, block, 0, (const float *) logits, vocab,
					   split, chunk, d_rows, w, which) != G4_OK ||
			g4c_launch(c, "sample (boundary)", sample_boundary_kernel, grid, block, 0, (const float *) logits,
					   vocab, split, chunk, d_rows, w, which) != G4_OK)
			return c->err_code;
	}
	if (sampled &&
		(g4c_launch(c, "sample (weights)", sample_weight_kernel, grid, block, 0, (const float *) logits, vocab,
					split, chunk, w) != G4_OK ||
		 g4c_launch(c, "sample (draw)", sample_draw_kernel, grid, block, 0, (const float *) logits, vocab, split,
					chunk, d_rows, c->d_ids, w) != G4_OK))
		return c->err_code;
	G4C_CHECK(c, cudaMemcpyAsync(c->h_ids, c->d_ids, (size_t) n * sizeof(int32_t), cudaMemcpyDeviceToHost,
								 c->stream));
	G4C_CHECK(c, cudaStreamSynchronize(c->stream));
	if (c->err_code != G4_OK)
		return c->err_code;
	memcpy(ids, c->h_ids, (size_t) n * sizeof(int32_t));
	return G4_OK;
}

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Latency histograms the tools fill in the kernel (funclatency, msglat):
 * four buckets per power of two, each a quarter of it (so within 25%).
 * Values 0-3 have buckets of their own; for v >= 4 with b = floor(log2 v),
 * bucket 4(b-1) + the two bits after the leading one. The Rust half is
 * src/engine/hist.rs. Include after the libbpf headers.
 */
#ifndef SONDE_HIST_H
#define SONDE_HIST_H

#define HIST_BUCKETS 256

struct sonde_hist {
	__u64 buckets[HIST_BUCKETS];
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
};

/* floor(log2(v)) for v > 0, else 0. */
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) {
		v >>= 32;
		r += 32;
	}
	if (v >> 16) {
		v >>= 16;
		r += 16;
	}
	if (v >> 8) {
		v >>= 8;
		r += 8;
	}
	if (v >> 4) {
		v >>= 4;
		r += 4;
	}
	if (v >> 2) {
		v >>= 2;
		r += 2;
	}
	if (v >> 1) {
		r += 1;
	}
	return r;
}

/* The bucket of a latency. */
static __always_inline __u32 hist_bucket(__u64 ns)
{
	__u32 b = 0;
	if (ns < 4) {
		b = ns;
	} else {
		__u32 l = log2_u64(ns);
		b = 4 * (l - 1) + ((ns >> (l - 2)) & 3);
	}
	/* b <= 251; the mask (HIST_BUCKETS is a power of two) is for older
	 * verifiers, which lose the bound of a clamp. */
	return b & (HIST_BUCKETS - 1);
}

/* Adds one latency to a (per-CPU) histogram. */
static __always_inline void hist_add(struct sonde_hist *h, __u64 ns)
{
	__u32 b = hist_bucket(ns);
	h->buckets[b & (HIST_BUCKETS - 1)] += 1;
	h->count += 1;
	h->sum_ns += ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
}

/* Adds one latency to a histogram all CPUs share: atomic adds, and a max
 * that a racing larger value may beat (it is only raised). */
static __always_inline void hist_add_shared(struct sonde_hist *h, __u64 ns)
{
	__u32 b = hist_bucket(ns);
	__sync_fetch_and_add(&h->buckets[b & (HIST_BUCKETS - 1)], 1);
	__sync_fetch_and_add(&h->count, 1);
	__sync_fetch_and_add(&h->sum_ns, ns);
	if (ns > h->max_ns)
		h->max_ns = ns;
}

#endif

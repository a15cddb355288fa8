// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The per-CPU counters a tool reports in its summary (lost, skipped, not
 * timed...); the user half sums them with engine::perf::percpu_sum. Define
 * SONDE_STATS_MAX (the number of slots) before including, after the libbpf
 * headers.
 */
#ifndef SONDE_STATS_H
#define SONDE_STATS_H

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SONDE_STATS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void stat_add_n(__u32 slot, __u64 v)
{
	__u64 *p = bpf_map_lookup_elem(&stats, &slot);
	if (p)
		*p += v;
}

static __always_inline void stat_add(__u32 slot)
{
	stat_add_n(slot, 1);
}

#endif

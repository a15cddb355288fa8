// SPDX-License-Identifier: GPL-2.0
/*
 * sonde profile: CPU samples from a perf event on every CPU, counted in the
 * kernel per (process, thread, comm, kernel stack, user stack).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "profile.h"

char LICENSE[] SEC("license") = "GPL";

#define EEXIST 17
#define EFAULT 14

const volatile bool include_idle = false;
const volatile bool want_kernel = true;
const volatile bool want_user = true;
const volatile bool per_thread = false;
const volatile bool filter_pids = false;
const volatile __u32 n_tids = 0;
const volatile __u32 tids[16] = {};
const volatile __u64 cgroup_id = 0;
const volatile bool filter_comm = false;
const volatile char comm_filter[STK_COMM_LEN] = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Processes to sample with -p (tgid -> 1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PIDS);
	__type(key, __u32);
	__type(value, __u8);
} pids SEC(".maps");

static __always_inline void stat_add(__u32 slot)
{
	__u64 *p = bpf_map_lookup_elem(&stats, &slot);
	if (p)
		*p += 1;
}

static __always_inline void stk_stat(__u32 s)
{
	stat_add(PS_STACKS + s);
}

static __always_inline bool comm_matches(const char *c)
{
	for (int i = 0; i < STK_COMM_LEN; i++) {
		if (c[i] != comm_filter[i])
			return false;
		if (!c[i])
			break;
	}
	return true;
}

SEC("perf_event")
int on_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32, tid = (__u32)id;
	if (tid == 0 && !include_idle) {
		stat_add(PS_IDLE);
		return 0;
	}
	if (filter_pids && !bpf_map_lookup_elem(&pids, &pid)) {
		stat_add(PS_FILTERED);
		return 0;
	}
	if (n_tids) {
		bool hit = false;
		for (__u32 i = 0; i < 16 && i < n_tids; i++)
			if (tids[i] == tid)
				hit = true;
		if (!hit) {
			stat_add(PS_FILTERED);
			return 0;
		}
	}
	if (cgroup_id && bpf_get_current_cgroup_id() != cgroup_id) {
		stat_add(PS_FILTERED);
		return 0;
	}
	struct stk_key key = {};
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	if (filter_comm && !comm_matches(key.comm)) {
		stat_add(PS_FILTERED);
		return 0;
	}
	key.pid = pid;
	key.tid = per_thread ? tid : 0;
	STK_CAPTURE(ctx, &key, want_kernel, want_user, stk_stat);
	STK_COUNT(&key, 1, stk_stat);
	stat_add(PS_SAMPLES);
	return 0;
}

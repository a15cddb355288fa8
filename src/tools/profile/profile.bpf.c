// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde profile: CPU samples from a perf event on every CPU, counted in the
 * kernel per (process, thread, comm, kernel stack, user stack).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "taskfilter.h"
#include "profile.h"
#define SONDE_STATS_MAX PS_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile bool include_idle = false;
const volatile bool want_kernel = true;
const volatile bool want_user = true;
const volatile bool per_thread = false;

static __always_inline void stk_stat(__u32 s)
{
	stat_add(PS_STACKS + s);
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
	if (!tf_wanted_current(pid, tid)) {
		stat_add(PS_FILTERED);
		return 0;
	}
	struct stk_key key = {};
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	key.pid = pid;
	key.tid = per_thread ? tid : 0;
	STK_CAPTURE_SAMPLE(ctx, &key, want_kernel, want_user, stk_stat);
	STK_COUNT(&key, 1, stk_stat);
	stat_add(PS_SAMPLES);
	return 0;
}

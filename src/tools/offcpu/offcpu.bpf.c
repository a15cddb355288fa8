// SPDX-License-Identifier: GPL-2.0
/*
 * sonde offcpu: time threads spend blocked, per (thread, kernel + user stack
 * where it blocked), from sched_switch. At switch-out the filters run first
 * (pid, tid, cgroup, comm, state: no stack walk for threads nobody asked
 * about), then the stacks of the thread going off CPU (it is still current)
 * are saved with a timestamp; at switch-in the blocked time is added, in
 * microseconds, if it is within --min-block/--max-block.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "taskfilter.h"
#include "offcpu.h"

char LICENSE[] SEC("license") = "GPL";

const volatile bool want_kernel = true;
const volatile bool want_user = true;
const volatile bool per_thread = true;
/* Bit per state: 1 running (preempted), 2 interruptible, 4 uninterruptible; 0 = all. */
const volatile __u32 state_mask = 0;
const volatile __u64 min_block_ns = 1000;
const volatile __u64 max_block_ns = ~0ULL;
/* wakeup mode: join each blocked period to the stack that woke it. */
const volatile bool want_waker = false;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct oc_start);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct oc_waker);
} wakers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct oc_wake_key);
	__type(value, __u64);
} wake_counts SEC(".maps");

/* Referenced so the skeleton mirrors the layout. */
struct oc_wake_key _oc_wake_key = {};

static __always_inline void stat_add(__u32 slot)
{
	__u64 *p = bpf_map_lookup_elem(&stats, &slot);
	if (p)
		*p += 1;
}

static __always_inline void stk_stat(__u32 s)
{
	stat_add(OS_STACKS + s);
}

/* Whether the thread going off CPU is one we were asked about. */
static __always_inline bool wanted(struct task_struct *prev, bool direct)
{
	__u32 tgid = direct ? prev->tgid : BPF_CORE_READ(prev, tgid);
	__u32 tid = direct ? prev->pid : BPF_CORE_READ(prev, pid);
	if (!tid)
		return false; /* idle */
	if (state_mask) {
		unsigned int st = direct ? prev->__state : BPF_CORE_READ(prev, __state);
		__u32 bit = st == 0 ? 1 : (st & 1) ? 2 : (st & 2) ? 4 : 0;
		if (!(state_mask & bit))
			return false;
	}
	/* prev is still current here: its cgroup and comm. */
	return tf_wanted_current(tgid, tid);
}

static __always_inline int on_switch(void *ctx, struct task_struct *prev, struct task_struct *next, bool direct)
{
	__u64 now = bpf_ktime_get_ns();
	stat_add(OS_SWITCHES);

	if (wanted(prev, direct)) {
		struct stk_key k = {};
		k.pid = direct ? prev->tgid : BPF_CORE_READ(prev, tgid);
		STK_CAPTURE(ctx, &k, want_kernel, want_user, stk_stat);
		struct oc_start s = {.ts = now, .kstack = k.kstack, .ustack = k.ustack};
		__u32 tid = direct ? prev->pid : BPF_CORE_READ(prev, pid);
		if (bpf_map_update_elem(&starts, &tid, &s, BPF_ANY))
			stat_add(OS_STARTS_FULL);
	}

	__u32 ntid = direct ? next->pid : BPF_CORE_READ(next, pid);
	struct oc_start *s = bpf_map_lookup_elem(&starts, &ntid);
	if (!s)
		return 0;
	__u64 delta = now - s->ts;
	struct stk_key k = {.kstack = s->kstack, .ustack = s->ustack};
	bpf_map_delete_elem(&starts, &ntid);
	struct oc_wake_key wk = {};
	if (want_waker) {
		struct oc_waker *w = bpf_map_lookup_elem(&wakers, &ntid);
		if (w) {
			wk.waker = *w;
			bpf_map_delete_elem(&wakers, &ntid);
		} else {
			wk.waker.kstack = STK_NONE; /* preempted: nobody woke it */
			wk.waker.ustack = STK_NONE;
		}
	}
	if (delta < min_block_ns) {
		stat_add(OS_SHORT);
		return 0;
	}
	if (delta > max_block_ns) {
		stat_add(OS_LONG);
		return 0;
	}
	k.pid = direct ? next->tgid : BPF_CORE_READ(next, tgid);
	k.tid = per_thread ? ntid : 0;
	if (direct)
		__builtin_memcpy(k.comm, next->comm, sizeof(k.comm));
	else
		BPF_CORE_READ_STR_INTO(&k.comm, next, comm);
	__u64 us = delta / 1000;
	if (want_waker) {
		wk.blocked = k;
		__u64 *c = bpf_map_lookup_elem(&wake_counts, &wk);
		if (c) {
			__sync_fetch_and_add(c, us);
		} else if (bpf_map_update_elem(&wake_counts, &wk, &us, BPF_NOEXIST)) {
			c = bpf_map_lookup_elem(&wake_counts, &wk);
			if (c)
				__sync_fetch_and_add(c, us);
			else
				stk_stat(STK_COUNTS_FULL);
		}
	} else {
		STK_COUNT(&k, us, stk_stat);
	}
	stat_add(OS_RECORDED);
	return 0;
}

/* The waker: only for threads whose blocking is being timed (a start record
 * exists), so other wake-ups cost one lookup. */
static __always_inline int on_waking(void *ctx, struct task_struct *p, bool direct)
{
	if (!want_waker)
		return 0;
	__u32 tid = direct ? p->pid : BPF_CORE_READ(p, pid);
	if (!bpf_map_lookup_elem(&starts, &tid))
		return 0;
	struct stk_key tmp = {};
	__u64 id = bpf_get_current_pid_tgid();
	tmp.pid = id >> 32;
	STK_CAPTURE(ctx, &tmp, true, want_user, stk_stat);
	struct oc_waker w = {.kstack = tmp.kstack, .ustack = tmp.ustack, .pid = tmp.pid};
	bpf_get_current_comm(w.comm, sizeof(w.comm));
	bpf_map_update_elem(&wakers, &tid, &w, BPF_ANY);
	return 0;
}

SEC("tp_btf/sched_waking")
int BPF_PROG(btf_waking, struct task_struct *p)
{
	return on_waking(ctx, p, true);
}

SEC("raw_tp/sched_waking")
int BPF_PROG(raw_waking, struct task_struct *p)
{
	return on_waking(ctx, p, false);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(ctx, prev, next, true);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(ctx, prev, next, false);
}

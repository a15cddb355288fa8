// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde offcpu: time threads spend off CPU, per (thread, kernel + user stack
 * where it blocked), in nanoseconds. At sched_switch the filters run first
 * (pid, tid, cgroup, comm, state: nothing more for threads nobody asked
 * about) and the thread going off CPU gets a start time. Where the kernel
 * has sched_exit_tp (it fires as __schedule returns into the thread that
 * runs again, which is then current), the period ends there: if it is
 * within --min-block/--max-block and kept by sampling (keep()), its stacks
 * are walked then, so short periods cost no walk. Without that hook the
 * stacks are walked at every switch-out and the period ends at the switch-in.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "taskfilter.h"
#include "offcpu.h"
#define SONDE_STATS_MAX OS_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

const volatile bool want_kernel = true;
const volatile bool want_user = true;
const volatile bool per_thread = true;
/* Bit per state: 1 running (preempted), 2 interruptible, 4 uninterruptible; 0 = all. */
const volatile __u32 state_mask = 0;
const volatile __u64 min_block_ns = 1000;
const volatile __u64 max_block_ns = ~0ULL;
/* wakeup mode: join each blocked period to the stack that woke it. */
const volatile bool want_waker = false;
/* Periods end in on_exit (sched_exit_tp, current = the thread that runs
 * again): stacks are walked only for periods that are kept. */
const volatile bool at_exit = false;
/* Periods shorter than this are sampled (see keep()); 0 = all kept. */
const volatile __u64 sample_ns = 0;
/* wakeup: kernel text of hardware-interrupt entry (kallsyms; lo 0: none).
 * A wake-up with one of these below it runs on whatever task the interrupt
 * hit: that task's user stack is not walked (nor its tables loaded). */
#define IRQ_RANGES 4
const volatile __u64 irq_lo[IRQ_RANGES] = {};
const volatile __u64 irq_hi[IRQ_RANGES] = {};
/* Kernel frames looked at: a timer or NIC interrupt's entry is within the
 * first ~25 above sched_waking. */
#define IRQ_SCAN_FRAMES 40

/* When this CPU last switched (raw_tp; under tp_btf the switch-in time goes
 * into the start record of the thread switched in): a period ends when its
 * thread is switched in, as the kernel's own run-time accounting counts it,
 * not later in on_exit, after the context switch itself. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} switch_at SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64[IRQ_SCAN_FRAMES]);
} irq_scan SEC(".maps");

/* Whether the current kernel stack passes through interrupt entry. */
static __always_inline bool woken_in_interrupt(void *ctx)
{
	if (!irq_lo[0])
		return false;
	__u32 zero = 0;
	__u64 *f = bpf_map_lookup_elem(&irq_scan, &zero);
	if (!f)
		return false;
	long n = bpf_get_stack(ctx, f, IRQ_SCAN_FRAMES * sizeof(__u64), 0);
	if (n <= 0)
		return false;
	n /= sizeof(__u64);
	for (int i = 0; i < IRQ_SCAN_FRAMES; i++) {
		if (i >= n)
			break;
		__u64 a = f[i];
		for (int j = 0; j < IRQ_RANGES; j++)
			if (a >= irq_lo[j] && a < irq_hi[j])
				return true;
	}
	return false;
}

/* Start records: in the thread's own task storage under tp_btf (a pointer
 * chase, no hashing, freed with the thread); a hash by thread id under raw_tp,
 * whose task pointers the verifier does not trust, and on kernels whose local
 * storage is not allocated with bpf_mem_alloc: there, creating task storage
 * inside sched_switch allocates with the runqueue lock held, which can
 * deadlock (it hung Debian's 6.1 in scripts/vmtest). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct oc_start);
} task_starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct oc_start);
} starts SEC(".maps");

/* Whether start records live in task storage (see above). */
static __always_inline bool task_storage_ok(bool direct)
{
	return direct && bpf_core_field_exists(struct bpf_local_storage_map, selem_ma);
}

/* The current task, where task storage takes it; NULL elsewhere, so that
 * kernels without bpf_get_current_task_btf (before 5.11) never see the
 * call (a helper call is not dropped as dead code by the compiler). */
static __always_inline struct task_struct *current_task(bool direct)
{
	return task_storage_ok(direct) ? bpf_get_current_task_btf() : NULL;
}

/* The running period of `t` (thread `tid`), or NULL. */
static __always_inline struct oc_start *start_of(struct task_struct *t, __u32 tid, bool direct)
{
	if (task_storage_ok(direct)) {
		struct oc_start *s = bpf_task_storage_get(&task_starts, t, 0, 0);
		return s && s->ts ? s : NULL;
	}
	return bpf_map_lookup_elem(&starts, &tid);
}

/* Ends the period `s` of thread `tid` (read what you need first). */
static __always_inline void start_end(struct oc_start *s, __u32 tid, bool direct)
{
	if (task_storage_ok(direct))
		s->ts = 0;
	else
		bpf_map_delete_elem(&starts, &tid);
}

/* Starts a period of `t`; false when there is no room. */
static __always_inline bool start_begin(struct task_struct *t, __u32 tid, bool direct,
                                        struct oc_start *v)
{
	if (task_storage_ok(direct)) {
		struct oc_start *s =
		        bpf_task_storage_get(&task_starts, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!s)
			return false;
		*s = *v;
		return true;
	}
	return !bpf_map_update_elem(&starts, &tid, v, BPF_ANY);
}

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

/*
 * Whether a period of `delta` ns is kept, and its weight in ns. With
 * sample_ns = T, a period shorter than T is kept with probability delta/T and
 * then weighs T: each stack's expected total is its true blocked time, and
 * the stack walks for short periods are bounded by (blocked time)/T.
 */
static __always_inline bool keep(__u64 delta, __u64 *weight)
{
	*weight = delta;
	if (!sample_ns || delta >= sample_ns)
		return true;
	if ((bpf_get_prandom_u32() % (__u32)sample_ns) >= delta)
		return false;
	*weight = sample_ns;
	return true;
}

/* Adds a finished period of `ns` nanoseconds with the stacks in `k`. */
static __always_inline void account(struct stk_key *k, struct oc_wake_key *wk, __u64 ns)
{
	if (want_waker) {
		wk->blocked = *k;
		__u64 *c = bpf_map_lookup_elem(&wake_counts, wk);
		if (c) {
			__sync_fetch_and_add(c, ns);
		} else if (bpf_map_update_elem(&wake_counts, wk, &ns, BPF_NOEXIST)) {
			c = bpf_map_lookup_elem(&wake_counts, wk);
			if (c)
				__sync_fetch_and_add(c, ns);
			else
				stk_stat(STK_COUNTS_FULL);
		}
	} else {
		STK_COUNT(k, ns, stk_stat);
	}
	stat_add(OS_RECORDED);
}

/* Takes the waker record of `tid` into `wk` (wakeup mode). */
static __always_inline void take_waker(__u32 tid, struct oc_wake_key *wk)
{
	if (!want_waker)
		return;
	struct oc_waker *w = bpf_map_lookup_elem(&wakers, &tid);
	if (w) {
		wk->waker = *w;
		bpf_map_delete_elem(&wakers, &tid);
	} else {
		wk->waker.kstack = STK_NONE; /* preempted: nobody woke it */
		wk->waker.ustack = STK_NONE;
		wk->waker.uhash = 0;
	}
}

static __always_inline bool in_range(__u64 delta)
{
	if (delta < min_block_ns) {
		stat_add(OS_SHORT);
		return false;
	}
	if (delta > max_block_ns) {
		stat_add(OS_LONG);
		return false;
	}
	return true;
}

static __always_inline int on_switch(void *ctx, struct task_struct *prev, struct task_struct *next,
                                     bool direct)
{
	stat_add(OS_SWITCHES);
	__u64 now = 0;
	if (at_exit && task_storage_ok(direct)) {
		/* A pointer chase, and a clock read only for traced threads. */
		struct oc_start *n = start_of(next, 0, direct);
		if (n) {
			now = bpf_ktime_get_ns();
			n->end = now;
		}
	} else if (at_exit) {
		__u32 zero = 0;
		__u64 *at = bpf_map_lookup_elem(&switch_at, &zero);
		now = bpf_ktime_get_ns();
		if (at)
			*at = now;
	}

	if (wanted(prev, direct)) {
		if (!now)
			now = bpf_ktime_get_ns();
		struct oc_start s = {.ts = now, .kstack = STK_NONE, .ustack = STK_NONE};
		if (!at_exit) {
			/* No hook after the switch: the stacks must be taken now,
			 * while prev is current, whatever the period turns out to be. */
			struct stk_key k = {};
			k.pid = direct ? prev->tgid : BPF_CORE_READ(prev, tgid);
			STK_CAPTURE(ctx, &k, want_kernel, want_user, stk_stat);
			s.kstack = k.kstack;
			s.ustack = k.ustack;
			s.uhash = k.uhash;
		}
		__u32 tid = direct ? prev->pid : BPF_CORE_READ(prev, pid);
		/* prev is current: the trusted pointer to it. */
		if (!start_begin(current_task(direct), tid, direct, &s))
			stat_add(OS_STARTS_FULL);
	}
	if (at_exit)
		return 0; /* next's period ends in on_exit, in its own context */

	__u32 ntid = direct ? next->pid : BPF_CORE_READ(next, pid);
	struct oc_start *s = start_of(next, ntid, direct);
	if (!s)
		return 0;
	__u64 delta = bpf_ktime_get_ns() - s->ts;
	struct stk_key k = {.kstack = s->kstack, .ustack = s->ustack, .uhash = s->uhash};
	start_end(s, ntid, direct);
	struct oc_wake_key wk = {};
	take_waker(ntid, &wk);
	if (!in_range(delta))
		return 0;
	k.pid = direct ? next->tgid : BPF_CORE_READ(next, tgid);
	k.tid = per_thread ? ntid : 0;
	if (direct)
		__builtin_memcpy(k.comm, next->comm, sizeof(k.comm));
	else
		BPF_CORE_READ_STR_INTO(&k.comm, next, comm);
	account(&k, &wk, delta);
	return 0;
}

/*
 * Right after a switch, in the context of the thread that now runs again
 * (sched_exit_tp fires as __schedule returns into it): its period is known
 * before any stack walk, and its stacks are the current ones, as they were
 * when it went off CPU.
 */
static __always_inline int on_exit(void *ctx, bool is_switch, bool direct)
{
	if (!is_switch)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = id;
	struct oc_start *s = start_of(current_task(direct), tid, direct);
	if (!s)
		return 0;
	__u64 end = s->end;
	if (!task_storage_ok(direct)) {
		__u32 zero = 0;
		__u64 *at = bpf_map_lookup_elem(&switch_at, &zero);
		end = at ? *at : 0;
	}
	if (end <= s->ts)
		end = bpf_ktime_get_ns();
	__u64 delta = end - s->ts;
	__u64 wdelta = s->wdelta;
	bool skip = s->skip;
	start_end(s, tid, direct);
	struct oc_wake_key wk = {};
	take_waker(tid, &wk);
	if (!in_range(delta))
		return 0;
	__u64 weight = delta;
	if (skip) {
		/*
		 * Left out at its wake-up (chance 1 - wdelta/T); it has since
		 * waited delta - wdelta for a CPU. A second chance of
		 * (min(delta, T) - wdelta) / (T - wdelta) makes its chance of
		 * being counted min(delta, T) / T in all, as in offcpu, so every
		 * counted period weighs max(delta, T): time in the run queue is
		 * never multiplied up by T / wdelta (which made totals swing by
		 * several percent on a busy host). Counted this way, its waker's
		 * stack is unknown.
		 */
		__u64 top = delta < sample_ns ? delta : sample_ns;
		if (top <= wdelta ||
		    (bpf_get_prandom_u32() % (__u32)(sample_ns - wdelta)) >= top - wdelta) {
			stat_add(OS_SAMPLED_OUT);
			return 0;
		}
		wk.waker.kstack = OC_WAKER_NOT_WALKED;
		stat_add(OS_NOT_WALKED);
	}
	if (wdelta && wdelta < sample_ns) {
		/* Kept at its wake-up, or at the second chance above: counted
		 * whatever its length now. */
		weight = delta < sample_ns ? sample_ns : delta;
	} else if (!wdelta && !keep(delta, &weight)) {
		stat_add(OS_SAMPLED_OUT);
		return 0;
	}
	if (weight != delta)
		stat_add(OS_SAMPLED);
	struct stk_key k = {};
	k.pid = id >> 32;
	STK_CAPTURE(ctx, &k, want_kernel, want_user, stk_stat);
	k.tid = per_thread ? tid : 0;
	bpf_get_current_comm(k.comm, sizeof(k.comm));
	account(&k, &wk, weight);
	return 0;
}

/* The waker: only for threads whose blocking is being timed (a start record
 * exists), so other wake-ups cost one lookup. With sampling, the decision
 * for the period is taken here (its length so far is known), so wake-ups of
 * periods that will not be kept take no stack either. */
static __always_inline int on_waking(void *ctx, struct task_struct *p, bool direct)
{
	if (!want_waker)
		return 0;
	__u32 tid = direct ? p->pid : BPF_CORE_READ(p, pid);
	struct oc_start *s = start_of(p, tid, direct);
	if (!s)
		return 0;
	if (at_exit && sample_ns) {
		if (s->wdelta)
			return 0; /* decided at its first wake-up */
		__u64 so_far = bpf_ktime_get_ns() - s->ts;
		__u64 w;
		if (!so_far)
			so_far = 1;
		s->wdelta = so_far;
		if (!keep(so_far, &w)) {
			s->skip = 1;
			return 0;
		}
	}
	struct stk_key tmp = {};
	__u64 id = bpf_get_current_pid_tgid();
	tmp.pid = id >> 32;
	bool user = want_user;
	if (user && woken_in_interrupt(ctx)) {
		user = false;
		stat_add(OS_IRQ_WAKERS);
	}
	STK_CAPTURE(ctx, &tmp, true, user, stk_stat);
	struct oc_waker w = {
	        .kstack = tmp.kstack, .ustack = tmp.ustack, .uhash = tmp.uhash, .pid = tmp.pid};
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

SEC("tp_btf/sched_exit_tp")
int BPF_PROG(btf_exit, bool is_switch)
{
	return on_exit(ctx, is_switch, true);
}

SEC("raw_tp/sched_exit_tp")
int BPF_PROG(raw_exit, bool is_switch)
{
	return on_exit(ctx, is_switch, false);
}

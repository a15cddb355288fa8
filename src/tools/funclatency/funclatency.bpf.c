// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * sonde funclatency and sonde slow: per-target latency histograms. Targets are user
 * functions (uprobe + uretprobe), syscalls (syscalls:sys_enter_X / sys_exit_X)
 * and softirqs (irq:softirq_entry / softirq_exit). Every probe carries its
 * target's index as the attach cookie. Function and syscall calls are timed
 * with a per-thread stack of entries, so recursion and nesting pair each
 * return with its own entry; softirqs, which do not nest on a CPU, per CPU.
 *
 * `slow` (over_ns > 0) adds: each call over the threshold goes to a ring
 * buffer with its caller's stack, and a perf_event sampler takes the stacks
 * of a thread only while it is inside a call already older than the
 * threshold (per CPU for softirqs).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "taskfilter.h"
#include "hist.h"
#include "funclatency.h"
#include "stacks.h"
#define SONDE_STATS_MAX FL_STAT_MAX
#include "stats.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* softirq vector -> target index + 1 (0: not traced). */
const volatile __u32 softirq_target[16] = {};
/* slow: the threshold (0: funclatency) and which stacks samples take. */
const volatile __u64 over_ns = 0;
const volatile bool want_kernel = true;
const volatile bool want_user = true;
/* sonde serve --labels cgroup: calls (not softirqs) also counted per
 * cgroup of the calling task, in `cg_hists`. */
const volatile bool by_cgroup = false;
/* The kernel has bpf_get_attach_cookie (5.15). Where it has not, the call
 * below is dead code the verifier never checks. */
const volatile bool has_cookie = true;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} slow_events SEC(".maps");

/* Referenced so the skeleton mirrors the layout. */
struct fl_slow_event _fl_slow_event = {};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 64); /* resized to the number of targets */
	__type(key, __u32);
	__type(value, struct sonde_hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct fl_stack);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fl_softirq);
} softirq_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048); /* 1 unless by_cgroup */
	__type(key, struct fl_cg_key);
	__type(value, struct sonde_hist);
} cg_hists SEC(".maps");

/* Referenced so the skeleton mirrors the layout. */
struct fl_cg_key _fl_cg_key = {};

static __always_inline void record(__u32 idx, __u64 ns)
{
	struct sonde_hist *h = bpf_map_lookup_elem(&hists, &idx);
	if (h)
		hist_add(h, ns);
}

/* A call of a task: also under its cgroup (serve's cgroup labels). */
static __always_inline void record_task(__u32 idx, __u64 ns)
{
	record(idx, ns);
	if (!by_cgroup)
		return;
	struct fl_cg_key k = {.cgroup = bpf_get_current_cgroup_id(), .idx = idx};
	struct sonde_hist *h = bpf_map_lookup_elem(&cg_hists, &k);
	if (!h) {
		/* Too big for the stack: inserted from an empty one in
		 * .rodata (a racing insert of the same key is fine). */
		static const struct sonde_hist empty = {};
		bpf_map_update_elem(&cg_hists, &k, &empty, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&cg_hists, &k);
		if (!h) {
			stat_add(FL_GROUPS_FULL);
			return;
		}
	}
	hist_add_shared(h, ns);
}

#define FL_STR_(x) #x
#define FL_STR(x)  FL_STR_(x)

/* The index of the target this probe times: its attach cookie, or the
 * constant user space put into this copy of the program (FL_IDX_MAGIC). */
static __always_inline __u32 target_of(void *ctx)
{
	if (has_cookie)
		return (__u32)bpf_get_attach_cookie(ctx);
	__u64 idx;
	asm volatile("%0 = " FL_STR(FL_IDX_MAGIC) : "=r"(idx));
	return (__u32)idx;
}

static __always_inline void stk_stat(__u32 s)
{
	stat_add(FL_STACKS + s);
}

/* slow: reports a call of `ns` to target `idx` that just returned, with the
 * kernel and/or user stack it returns to. */
static __always_inline void slow_call(void *ctx, __u32 idx, __u64 ns, __u64 now, bool kernel,
                                      bool user)
{
	if (!over_ns || ns < over_ns)
		return;
	struct fl_slow_event *e = bpf_ringbuf_reserve(&slow_events, sizeof(*e), 0);
	if (!e) {
		stat_add(FL_SLOW_LOST);
		return;
	}
	struct stk_key k = {};
	__u64 id = bpf_get_current_pid_tgid();
	k.pid = id >> 32;
	STK_CAPTURE(ctx, &k, kernel, user, stk_stat);
	e->end_ns = now;
	e->latency_ns = ns;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->idx = idx;
	e->ustack = k.ustack;
	e->uhash = k.uhash;
	e->kstack = k.kstack;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline bool wanted(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	return tf_wanted_current(id >> 32, (__u32)id);
}

static __always_inline int enter(__u32 idx)
{
	if (!wanted())
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct fl_stack *s = bpf_map_lookup_elem(&stacks, &tid);
	if (!s) {
		static const struct fl_stack empty = {};
		bpf_map_update_elem(&stacks, &tid, &empty, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&stacks, &tid);
		if (!s) {
			stat_add(FL_THREADS_FULL);
			return 0;
		}
	}
	__u32 d = s->depth;
	if (d >= FL_DEPTH || s->overflow) {
		s->overflow += 1;
		stat_add(FL_TOO_DEEP);
		return 0;
	}
	d &= FL_DEPTH - 1;
	s->ts[d] = bpf_ktime_get_ns();
	s->idx[d] = idx;
	s->depth = d + 1;
	return 0;
}

/* `kfunc`: a kernel function, whose slow calls keep the kernel stack too. */
static __always_inline int leave(void *ctx, __u32 idx, bool kfunc)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct fl_stack *s = bpf_map_lookup_elem(&stacks, &tid);
	if (!s)
		return 0; /* a thread we never timed (filtered, or began before) */
	if (s->overflow) {
		s->overflow -= 1;
		return 0;
	}
	__u32 d = s->depth;
	if (d == 0 || d > FL_DEPTH) {
		stat_add(FL_UNMATCHED);
		return 0;
	}
	/* The mask keeps older verifiers (6.1) sure of the bound. */
	d = (d - 1) & (FL_DEPTH - 1);
	if (s->idx[d] != idx) {
		/* Not the innermost entry: a return whose entry we did not see. */
		stat_add(FL_UNMATCHED);
		return 0;
	}
	__u64 ts = s->ts[d];
	s->depth = d;
	record_task(idx, now - ts);
	slow_call(ctx, idx, now - ts, now, kfunc, true);
	/* The entry stays (no delete per call); user space removes those of
	 * threads that are gone. */
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(fl_uentry)
{
	return enter(target_of(ctx));
}

SEC("uretprobe")
int BPF_URETPROBE(fl_ureturn)
{
	return leave(ctx, target_of(ctx), false);
}

/* The same as one uprobe.multi link per binary (kernels with it). */
SEC("uprobe.multi")
int BPF_UPROBE(fl_umentry)
{
	return enter(target_of(ctx));
}

SEC("uretprobe.multi")
int BPF_URETPROBE(fl_umexit)
{
	return leave(ctx, target_of(ctx), false);
}

SEC("tracepoint")
int fl_sys_enter(void *ctx)
{
	return enter(target_of(ctx));
}

SEC("tracepoint")
int fl_sys_exit(void *ctx)
{
	return leave(ctx, target_of(ctx), false);
}

/*
 * Kernel functions, timed on the thread that is current (a call from an
 * interrupt nests on the interrupted thread's stack and returns before it
 * resumes). fentry/fexit: user space loads these against the first target
 * and then loads their instructions again for every other function.
 */
SEC("fentry")
int BPF_PROG(fl_kentry)
{
	return enter(target_of(ctx));
}

SEC("fexit")
int BPF_PROG(fl_kexit)
{
	return leave(ctx, target_of(ctx), true);
}

/* kprobes: one kprobe.multi link for all functions, else one per function. */
SEC("kprobe.multi")
int BPF_KPROBE(fl_kmentry)
{
	return enter(target_of(ctx));
}

SEC("kretprobe.multi")
int BPF_KRETPROBE(fl_kmexit)
{
	return leave(ctx, target_of(ctx), true);
}

SEC("kprobe")
int BPF_KPROBE(fl_kpentry)
{
	return enter(target_of(ctx));
}

SEC("kretprobe")
int BPF_KRETPROBE(fl_kpexit)
{
	return leave(ctx, target_of(ctx), true);
}

static __always_inline int softirq_in(unsigned int vec)
{
	if (vec >= 16 || !softirq_target[vec & 15])
		return 0;
	__u32 zero = 0;
	struct fl_softirq *s = bpf_map_lookup_elem(&softirq_start, &zero);
	if (s) {
		s->ts = bpf_ktime_get_ns();
		s->vec = vec;
	}
	return 0;
}

static __always_inline int softirq_out(void *ctx, unsigned int vec)
{
	if (vec >= 16 || !softirq_target[vec & 15])
		return 0;
	__u32 zero = 0;
	struct fl_softirq *s = bpf_map_lookup_elem(&softirq_start, &zero);
	if (!s || !s->ts || s->vec != vec) {
		stat_add(FL_UNMATCHED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	record(softirq_target[vec & 15] - 1, now - s->ts);
	slow_call(ctx, softirq_target[vec & 15] - 1, now - s->ts, now, true, false);
	s->ts = 0;
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(fl_btf_softirq_entry, unsigned int vec)
{
	return softirq_in(vec);
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(fl_btf_softirq_exit, unsigned int vec)
{
	return softirq_out(ctx, vec);
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(fl_raw_softirq_entry, unsigned int vec)
{
	return softirq_in(vec);
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(fl_raw_softirq_exit, unsigned int vec)
{
	return softirq_out(ctx, vec);
}

/*
 * slow: a timer sample. Taken if this CPU is in a traced softirq older than
 * the threshold, or the current thread is inside a traced call older than
 * it (the innermost such call); counted per (process, target, stacks), the
 * target in the key's tid slot.
 */
SEC("perf_event")
int fl_sample(struct bpf_perf_event_data *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;
	__s64 target = -1;
	struct fl_softirq *si = bpf_map_lookup_elem(&softirq_start, &zero);
	if (si && si->ts && now - si->ts >= over_ns && si->vec < 16 && softirq_target[si->vec & 15])
		target = softirq_target[si->vec & 15] - 1;
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (target < 0 && tid) {
		struct fl_stack *s = bpf_map_lookup_elem(&stacks, &tid);
		if (s) {
			__u32 d = s->depth;
			for (int i = FL_DEPTH - 1; i >= 0; i--) {
				if ((__u32)i < d && now - s->ts[i] >= over_ns) {
					target = s->idx[i];
					break;
				}
			}
		}
	}
	if (target < 0) {
		stat_add(FL_SAMPLES_OUTSIDE);
		return 0;
	}
	struct stk_key k = {};
	k.pid = id >> 32;
	k.tid = (__u32)target + 1;
	bpf_get_current_comm(k.comm, sizeof(k.comm));
	STK_CAPTURE_SAMPLE(ctx, &k, want_kernel, want_user, stk_stat);
	STK_COUNT(&k, 1, stk_stat);
	stat_add(FL_SAMPLES);
	return 0;
}

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between funclatency.bpf.c and src/tools/funclatency/mod.rs. */
#ifndef SONDE_FUNCLATENCY_H
#define SONDE_FUNCLATENCY_H

#define FL_DEPTH 32 /* calls in flight per thread that are timed (a power of two) */

/* Kernels without attach cookies (before 5.15): user space loads one copy
 * of each probe program per target, with the 32-bit immediate of the one
 * `r = FL_IDX_MAGIC` instruction (target_of) replaced by the target's index. */
#define FL_IDX_MAGIC 0x5d1dc0de

/* A thread's calls in flight, innermost last. */
struct fl_stack {
	__u32 depth;    /* entries used in ts/idx */
	__u32 overflow; /* calls deeper than FL_DEPTH, not timed */
	__u64 ts[FL_DEPTH];
	__u32 idx[FL_DEPTH];
};

/* A softirq in flight on a CPU. */
struct fl_softirq {
	__u64 ts;
	__u32 vec;
	__u32 pad;
};

/* `slow`: one call over the threshold (ring buffer). */
struct fl_slow_event {
	__u64 end_ns; /* bpf_ktime_get_ns() at its return */
	__u64 latency_ns;
	__u32 pid;
	__u32 tid;
	__u32 idx;    /* target */
	__s32 ustack; /* user stack at its return: its caller's stack (stk_traces) */
	__s32 kstack; /* softirqs: kernel stack at its exit */
	char comm[16];
	__u32 pad;
	__u64 uhash; /* or: the walked user stack (unw_walked) */
};

/* serve --labels cgroup: a target's histogram per cgroup. */
struct fl_cg_key {
	__u64 cgroup;
	__u32 idx;
	__u32 pad;
};

enum fl_stat {
	FL_TOO_DEEP = 0,    /* calls nested deeper than FL_DEPTH: not timed */
	FL_THREADS_FULL,    /* no room for another thread's stack: not timed */
	FL_UNMATCHED,       /* returns without a timed entry (began before tracing) */
	FL_SLOW_LOST,       /* slow calls the ring buffer had no room for */
	FL_SAMPLES,         /* samples taken inside slow calls */
	FL_SAMPLES_OUTSIDE, /* samples of threads not in a slow call */
	FL_GROUPS_FULL,     /* calls not counted per cgroup: cg_hists full */
	FL_STACKS,          /* + enum stk_stat */
	FL_STAT_MAX = FL_STACKS + 4,
};

#endif

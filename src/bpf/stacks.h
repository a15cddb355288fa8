// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The stack engine's kernel half, shared by profile, offcpu, wakeup and slow:
 * stacks go to a stack-trace map (deduplicated by the kernel), samples are
 * counted in a hash keyed by (process, thread, comm, kernel stack, user
 * stack), so user space work grows with unique stacks, not samples.
 * User stacks are walked from unwind tables where user space loaded them
 * (unwind.h: unw_mode 1) and taken by frame pointers elsewhere.
 * Include after the libbpf headers (and bpf_core_read.h); the user half is
 * src/engine/stacks.rs.
 */
#ifndef SONDE_STACKS_H
#define SONDE_STACKS_H

#define STK_COMM_LEN  16
#define STK_MAX_DEPTH 127  /* PERF_MAX_STACK_DEPTH, the kernel's default limit */
#define STK_NONE      (-1) /* not captured (--user-only, --kernel-only, kernel thread) */

/* Errors bpf_get_stackid returns that STK_CAPTURE tells apart. */
#ifndef EEXIST
#define EEXIST 17
#endif
#ifndef EFAULT
#define EFAULT 14
#endif

struct stk_key {
	__u32 pid;    /* process (tgid) */
	__u32 tid;    /* thread, or 0 when not split by thread */
	__s32 kstack; /* id in stk_traces, or STK_NONE */
	__s32 ustack; /* id in stk_traces (frame pointers), or STK_NONE */
	__u64 uhash;  /* a walked user stack's key in unw_walked, or 0 */
	char comm[STK_COMM_LEN];
};

#include "unwind.h"

/* Why a stack is missing, counted per sample (slots after the tool's own). */
enum stk_stat {
	STK_COLLISION = 0, /* another stack held its hash bucket (-EEXIST) */
	STK_KERR,          /* kernel stack not captured (other error) */
	STK_UERR,          /* user stack not captured (other error) */
	STK_COUNTS_FULL,   /* the count map was full: sample lost */
	STK_STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384); /* resized by user space */
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STK_MAX_DEPTH * sizeof(__u64));
} stk_traces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* resized by user space */
	__type(key, struct stk_key);
	__type(value, __u64);
} stk_counts SEC(".maps");

/* Fills the stacks of `key` from `ctx`; `stat(slot)` counts failures. */
#define STK_CAPTURE(ctx, key, want_kernel, want_user, stat)                                        \
	do {                                                                                       \
		(key)->kstack = STK_NONE;                                                          \
		(key)->ustack = STK_NONE;                                                          \
		if (want_kernel) {                                                                 \
			long _id = bpf_get_stackid(ctx, &stk_traces, 0);                           \
			if (_id >= 0)                                                              \
				(key)->kstack = _id;                                               \
			else if (_id == -EEXIST)                                                   \
				stat(STK_COLLISION);                                               \
			else if (_id != -EFAULT)                                                   \
				stat(STK_KERR); /* -EFAULT: sample in user mode */                 \
		}                                                                                  \
		(key)->uhash = 0;                                                                  \
		if ((want_user) && (key)->pid &&                                                   \
		    !(unw_mode && unw_capture((key)->pid, &(key)->uhash))) {                       \
			long _id = bpf_get_stackid(ctx, &stk_traces, BPF_F_USER_STACK);            \
			unw_stat(UNW_S_HELPER);                                                    \
			if (_id >= 0)                                                              \
				(key)->ustack = _id;                                               \
			else if (_id == -EEXIST)                                                   \
				stat(STK_COLLISION);                                               \
			else if (_id != -EFAULT)                                                   \
				stat(STK_UERR); /* -EFAULT: no user context (kernel thread) */     \
		}                                                                                  \
	} while (0)

/*
 * Kernel code that rewrites a thread's saved user registers one at a time,
 * to enter a signal handler (x64_setup_rt_frame, arm64's setup_return) or
 * to return from one (restore_sigcontext, restore_sigframe): a sample
 * taken there can find the pc of one frame beside the stack pointer of
 * another, and a walk from them names frames the thread never had. Up to
 * STK_SIG_CODE [start, end) ranges from /proc/kallsyms, set by user space
 * (symbols.rs, signal_register_ranges); all zero, none is known.
 */
#define STK_SIG_CODE 8
const volatile __u64 stk_sig_code[STK_SIG_CODE * 2] = {};

/* The user stack of a sample taken in that code: not taken (the ustack id
 * user space shows as the kernel's signal delivery). */
#define STK_SIGNAL (-2)

static __always_inline bool stk_in_signal_code(__u64 ip)
{
	for (int i = 0; i < STK_SIG_CODE; i++)
		if (ip >= stk_sig_code[2 * i] && ip < stk_sig_code[2 * i + 1])
			return true;
	return false;
}

/* STK_CAPTURE for a perf event sample (`ctx` a struct bpf_perf_event_data):
 * no user stack walked from registers the kernel is rewriting. */
#define STK_CAPTURE_SAMPLE(ctx, key, want_kernel, want_user, stat)                                 \
	do {                                                                                       \
		bool _sig = (want_user) && stk_in_signal_code(PT_REGS_IP(&(ctx)->regs));           \
		STK_CAPTURE(ctx, key, want_kernel, (want_user) && !_sig, stat);                    \
		if (_sig && (key)->pid)                                                            \
			(key)->ustack = STK_SIGNAL;                                                \
	} while (0)

/* Adds `n` to the count of `key`. */
#define STK_COUNT(key, n, stat)                                                                    \
	do {                                                                                       \
		__u64 *_c = bpf_map_lookup_elem(&stk_counts, key);                                 \
		if (_c) {                                                                          \
			__sync_fetch_and_add(_c, n);                                               \
		} else {                                                                           \
			__u64 _one = n;                                                            \
			if (bpf_map_update_elem(&stk_counts, key, &_one, BPF_NOEXIST)) {           \
				_c = bpf_map_lookup_elem(&stk_counts, key);                        \
				if (_c)                                                            \
					__sync_fetch_and_add(_c, n);                               \
				else                                                               \
					stat(STK_COUNTS_FULL);                                     \
			}                                                                          \
		}                                                                                  \
	} while (0)

#endif

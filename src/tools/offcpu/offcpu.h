/* Shared between offcpu.bpf.c and src/tools/offcpu/mod.rs. */
#ifndef SONDE_OFFCPU_H
#define SONDE_OFFCPU_H

#include "stacks.h"


/* Where a thread went off CPU, kept until it runs again. */
struct oc_start {
	__u64 ts;
	__s32 kstack;
	__s32 ustack;
};

/* Who woke a thread (wakeup mode): taken at sched_waking, in the waker's
 * context (in interrupt context: the interrupted task's comm and pid). */
struct oc_waker {
	__s32 kstack;
	__s32 ustack;
	__u32 pid;
	char comm[STK_COMM_LEN];
	__u32 pad;
};

/* wakeup mode: a blocked stack and its waker. */
struct oc_wake_key {
	struct stk_key blocked;
	struct oc_waker waker;
};

enum oc_stat {
	OS_SWITCHES = 0, /* switches seen */
	OS_RECORDED,     /* blocked periods counted */
	OS_SHORT,        /* shorter than --min-block */
	OS_LONG,         /* longer than --max-block */
	OS_STARTS_FULL,  /* the start map was full: period lost */
	OS_MAX = OS_STARTS_FULL + 1 + STK_STAT_MAX,
};
#define OS_STACKS (OS_STARTS_FULL + 1) /* + enum stk_stat */

#endif

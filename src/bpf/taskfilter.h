// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Which tasks a tool looks at: -p (processes, a hash of tgids), --tid,
 * --cgroup and --comm, set by user space before load (the Rust half is
 * src/engine/taskfilter.rs). Checked before any costly work such as a stack
 * walk. Include after the libbpf headers.
 */
#ifndef SONDE_TASKFILTER_H
#define SONDE_TASKFILTER_H

#include <bpf/bpf_core_read.h>
#include "inlist.h"
#include "cgroupfilter.h"

#define TF_MAX_PIDS  64
#define TF_LIST_PIDS 16
#define TF_MAX_TIDS  16
#define TF_COMM_LEN  16

const volatile bool tf_filter_pids = false;
/* -p's processes inline when they are few and fixed (no children
 * followed): checked by comparisons, where a lookup in tf_pids costs a
 * hash of the key and its bucket's lines on every event of every other
 * task (0: use tf_pids). */
const volatile __u32 tf_n_pids = 0;
const volatile __u32 tf_pid_list[TF_LIST_PIDS] = {};
const volatile __u32 tf_n_tids = 0;
const volatile __u32 tf_tids[TF_MAX_TIDS] = {};
const volatile bool tf_filter_comm = false;
const volatile char tf_comm[TF_COMM_LEN] = {};
/* -- CMD: add the processes a watched process starts to tf_pids. */
const volatile bool tf_follow = false;

/* Processes to look at with -p (tgid -> 1); with tf_follow, their
 * children too (sized by user space). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TF_MAX_PIDS);
	__type(key, __u32);
	__type(value, __u8);
} tf_pids SEC(".maps");

/* Whether process `tgid` passes -p (true without -p). */
static __always_inline bool tf_pid_ok(__u32 tgid)
{
	if (!tf_filter_pids)
		return true;
	if (tf_n_pids)
		return IN_LIST(tf_pid_list, tf_n_pids, TF_LIST_PIDS, tgid);
	return bpf_map_lookup_elem(&tf_pids, &tgid) != NULL;
}

static __always_inline bool tf_comm_matches(const char *c)
{
	for (int i = 0; i < TF_COMM_LEN; i++) {
		if (c[i] != tf_comm[i])
			return false;
		if (!c[i])
			break;
	}
	return true;
}

/* Whether the task (tgid, tid), which must be the current task for the
 * cgroup and comm checks, is one we were asked about. */
static __always_inline bool tf_wanted_current(__u32 tgid, __u32 tid)
{
	if (!tf_pid_ok(tgid))
		return false;
	if (tf_n_tids && !IN_LIST(tf_tids, tf_n_tids, TF_MAX_TIDS, tid))
		return false;
	if (!cg_current_in())
		return false;
	if (tf_filter_comm) {
		char c[TF_COMM_LEN];
		bpf_get_current_comm(c, sizeof(c));
		if (!tf_comm_matches(c))
			return false;
	}
	return true;
}

/* Processes not followed: tf_pids was full. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} tf_lost SEC(".maps");

/* A new process forked by a watched one is watched too, from its first
 * instruction (a new thread shares its process's tgid, watched already). */
SEC("raw_tp/sched_process_fork")
int tf_fork(struct bpf_raw_tracepoint_args *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx->args[0];
	struct task_struct *child = (struct task_struct *)ctx->args[1];
	__u32 ptgid = BPF_CORE_READ(parent, tgid), tgid = BPF_CORE_READ(child, tgid);
	__u8 one = 1;
	if (tf_follow && tgid != ptgid && bpf_map_lookup_elem(&tf_pids, &ptgid) &&
	    bpf_map_update_elem(&tf_pids, &tgid, &one, BPF_ANY)) {
		__u32 k = 0;
		__u64 *n = bpf_map_lookup_elem(&tf_lost, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
	}
	return 0;
}

#endif

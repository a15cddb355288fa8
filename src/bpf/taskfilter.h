// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * Which tasks a tool looks at: -p (processes, a hash of tgids), --tid,
 * --cgroup and --comm, set by user space before load (the Rust half is
 * src/engine/taskfilter.rs). Checked before any costly work such as a stack
 * walk. Include after the libbpf headers.
 */
#ifndef SONDE_TASKFILTER_H
#define SONDE_TASKFILTER_H

#include "inlist.h"

#define TF_MAX_PIDS 64
#define TF_MAX_TIDS 16
#define TF_COMM_LEN 16

const volatile bool tf_filter_pids = false;
const volatile __u32 tf_n_tids = 0;
const volatile __u32 tf_tids[TF_MAX_TIDS] = {};
const volatile __u64 tf_cgroup_id = 0;
const volatile bool tf_filter_comm = false;
const volatile char tf_comm[TF_COMM_LEN] = {};

/* Processes to look at with -p (tgid -> 1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TF_MAX_PIDS);
	__type(key, __u32);
	__type(value, __u8);
} tf_pids SEC(".maps");

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
	if (tf_filter_pids && !bpf_map_lookup_elem(&tf_pids, &tgid))
		return false;
	if (tf_n_tids && !IN_LIST(tf_tids, tf_n_tids, TF_MAX_TIDS, tid))
		return false;
	if (tf_cgroup_id && bpf_get_current_cgroup_id() != tf_cgroup_id)
		return false;
	if (tf_filter_comm) {
		char c[TF_COMM_LEN];
		bpf_get_current_comm(c, sizeof(c));
		if (!tf_comm_matches(c))
			return false;
	}
	return true;
}

#endif

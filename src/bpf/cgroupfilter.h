// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * --cgroup, for every tool that takes it: a task is in the cgroup asked
 * for when that cgroup is its own or one of its ancestors, in the
 * hierarchy the path was given in: the unified one (cgroup v2), or the
 * hierarchy of a cgroup v1 controller (cpu, memory, ...). User space
 * (src/engine/cgroup.rs, CgroupTarget) sets the cgroup's kernfs id (its
 * directory's inode number), its depth below its hierarchy's root and the
 * controller's subsystem id (-1 for v2) before load. Include after the
 * libbpf headers.
 */
#ifndef SONDE_CGROUPFILTER_H
#define SONDE_CGROUPFILTER_H

#include <bpf/bpf_core_read.h>

/* The cgroup's kernfs id; 0: no --cgroup. */
const volatile __u64 cg_filter_id = 0;
/* Its depth: 0 is the hierarchy's root; CG_LEVEL_UNKNOWN where a cgroup
 * namespace hides how deep the mount's root is (its mountinfo root starts
 * with /..): then learnt by the first task found in the group. */
#define CG_LEVEL_UNKNOWN 0xffffffffu
#define CG_MAX_DEPTH     32
const volatile __u32 cg_filter_level = 0;
/* With CG_LEVEL_UNKNOWN: the depth learnt, plus 1 (0: not yet). */
__u32 cg_learnt_level = 0;
/* The cgroup v1 controller's subsystem id (its row in /proc/cgroups);
 * -1: the unified hierarchy (cgroup v2). */
const volatile __s32 cg_filter_ssid = -1;

/* Before Linux 6.2 a cgroup kept its ancestors' ids, not pointers. */
struct cgroup___ids {
	__u64 ancestor_ids[0];
} __attribute__((preserve_access_index));

/* Task `t`'s cgroup in the --cgroup hierarchy (NULL: none). */
static __always_inline struct cgroup *cg_of(struct task_struct *t)
{
	struct css_set *cs = BPF_CORE_READ(t, cgroups);
	if (cg_filter_ssid < 0)
		return BPF_CORE_READ(cs, dfl_cgrp);
	struct cgroup_subsys_state *css = NULL;
	bpf_core_read(&css, sizeof(css), &cs->subsys[cg_filter_ssid]);
	return BPF_CORE_READ(css, cgroup);
}

/* The id of `cg`'s ancestor at depth `level` (its own at its depth). */
static __always_inline __u64 cg_ancestor_id(struct cgroup *cg, __u32 level)
{
	__u64 id = 0;
	if (bpf_core_field_exists(struct cgroup___ids, ancestor_ids)) {
		struct cgroup___ids *old = (void *)cg;
		bpf_core_read(&id, sizeof(id), &old->ancestor_ids[level]);
	} else {
		struct cgroup *a = NULL;
		bpf_core_read(&a, sizeof(a), &cg->ancestors[level]);
		id = BPF_CORE_READ(a, kn, id);
	}
	return id;
}

/* Whether task `t` is in the --cgroup cgroup or below it (true without
 * --cgroup). Probe reads only: any program type, any task. */
static __always_inline bool cg_task_in(struct task_struct *t)
{
	if (!cg_filter_id)
		return true;
	struct cgroup *cg = cg_of(t);
	if (!cg)
		return false;
	int have = BPF_CORE_READ(cg, level);
	__u32 level = cg_filter_level;
	if (level == CG_LEVEL_UNKNOWN) {
		if (!cg_learnt_level) {
			/* Up the task's ancestors until the group is found
			 * (by their parent pointers: the ancestor arrays'
			 * two forms, read in a loop, defeat CO-RE's pruning). */
			struct cgroup *a = cg;
			for (int i = 0; i < CG_MAX_DEPTH && a; i++) {
				if (BPF_CORE_READ(a, kn, id) == cg_filter_id) {
					cg_learnt_level = have - i + 1;
					return true;
				}
				a = BPF_CORE_READ(a, self.parent, cgroup);
			}
			return false;
		}
		level = cg_learnt_level - 1;
	}
	if (have < (int)level)
		return false;
	return cg_ancestor_id(cg, level) == cg_filter_id;
}

/* The same for the current task. */
static __always_inline bool cg_current_in(void)
{
	if (!cg_filter_id)
		return true;
	return cg_task_in((struct task_struct *)bpf_get_current_task());
}

#endif

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The runtimes' kernel halves, registered: each runtime is a folder beside
 * this file whose walker header includes the contract (contract.h,
 * src/bpf/unwind_state.h) and defines
 *
 * - a walker, `void NAME(__u32 slot)`, run after the native walk when that
 *   marked frames in the runtime's interpreter loop: it reads the thread's
 *   frame chain into rt_scratch[slot].st; and/or
 * - a stepper, `int NAME(__u32 slot)`, run by the native walk on a frame
 *   whose pc lies in code the runtime generates (rt_proc.jit_*): it records
 *   the frame's language frames, marks the native frame, and moves the walk
 *   to the caller (nonzero: the walk ends there; negative: not its frame,
 *   the native walk goes on).
 *
 * Adding a runtime: its kind (enum rt_kind, contract.h), its walker header
 * and its row in RT_RUNTIMES below. User space has the matching list (src/engine/runtime/registry.rs).
 */
#ifndef SONDE_RUNTIMES_H
#define SONDE_RUNTIMES_H

#include "unwind_state.h"

#include "python/python_walk.h"
#include "java/hotspot_walk.h"
#include "v8/v8_walk.h"

/* Neither a walker nor a stepper. */
#define RT_NO_WALK(slot) ((void)0)
#define RT_NO_STEP(slot) (-1)

/* kind, walker, stepper. */
#define RT_RUNTIMES(X)                                                                             \
	X(RT_PYTHON, py_walk, RT_NO_STEP)                                                          \
	X(RT_JAVA, RT_NO_WALK, hs_step)                                                            \
	X(RT_V8, RT_NO_WALK, v8_step)

#define RT_WALK_CASE(kind, walk, step)                                                             \
	case kind:                                                                                 \
		walk(slot);                                                                        \
		break;
#define RT_STEP_CASE(kind, walk, step)                                                             \
	case kind:                                                                                 \
		return step(slot);

/*
 * Reads the language frames of the current thread into rt_scratch[slot].st
 * (set up by unw_capture: cfg, fsbase, marks, and an empty stack, or the
 * frames a stepper recorded during the native walk). Global, so the
 * verifier checks it once.
 */
__noinline int rt_walk(__u32 slot)
{
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!r)
		return 0;
	r->st.kind = r->cfg.kind;
	r->sb_n = 0;
	for (int i = 0; i < RT_CODES; i++)
		r->cc_addr[i] = 0;
	rt_stat(RT_S_WALKS, 1);
	switch (r->cfg.kind) {
		RT_RUNTIMES(RT_WALK_CASE)
	default:
		break;
	}
	rt_stat(RT_S_FRAMES, r->st.n);
	if (r->st.end < RT_END_MAX)
		rt_stat(RT_S_END + r->st.end, 1);
	return 0;
}

/* Steps a frame in generated code of runtime `kind`; nonzero when the walk
 * ends there, negative when no stepper takes it (the native walk goes on). */
static __always_inline int rt_jit_step(__u32 slot, __u32 kind)
{
	switch (kind) {
		RT_RUNTIMES(RT_STEP_CASE)
	default:
		return -1;
	}
}

/* Hands the code objects of a new stack to user space (rt_seen). */
__noinline int rt_note(__u32 slot, __u32 pid)
{
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!r)
		return 0;
	__u32 n = r->st.n;
	__u8 key_flags = r->cfg.key_flags, key_loc = r->cfg.key_loc;
	struct rt_seen_key k = {};
	__u8 one = 1;
	k.pid = pid;
	for (int i = 0; i < RT_MAX_FRAMES; i++) {
		if (i >= n)
			break;
		struct rt_frame *f = &r->st.f[i];
		k.addr = f->addr;
		k.cookie = f->cookie;
		k.kind = f->kind;
		k.flags = f->flags & key_flags;
		k.loc = (k.flags & key_loc) ? f->loc : 0;
		if (bpf_map_lookup_elem(&rt_seen, &k))
			continue;
		if (bpf_map_update_elem(&rt_seen, &k, &one, BPF_NOEXIST) &&
		    !bpf_map_lookup_elem(&rt_seen, &k))
			rt_stat(RT_S_SEEN_FULL, 1);
	}
	return 0;
}

#endif

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * CPython's frame chain, read in the kernel (types in python.h; dispatched
 * by runtime.h's rt_walk). The thread state comes from the thread's own
 * thread-specific data, as PyGILState_GetThisThreadState finds it
 * (pthread_getspecific of autoTSSkey), so it works for threads that do not
 * hold the GIL (blocked ones) and never stops or signals the process.
 * Per frame: one read of the frame, one of its code object's head (type
 * check and cookie).
 */
#ifndef SONDE_PYTHON_WALK_H
#define SONDE_PYTHON_WALK_H

/* The thread's current frame into r->frame; nonzero (with st.end) if none. */
static __always_inline int py_begin(struct rt_state *r)
{
	struct py_proc *c = &r->cfg.py;
	__u32 key = c->key;
	__u64 at;
	if (key < 32) {
		at = r->fsbase + c->tsd + key * 16 + 8;
	} else {
		/* glibc's second level: specific[key / 32] follows the first block */
		__u64 second = 0;
		if (key >= 1024 ||
		    bpf_probe_read_user(&second, 8,
		                        (void *)(r->fsbase + c->tsd + 32 * 16 + (key / 32) * 8))) {
			r->st.end = RT_END_READ;
			return 1;
		}
		if (!second) {
			r->st.end = RT_END_NO_THREAD;
			return 1;
		}
		at = second + (key % 32) * 16 + 8;
	}
	__u64 ts = 0, f = 0;
	if (bpf_probe_read_user(&ts, 8, (void *)at)) {
		r->st.end = RT_END_READ;
		return 1;
	}
	if (!ts) {
		r->st.end = RT_END_NO_THREAD;
		return 1;
	}
	if (bpf_probe_read_user(&f, 8, (void *)(ts + c->ts_frame))) {
		r->st.end = RT_END_READ;
		return 1;
	}
	if (c->model == PY_CFRAME_ENTRY || c->model == PY_CFRAME_OWNER) {
		if (!f) {
			r->st.end = RT_END_NO_THREAD;
			return 1;
		}
		if (bpf_probe_read_user(&f, 8, (void *)(f + c->cf_frame))) {
			r->st.end = RT_END_READ;
			return 1;
		}
	}
	r->frame = f;
	return 0;
}

/* One frame of the chain; nonzero when the walk ends. */
__noinline int py_step(__u32 slot)
{
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!r)
		return 1;
	struct py_proc *c = &r->cfg.py;
	__u64 frame = r->frame;
	if (!frame) {
		r->st.end = RT_END_DONE;
		return 1;
	}
	if (r->st.n >= RT_MAX_FRAMES) {
		r->st.end = RT_END_DEPTH;
		return 1;
	}
	__u32 size = c->frame_read;
	if (size == 0 || size > RT_BUF)
		size = RT_BUF;
	if (bpf_probe_read_user(r->buf, size, (void *)frame)) {
		r->st.end = RT_END_READ;
		return 1;
	}
	__u64 code = rt_u64(r->buf, c->f_code);
	r->frame = rt_u64(r->buf, c->f_back);
	__u8 flags = 0;
	if (c->model == PY_FRAMEOBJECT) {
		flags = RT_F_ENTRY;
	} else if (c->model == PY_CFRAME_ENTRY) {
		flags = rt_u8(r->buf, c->f_entry) ? RT_F_ENTRY : 0;
	} else if (rt_u8(r->buf, c->f_entry) == PY_OWNED_BY_CSTACK) {
		/* A shim: the frames below it (leaf side) were one call's. */
		__u16 n = r->st.n;
		if (n > 0)
			r->st.f[(n - 1) & (RT_MAX_FRAMES - 1)].flags |= RT_F_ENTRY;
		return 0;
	}
	__u32 loc;
	if (c->model == PY_FRAMEOBJECT) {
		loc = rt_u32(r->buf, c->f_instr); /* f_lasti, -1 before the first instruction */
	} else {
		__u64 ip = rt_u64(r->buf, c->f_instr);
		loc = (ip >= code && ip - code < (1ULL << 31)) ? (__u32)(ip - code) : 0xffffffff;
	}
	if (!code || bpf_probe_read_user(r->code, 80, (void *)code)) {
		r->st.end = RT_END_READ;
		return 1;
	}
	if (rt_u64(r->code, 8) != c->code_type) {
		/* 3.13: a frame may run something other than a code object */
		if (c->model == PY_DIRECT_OWNER)
			return 0;
		r->st.end = RT_END_BAD_FRAME;
		return 1;
	}
	__u16 cookie = py_cookie(rt_u32(r->code, c->co_argcount),
	                         rt_u32(r->code, c->co_firstlineno), rt_u32(r->code, c->co_flags));
	if (!rt_push(r, code, loc, cookie, flags, RT_PYTHON)) {
		r->st.end = RT_END_DEPTH;
		return 1;
	}
	return 0;
}

/* Python's frames of the current thread into rt_scratch[slot].st. */
static __always_inline void py_walk(__u32 slot)
{
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!r || py_begin(r))
		return;
	/* Shim frames take steps without adding a frame: twice the room. */
	for (int i = 0; i < 2 * RT_MAX_FRAMES; i++)
		if (py_step(slot))
			return;
	r->st.end = RT_END_DEPTH;
}

#endif

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * CPython's frame chain, read in the kernel (types in python.h; registered
 * in runtimes.h as RT_PYTHON's walker). The thread state comes from where
 * PyGILState_GetThisThreadState finds it: the thread's own thread-specific
 * data for autoTSSkey (up to 3.14), or the thread-local variable that holds
 * it (3.15), so it works for threads that do not hold the GIL (blocked
 * ones) and never stops or signals the process.
 * Reads of the process's memory are most of the walk's cost (a helper call
 * each): frames that lie next to each other on the data stack (3.11+) come
 * RT_SBUF bytes at a time, and a code object's head (type check and
 * cookie) is read once per walk however often it recurs.
 */
#ifndef SONDE_PYTHON_WALK_H
#define SONDE_PYTHON_WALK_H

#include "contract.h"
#include "python.h"

/* The thread's current frame into r->frame; nonzero (with st.end) if none. */
static __always_inline int py_begin(struct rt_state *r)
{
	struct py_proc *c = RT_PART(r, struct py_proc);
	__u32 key = c->key;
	__u64 at;
	if (c->ts_tls) {
		at = r->fsbase + c->tsd;
	} else if (key < 32) {
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

/* Makes the `size` bytes of the frame at `frame` readable at r->sb +
 * returned offset; negative if unreadable. 3.11+ frames live on the
 * thread's data stack, each caller just below its callee: read RT_SBUF
 * bytes ending at the frame, and the next frames are often in them. */
static __always_inline long py_read_frame(struct rt_state *r, __u64 frame, __u32 size)
{
	__u64 off = frame - r->sb_at;
	if (r->sb_n && frame >= r->sb_at && off + size <= r->sb_n)
		return off;
	__u64 start = frame + size - RT_SBUF;
	if (RT_PART(r, struct py_proc)->model != PY_FRAMEOBJECT && frame + size >= RT_SBUF &&
	    bpf_probe_read_user(r->sb, RT_SBUF, (void *)start) == 0) {
		r->sb_at = start;
		r->sb_n = RT_SBUF;
		return RT_SBUF - size;
	}
	/* 3.8-3.10's frames are objects of their own; or the bytes below are
	 * not mapped (the data stack's first chunk starts there) */
	if (bpf_probe_read_user(r->sb, size & (RT_BUF - 1), (void *)frame))
		return -1;
	r->sb_at = frame;
	r->sb_n = size;
	return 0;
}

/* A field of the frame at r->sb + `at` (`at` + the field's offset within
 * what py_read_frame made readable). */
static __always_inline __u64 py_f64(struct rt_state *r, __u64 at)
{
	__u64 v = 0;
	if (at <= RT_SBUF - 8)
		__builtin_memcpy(&v, r->sb + (at & (RT_SBUF - 1)), 8);
	return v;
}

static __always_inline __u32 py_f32(struct rt_state *r, __u64 at)
{
	__u32 v = 0;
	if (at <= RT_SBUF - 4)
		__builtin_memcpy(&v, r->sb + (at & (RT_SBUF - 1)), 4);
	return v;
}

static __always_inline __u8 py_f8(struct rt_state *r, __u64 at)
{
	return at < RT_SBUF ? r->sb[at & (RT_SBUF - 1)] : 0;
}

/* One frame of the chain; nonzero when the walk ends. */
__noinline int py_step(__u32 slot)
{
	struct rt_state *r = bpf_map_lookup_elem(&rt_scratch, &slot);
	if (!r)
		return 1;
	struct py_proc *c = RT_PART(r, struct py_proc);
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
	if (size == 0 || size >= RT_BUF)
		size = RT_BUF - 8;
	long at = py_read_frame(r, frame, size);
	if (at < 0 || at > RT_SBUF) {
		r->st.end = RT_END_READ;
		return 1;
	}
	__u64 code = py_f64(r, at + c->f_code) & ~(__u64)c->exec_tag;
	r->frame = py_f64(r, at + c->f_back);
	__u8 flags = 0;
	if (c->model == PY_FRAMEOBJECT) {
		flags = RT_F_ENTRY;
	} else if (c->model == PY_CFRAME_ENTRY) {
		flags = py_f8(r, at + c->f_entry) ? RT_F_ENTRY : 0;
	} else {
		__u8 owner = py_f8(r, at + c->f_entry);
		if (owner == PY_OWNED_BY_CSTACK) {
			/* A shim: the frames below it (leaf side) were one call's. */
			__u16 n = r->st.n;
			if (n > 0)
				r->st.f[(n - 1) & (RT_MAX_FRAMES - 1)].flags |= RT_F_ENTRY;
			return 0;
		}
		if (owner > PY_OWNED_BY_CSTACK)
			return 0; /* not a Python frame (3.14's C-stack owner) */
	}
	__u32 loc;
	if (c->model == PY_FRAMEOBJECT) {
		loc = py_f32(r, at + c->f_instr); /* f_lasti, -1 before the first instruction */
	} else {
		__u64 ip = py_f64(r, at + c->f_instr);
		loc = (ip >= code && ip - code < (1ULL << 31)) ? (__u32)(ip - code) : 0xffffffff;
	}
	__u32 ci = ((code >> 4) ^ (code >> 9)) & (RT_CODES - 1);
	__u16 cookie;
	if (code && r->cc_addr[ci] == code) {
		cookie = r->cc_cookie[ci];
	} else {
		__u32 head = c->code_read;
		if (head < 16 || head > RT_BUF)
			head = RT_BUF;
		if (!code || bpf_probe_read_user(r->code, head, (void *)code)) {
			r->st.end = RT_END_READ;
			return 1;
		}
		if (rt_u64(r->code, 8) != c->code_type) {
			/* 3.13 on: a frame may run something other than a code object */
			if (c->model == PY_DIRECT_OWNER)
				return 0;
			r->st.end = RT_END_BAD_FRAME;
			return 1;
		}
		cookie =
		        py_cookie(rt_u32(r->code, c->co_argcount),
		                  rt_u32(r->code, c->co_firstlineno), rt_u32(r->code, c->co_extra));
		r->cc_addr[ci] = code;
		r->cc_cookie[ci] = cookie;
	}
	if (!rt_push(r, code, loc, cookie, flags)) {
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

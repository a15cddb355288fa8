// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * CPython: what the kernel needs to read a thread's Python frames, filled
 * per process by src/engine/runtime/python/ from the interpreter's own
 * description of its structures (_Py_DebugOffsets, 3.13 on; a table for
 * older versions) and from the process's memory (how a thread's state is
 * found: the thread-state key and where glibc keeps thread-specific data,
 * or the thread-local variable that holds it). The walker is python_walk.h.
 */
#ifndef SONDE_PYTHON_H
#define SONDE_PYTHON_H

/* How a build chains its frames (py_proc.model). */
enum py_model {
	PY_FRAMEOBJECT =
	        0,       /* 3.8-3.10: tstate->frame, PyFrameObject, one per interpreter-loop call */
	PY_CFRAME_ENTRY, /* 3.11: tstate->cframe->current_frame, is_entry marks a call's first frame */
	PY_CFRAME_OWNER, /* 3.12: tstate->cframe->current_frame, a C-stack-owned shim ends a call */
	PY_DIRECT_OWNER, /* 3.13 on: tstate->current_frame, shims as 3.12 */
};

/* _PyInterpreterFrame.owner of a shim frame, which ends one interpreter
 * call's frames (3.12 on: FRAME_OWNED_BY_CSTACK, 3.14's _INTERPRETER);
 * owners above it are not Python frames either. */
#define PY_OWNED_BY_CSTACK 3

struct py_proc {
	/* ts_tls 0: glibc's struct pthread.specific_1stblock, from the thread
	 * pointer; 1: the thread-local variable holding the thread state, from
	 * the thread pointer (3.15's _Py_tss_gilstate). */
	__u64 tsd;
	__u64 code_type; /* &PyCode_Type */
	__u32 key;       /* the pthread key of _PyRuntime's autoTSSkey */
	__u8 model;      /* enum py_model */
	__u8 frame_read; /* bytes of a frame to read (at most RT_BUF) */
	__u16 ts_frame;  /* PyThreadState: frame, cframe or current_frame */
	__u16 cf_frame;  /* _PyCFrame.current_frame */
	__u16 f_code;    /* frame: f_code or f_executable (exec_tag: a tagged _PyStackRef) */
	__u16 f_back;    /* frame: f_back or previous */
	__u16 f_instr;   /* frame: f_lasti (int) or prev_instr / instr_ptr */
	__u16 f_entry;   /* frame: is_entry or owner (a byte) */
	__u16 co_argcount;
	__u16 co_firstlineno;
	__u16 co_extra; /* a third field for the cookie: co_flags, or co_name (3.13 on) */
	__u8 ts_tls;    /* see tsd */
	__u8 code_read; /* bytes of a code object's head to read (its type and the cookie's fields) */
	__u8 exec_tag; /* low bits of f_executable that tag it (3.14's Py_TAG_BITS), masked off */
	__u8 pad[5];
};

/* The cookie of a code object (src/engine/runtime/python/mod.rs computes
 * the same from the process's memory). */
static __always_inline __u16 py_cookie(__u32 argcount, __u32 firstlineno, __u32 extra)
{
	__u32 h = (argcount * 0x9e3779b1u) ^ (firstlineno * 0x85ebca6bu) ^ (extra * 0xc2b2ae35u);
	return (__u16)(h ^ (h >> 16));
}

#endif

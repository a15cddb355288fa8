// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * V8 (Node.js): what the kernel needs to tell JavaScript frames apart and
 * record what names them, filled per process by src/engine/runtime/v8/ from
 * the postmortem metadata V8 builds into the binary (the v8dbg_ symbols)
 * and from the process's mappings: where the interpreter's code lies (its
 * entry trampolines and bytecode handlers, in the binary's embedded builtins
 * and in the copy V8 maps into its code range), where the builtins lie, and
 * the offsets of the JSFunction and Code fields the walk reads. The walker
 * is v8_walk.h.
 */
#ifndef SONDE_V8_H
#define SONDE_V8_H

#define V8_INTERP 8 /* interpreter code ranges (trampolines, bytecode handlers; two copies) */
#define V8_BLOBS  2 /* the embedded builtins: in the binary, and V8's copy in its code range */

/* rt_frame.flags of a JavaScript frame:
 * - INTERP: interpreted; addr the SharedFunctionInfo, loc the bytecode-offset slot's value
 * - CODE: optimized; addr the Code, loc the pc's offset in its instructions
 * - BASELINE: addr the SharedFunctionInfo, loc the pc's offset in its Code
 * - PC: in generated code other than the function's current code (on-stack
 *   replacement, code thrown away); addr the SharedFunctionInfo, loc pc - pc_base
 * - LEAF: the sampled instruction, not a return address */
#define V8_F_INTERP   2
#define V8_F_CODE     4
#define V8_F_BASELINE 8
#define V8_F_PC       16
#define V8_F_LEAF     32

/* Frame slots below the frame pointer (x86-64, V8 9 and later; user space
 * checks them against the binary's v8dbg_off_fp_* before it hands a
 * process over). */
#define V8_FP_CONTEXT         8  /* the context, or a typed frame's marker (a Smi) */
#define V8_FP_FUNCTION        16 /* the JSFunction */
#define V8_FP_BYTECODE_ARRAY  32 /* interpreted frames: the BytecodeArray */
#define V8_FP_BYTECODE_OFFSET 40 /* ... and the offset of the current bytecode (a Smi) */

struct v8_proc {
	__u64 interp_lo[V8_INTERP];
	__u64 interp_hi[V8_INTERP];
	__u64 blob_lo[V8_BLOBS];
	__u64 blob_hi[V8_BLOBS];
	__u64 pc_base;   /* V8_F_PC frames' loc is pc - pc_base */
	__u16 fn_shared; /* JSFunction::shared */
	__u16 fn_code;   /* JSFunction::code (0: none, see fn_dispatch) */
	__u16 code_start; /* Code: the instructions' address, or where they start in it (code_inline) */
	__u16 code_size;  /* Code: instruction size (int32) */
	__u16 code_flags; /* Code: flags, CodeKind in (flags >> kind_shift) & kind_mask */
	__u16 sfi_name;   /* SharedFunctionInfo::name_or_scope_info (V8_F_PC frames' cookie) */
	__u8 code_inline; /* 1: the instructions start code_start bytes into the Code (V8 10) */
	__u8 kind_shift;
	__u8 kind_mask;
	__u8 kind_baseline; /* CodeKind::BASELINE; MAGLEV and TURBOFAN follow it */
	__u8 ninterp;
	__u8 nblobs;
	__u16 fn_dispatch; /* JSFunction::dispatch_handle, where its code is reached through the table */
	/* The dispatch table (leaptiering, V8 13 on; 0: none, or not found yet:
	 * a frame in generated code is then recorded with its pc): a handle is
	 * the entry's index shifted left by handle_shift, an entry
	 * dispatch_entry bytes, its code at dispatch_code shifted left by
	 * code_shift. */
	__u64 dispatch_base;
	__u32 dispatch_entries;
	__u8 dispatch_entry;
	__u8 dispatch_code;
	__u8 handle_shift;
	__u8 code_shift;
};

/* A Code object's cookie (src/engine/runtime/v8/mod.rs computes the same
 * from the process's memory). */
static __always_inline __u16 v8_code_cookie(__u64 start, __u32 size)
{
	__u32 h = (__u32)(start >> 6) * 0x9e3779b1u ^ size * 0x85ebca6bu;
	return (__u16)(h ^ (h >> 16));
}

#endif

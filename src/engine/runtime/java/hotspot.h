// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * HotSpot (OpenJDK's JVM): what the kernel needs to step through Java
 * frames, filled per process by src/engine/runtime/java/ from the JVM's own
 * exported structure tables (gHotSpotVMStructs, gHotSpotVMTypes): where its
 * code heaps and their segment maps lie, where the template interpreter's
 * code is, and the offsets of the CodeBlob, nmethod, Method and ConstMethod
 * fields the walk reads. The walker is hotspot_walk.h.
 */
#ifndef SONDE_HOTSPOT_H
#define SONDE_HOTSPOT_H

#define HS_HEAPS 4 /* code heaps: non-nmethods, profiled, non-profiled (one if not segmented) */

/* rt_frame.flags of a Java frame */
#define HS_F_INTERP 2 /* interpreted: addr is the Method*, loc the bytecode index */
#define HS_F_LEAF   4 /* compiled, the sampled instruction (not a return address) */

struct hs_proc {
	__u64 heap_lo[HS_HEAPS]; /* each code heap's reserved range */
	__u64 heap_hi[HS_HEAPS];
	__u64 segmap[HS_HEAPS]; /* its segment map: a byte per segment */
	__u64 interp_lo;        /* the template interpreter's code */
	__u64 interp_hi;
	__u8 log2seg[HS_HEAPS]; /* log2 of a heap's segment size */
	__u8 nheaps;
	__u8 code_abs; /* CodeBlob's code start: 1 an address (JDK 9-22), 0 an int offset from the blob */
	__u8 fc_bytes;           /* bytes of CodeBlob::_frame_complete_offset: 4, or 2 (JDK 23+) */
	__u8 blob_head;          /* sizeof(HeapBlock): a blob follows its heap block's header */
	__u16 cb_size;           /* CodeBlob::_size */
	__u16 cb_code;           /* CodeBlob::_code_begin or _code_offset */
	__u16 cb_frame_size;     /* CodeBlob::_frame_size (words) */
	__u16 cb_frame_complete; /* CodeBlob::_frame_complete_offset */
	__u16 nm_compile_id;     /* nmethod::_compile_id */
	__u16 m_const;           /* Method::_constMethod */
	__u16 cm_size;           /* sizeof(ConstMethod): the bytecodes follow it */
	__u16 cm_code_size;      /* ConstMethod::_code_size */
	__u8 bcp_slot;           /* an interpreted frame's bytecode pointer: fp - 8 * this */
	__u8 bcp_alt;            /* or here (0: nowhere else), the one inside the bytecodes */
	__u16 nm_vep;            /* nmethod's verified entry point (0: not known) */
	__u8 vep_abs; /* 1: it is an address (JDK 9-22); 0: a 16-bit offset from the code (23+) */
	__u8 pad;
	__u16 nm_osr; /* nmethod::_osr_entry_point (0: not known) */
};

#endif

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * What differs between the architectures the programs are built for, in one
 * place: a thread's saved user registers and its thread pointer. One of
 * __TARGET_ARCH_x86 and __TARGET_ARCH_arm64 is defined by libbpf-cargo from
 * the build's target (make static-arm64 builds the arm64 one).
 */
#ifndef SONDE_ARCH_H
#define SONDE_ARCH_H

#if defined(__TARGET_ARCH_x86)
/* User pc, stack and frame pointer of a struct pt_regs. */
#define ARCH_PC(r)               ((r)->ip)
#define ARCH_SP(r)               ((r)->sp)
#define ARCH_FP(r)               ((r)->bp)
/* 64-bit user mode: the code segment is __USER_CS. */
#define ARCH_USER64(r)           ((r)->cs == 0x33)
/* The system call the thread is in, -1 for none (an interrupt). */
#define ARCH_SYSCALL_NR(r)       ((long)(r)->orig_ax)
/* A system call's first three arguments, at its entry and its exit. */
#define ARCH_SYSCALL_A0(r)       ((r)->di)
#define ARCH_SYSCALL_A1(r)       ((r)->si)
#define ARCH_SYSCALL_A2(r)       ((r)->dx)
/* The user thread pointer (TLS base) of a task. */
#define ARCH_TLS_BASE(task)      BPF_CORE_READ(task, thread.fsbase)
/* No link register: a call pushes the return address. */
#define ARCH_LR(r)               0
#define ARCH_HAS_LR              0
/* The system call instruction (syscall, 0f 05) ends right before the pc a
 * task in a system call stands at. */
#define ARCH_SYSCALL_INSN_LEN    2
#define ARCH_IS_SYSCALL_INSN(v)  (((v)&0xffff) == 0x050f)
/* A table row's CFA offset, saved-rbp offset and return address offset
 * (src/engine/unwind/table.rs): the return address is at CFA - 8. */
#define ARCH_ROW_OFF(row)        ((__s64)(__s32)((row) >> 32))
#define ARCH_ROW_FP_OFF(row)     ((__s64)(__s8)((row) >> 24) * 8)
#define ARCH_ROW_RA_OFF(row)     (-8)
/* __restore_rt: sp is the ucontext; uc_mcontext at +40 holds rbp (+80),
 * rsp (+120) and rip (+128) of the interrupted code. */
#define ARCH_SIG_FP              120
#define ARCH_SIG_SP              160
#define ARCH_SIG_PC              168
#define ARCH_SIG_LR              0
#define ARCH_TABLE_WALK          1
/* Go's cgocallback row (Cfa::GoCallback): a byte each, the TLS offset
 * signed (it is below the thread pointer). */
#define ARCH_GO_CB_CFA(off)      ((__u32)(off)&0xff)
#define ARCH_GO_CB_GM(off)       (((__u32)(off) >> 8) & 0xff)
#define ARCH_GO_CB_SCHED_SP(off) (((__u32)(off) >> 16) & 0xff)
#define ARCH_GO_CB_TLS(off)      ((__s64)(__s8)(((__u32)(off) >> 24) & 0xff))
#elif defined(__TARGET_ARCH_arm64)
#define ARCH_PC(r)               ((r)->pc)
#define ARCH_SP(r)               ((r)->sp)
#define ARCH_FP(r)               ((r)->regs[29])
/* EL0 in AArch64 state: mode bits PSR_MODE_EL0t (0), not PSR_MODE32_BIT. */
#define ARCH_USER64(r)           (((r)->pstate & 0x1f) == 0)
#define ARCH_SYSCALL_NR(r)       ((long)(r)->syscallno)
/* x0 holds the return value at exit: the kernel keeps the first argument
 * in orig_x0 from the entry on. */
#define ARCH_SYSCALL_A0(r)       ((r)->orig_x0)
#define ARCH_SYSCALL_A1(r)       ((r)->regs[1])
#define ARCH_SYSCALL_A2(r)       ((r)->regs[2])
#define ARCH_TLS_BASE(task)      BPF_CORE_READ(task, thread.uw.tp_value)
/* The link register x30: the return address of a function that has not
 * saved it yet (its prologue, a leaf). */
#define ARCH_LR(r)               ((r)->regs[30])
#define ARCH_HAS_LR              1
/* svc #0 */
#define ARCH_SYSCALL_INSN_LEN    4
#define ARCH_IS_SYSCALL_INSN(v)  ((__u32)(v) == 0xd4000001)
/* One save slot (bits 24-39, in 8s): the return address's when it is saved
 * (bits 22-23 are 0), x29 then 8 below it; x29's otherwise. */
#define ARCH_ROW_OFF(row)        ((__s64)(row) >> 40)
#define ARCH_ROW_RA_OFF(row)     ((__s64)(__s16)((row) >> 24) * 8)
#define ARCH_ROW_FP_OFF(row)     (ARCH_ROW_RA_OFF(row) - ((((row) >> 22) & 3) == 0 ? 8 : 0))
/* After a handler returns to __kernel_rt_sigreturn, sp is the struct
 * rt_sigframe; its sigcontext holds the interrupted x29, x30, sp and pc
 * (the user ABI: fixed offsets). */
#define ARCH_SIG_FP              __builtin_offsetof(struct rt_sigframe, uc.uc_mcontext.regs[29])
#define ARCH_SIG_LR              __builtin_offsetof(struct rt_sigframe, uc.uc_mcontext.regs[30])
#define ARCH_SIG_SP              __builtin_offsetof(struct rt_sigframe, uc.uc_mcontext.sp)
#define ARCH_SIG_PC              __builtin_offsetof(struct rt_sigframe, uc.uc_mcontext.pc)
#define ARCH_TABLE_WALK          1
/* Go's cgocallback row (Cfa::GoCallback), in 8s to fit the row's 24 bits:
 * 6 bits each, the TLS offset (above the thread pointer) 5. */
#define ARCH_GO_CB_CFA(off)      (((__u32)(off)&0x3f) * 8)
#define ARCH_GO_CB_GM(off)       ((((__u32)(off) >> 6) & 0x3f) * 8)
#define ARCH_GO_CB_SCHED_SP(off) ((((__u32)(off) >> 12) & 0x3f) * 8)
#define ARCH_GO_CB_TLS(off)      ((__s64)((((__u32)(off) >> 18) & 0x1f) * 8))
#else
#error "sonde's BPF programs are built for x86 (__TARGET_ARCH_x86) and arm64 (__TARGET_ARCH_arm64)"
#endif

/* AArch64 instructions the runtime walkers look for around a sampled pc to
 * tell whether a frame is built (the Arm ARM's encodings). They are plain
 * integer tests, used only where ARCH_HAS_LR. */
#define A64_FP_LR_PAIR(x)        ((x)&0xffc07fff)
/* stp x29, x30, [sp, #n] */
#define A64_IS_STP_FP_LR(x)      (A64_FP_LR_PAIR(x) == 0xa9007bfd)
/* stp x29, x30, [sp, #n]! */
#define A64_IS_STP_FP_LR_PRE(x)  (A64_FP_LR_PAIR(x) == 0xa9807bfd)
/* ldp x29, x30, [sp, #n] */
#define A64_IS_LDP_FP_LR(x)      (A64_FP_LR_PAIR(x) == 0xa9407bfd)
/* ldp x29, x30, [sp], #n */
#define A64_IS_LDP_FP_LR_POST(x) (A64_FP_LR_PAIR(x) == 0xa8c07bfd)
/* ret, retaa, retab */
#define A64_IS_RET(x)            ((x) == 0xd65f03c0 || (x) == 0xd65f0bff || (x) == 0xd65f0fff)
/* b, bl */
#define A64_IS_B_OR_BL(x)        (((x)&0x7c000000) == 0x14000000)
/* sub sp, sp, #n and add sp, sp, #n; A64_SP_IMM(x) is n */
#define A64_IS_SUB_SP_IMM(x)     (((x)&0xff8003ff) == 0xd10003ff)
#define A64_IS_ADD_SP_IMM(x)     (((x)&0xff8003ff) == 0x910003ff)
#define A64_SP_IMM(x)            ((((x) >> 10) & 0xfff) << ((((x) >> 22) & 1) * 12))

#endif /* SONDE_ARCH_H */

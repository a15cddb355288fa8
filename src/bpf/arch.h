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
#define ARCH_PC(r)          ((r)->ip)
#define ARCH_SP(r)          ((r)->sp)
#define ARCH_FP(r)          ((r)->bp)
/* 64-bit user mode: the code segment is __USER_CS. */
#define ARCH_USER64(r)      ((r)->cs == 0x33)
/* The system call the thread is in, -1 for none (an interrupt). */
#define ARCH_SYSCALL_NR(r)  ((long)(r)->orig_ax)
/* A system call's first three arguments, at its entry and its exit. */
#define ARCH_SYSCALL_A0(r)  ((r)->di)
#define ARCH_SYSCALL_A1(r)  ((r)->si)
#define ARCH_SYSCALL_A2(r)  ((r)->dx)
/* The user thread pointer (TLS base) of a task. */
#define ARCH_TLS_BASE(task) BPF_CORE_READ(task, thread.fsbase)
/* The table walk's rules (src/engine/unwind) are x86-64's. */
#define ARCH_TABLE_WALK     1
#elif defined(__TARGET_ARCH_arm64)
#define ARCH_PC(r)          ((r)->pc)
#define ARCH_SP(r)          ((r)->sp)
#define ARCH_FP(r)          ((r)->regs[29])
/* EL0 in AArch64 state: mode bits PSR_MODE_EL0t (0), not PSR_MODE32_BIT. */
#define ARCH_USER64(r)      (((r)->pstate & 0x1f) == 0)
#define ARCH_SYSCALL_NR(r)  ((long)(r)->syscallno)
/* x0 holds the return value at exit: the kernel keeps the first argument
 * in orig_x0 from the entry on. */
#define ARCH_SYSCALL_A0(r)  ((r)->orig_x0)
#define ARCH_SYSCALL_A1(r)  ((r)->regs[1])
#define ARCH_SYSCALL_A2(r)  ((r)->regs[2])
#define ARCH_TLS_BASE(task) BPF_CORE_READ(task, thread.uw.tp_value)
/* Not yet arm64's rules (x29, x30, pointer authentication): the kernel's
 * frame-pointer walk gives the user stack, and sonde says so. */
#define ARCH_TABLE_WALK     0
#else
#error "sonde's BPF programs are built for x86 (__TARGET_ARCH_x86) and arm64 (__TARGET_ARCH_arm64)"
#endif

#endif /* SONDE_ARCH_H */

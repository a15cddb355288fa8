// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Tiny programs that `sonde doctor` loads one at a time to learn what the kernel allows. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

__u64 hits = 0;

SEC("fentry/tcp_sendmsg")
int BPF_PROG(probe_fentry, struct sock *sk)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("kprobe/tcp_sendmsg")
int BPF_KPROBE(probe_kprobe, struct sock *sk)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(probe_tp_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(probe_raw_tp)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int probe_tracepoint(void *ctx)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("perf_event")
int probe_perf_event(void *ctx)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

SEC("uprobe")
int BPF_UPROBE(probe_uprobe)
{
	__sync_fetch_and_add(&hits, 1);
	return 0;
}

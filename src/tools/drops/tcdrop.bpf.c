// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * The drops lab's tc ingress filter: drops IPv4 UDP datagrams to one port
 * (set by user space) with TC_ACT_SHOT, so the kernel frees them as
 * TC_INGRESS and counts them in its clsact qdisc. A BPF classifier in
 * direct-action mode: kernels without tc's gact module drop this way too.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TC_ACT_OK   0
#define TC_ACT_SHOT 2
#define ETH_P_IP    0x0800

const volatile __u16 drop_port = 0;

SEC("tc")
int tc_drop(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
		return TC_ACT_OK;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return TC_ACT_OK;
	return udp->dest == bpf_htons(drop_port) ? TC_ACT_SHOT : TC_ACT_OK;
}

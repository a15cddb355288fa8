// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* sonde drops: layouts shared by drops.bpf.c and its user half (mod.rs). */
#ifndef SONDE_DROPS_H
#define SONDE_DROPS_H

#define DR_NO_REASON     0xffffffff /* the kernel passes none (before 5.17) */
/* Added to QDISC_DROP when the queue's qdisc was the built-in noop one: the
 * interface's queue was inactive (down, no carrier yet, or its qdisc being
 * replaced), and no tc counter counts the drop. */
#define DR_R_NOOP        0x40000000
#define DR_TCQ_F_BUILTIN 1 /* include/net/sch_generic.h */
#define DR_IFNAMSIZ      16
#define DR_MAX_IFACES    4
#define DR_MAX_PROTOS    8

/* dr_event.flags */
#define DR_F_OWNER 1 /* the owner is known (the socket's process) */
#define DR_F_SOCK  2 /* the drop names a socket (rx_sk or skb->sk) */
#define DR_F_L4    4 /* ports (and TCP flags) were read */
#define DR_F_NO_IP 8 /* not IPv4 or IPv6: no addresses */

/* One drop, streamed. */
struct dr_event {
	__u64 ts;
	__u64 location; /* where the kernel freed the packet (a return address) */
	__u64 cgroup;   /* the owner's cgroup */
	__u64 sock_ino; /* the socket's inode (user space finds its process) */
	__u32 reason;   /* enum skb_drop_reason, or DR_NO_REASON */
	__u32 netns;
	__u32 ifindex;
	__u32 pid; /* the owner */
	__s32 kstack;
	__u16 ethertype; /* host order */
	__u8 l4;         /* IP protocol */
	__u8 tcp_flags;
	__u16 sport;
	__u16 dport;
	__u8 family; /* AF_INET, AF_INET6, or 0 */
	__u8 flags;  /* DR_F_* */
	__u16 pad;
	__u8 saddr[16];
	__u8 daddr[16];
	char ifname[DR_IFNAMSIZ];
	char comm[16];
};

/* --count: drops by where and why. */
struct dr_key {
	__u64 location;
	__u64 cgroup; /* the owner's cgroup, with by_cgroup (serve), else 0 */
	__u32 reason;
	__u32 netns;
	__u32 ifindex;
	__u16 ethertype;
	__u8 l4;
	__u8 pad;
};

/*
 * A CPU's direct-mapped counters in front of the `counts` hash: a drop
 * whose key already holds its slot costs one array index and one add;
 * another key in the slot goes to the hash. A slot is claimed once
 * (compare-and-exchange of `state`, 0 -> 1), its key written, then
 * published (2); user space reads only published slots.
 */
#define DR_SLOTS 256 /* per CPU; a power of two */

struct dr_slot {
	struct dr_key key;
	__u64 state; /* 0 free, 1 being claimed, 2 published */
	__u64 n;
};

/* Summary counters (stats, per CPU). */
enum dr_stat {
	DR_S_UNUSED0 = 0, /* (drops are the counts' sum, events drops + filtered) */
	DR_S_UNUSED1,
	DR_S_FILTERED,     /* kfree_skb drops the filters left out */
	DR_S_LOST,         /* streamed drops the ring had no room for */
	DR_S_RATE_LIMITED, /* streamed drops over --rate, counted not shown */
	DR_S_COUNT_FULL,   /* --count: drops the table had no room for */
	DR_S_OWNER_FULL,   /* socket owners not recorded: the table was full */
	DR_S_NO_HEADER,    /* drops whose network header could not be read */
	DR_S_MAX,
};

#endif

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between retrans.bpf.c and src/tools/retrans/mod.rs (which mirrors these layouts). */
#ifndef SONDE_RETRANS_H
#define SONDE_RETRANS_H

#define MAX_STACK 32
#define MAX_ERRNO 256
/* Failed attempts' slots: errnos below MAX_ERRNO, then positive verdicts. */
#define ERR_SLOTS (MAX_ERRNO + 8)

#include "tcpretrans.h"

struct rt_event {
	__u64 ts_ns;
	struct rt_flow flow;
	struct sonde_owner owner;
	__s32 err;
	__u32 segs;
	__u8 state;
	__u8 ca_state;
	__u8 pending;
	__u8 has_owner;
	__u32 nr_kstack; /* bytes of kstack filled; 0 without --stack */
	__u64 kstack[MAX_STACK];
};

/* Size of an event without the stack, reserved when stacks are off. */
#define EVENT_BASE_SIZE (sizeof(struct rt_event) - MAX_STACK * sizeof(__u64))

/* What sonde keeps per socket: its owner (recorded in process context) and
 * an account of its retransmitted segments. The kernel adds each one to
 * tcp_sock.total_retrans in the function that fires the tracepoint, so at a
 * state change (connect, close, ...) what the counter gained since the
 * last one, less the segments events brought in between, went out with no
 * tracepoint program run (STAT_UNSEEN_SEGS). Events only add to `seen`:
 * reading the counter there would cost a cold tcp_sock cache line each. */
struct rt_sock {
	struct sonde_owner owner;
	__u32 base; /* total_retrans at the last state change */
	__u32 seen; /* segments events saw since then */
	__u8 has_owner;
	__u8 has_base; /* base is valid */
	__u8 pad[6];
};

struct rt_flow_stats {
	__u64 count;
	__u64 segs;
	struct sonde_owner owner;
	__u8 state;
	__u8 has_owner;
	__u8 pad[6];
};

/*
 * --count: an open-addressed table of flows in front of the `flows` hash,
 * read by user space through a shared mapping (no system call per flow:
 * the end report of 100k flows reads memory, not a hash the kernel walks).
 * A flow claims a free slot among RT_SLOT_PROBES from its hash (state 0 ->
 * 1, its key and owner written, then 2: published); a full neighbourhood
 * sends it to the hash. Two CPUs claiming the same new flow at once may
 * leave it in two slots: user space adds them up.
 */
#define RT_SLOT_PROBES 8 /* mirrored in mod.rs; the slot count is set there */

struct rt_flow_slot {
	struct rt_flow key;
	__u32 pad;
	__u64 state; /* 0 free, 1 being claimed, 2 published */
	struct rt_flow_stats stats;
};

/* serve: counts per owner cgroup and kind. */
struct rt_group {
	__u64 cgroup;
	__u32 kind;
	__u32 pad;
};

struct rt_group_stats {
	__u64 count;
	__u64 segs;
};

/* Totals kept in a per-CPU array, indexed by these slots. */
enum stat_slot {
	STAT_COUNT = 0,           /* + kind: events per kind (KIND_MAX slots) */
	STAT_SEGS = KIND_MAX,     /* + kind: segments per kind */
	STAT_LOST = 2 * KIND_MAX, /* ring buffer reserve failed */
	STAT_FLOW_FULL,           /* count map full */
	STAT_OWNER_FULL,          /* owner map full */
	STAT_FILTERED,            /* events dropped by filters */
	STAT_UNREADABLE,          /* socket not readable as a tcp_sock (never seen) */
	STAT_FILTERED_SEGS,       /* segments of the events dropped by filters */
	STAT_UNSEEN_SEGS,         /* retransmitted segments no tracepoint run saw */
	STAT_GROUP_FULL,          /* per-cgroup count map full (serve) */
	STAT_MAX,
};

#endif

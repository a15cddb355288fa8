// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * TCP flows for the socket tools (retrans, cwnd): the addresses of a
 * socket, who owns it, and the filters (--port, --addr, -4/-6, -p,
 * --comm, --cgroup, --netns) that user space sets before load. The Rust half is
 * src/engine/flowfilter.rs. Include after the libbpf headers.
 */
#ifndef SONDE_FLOW_H
#define SONDE_FLOW_H

#include "inlist.h"
#include "cgroupfilter.h"

#define AF_INET        2
#define AF_INET6       10
#define FLOW_COMM_LEN  16
#define FLOW_MAX_PORTS 8
#define FLOW_MAX_CIDRS 8
#define FLOW_MAX_PIDS  16
#define FLOW_MAX_NETNS 8
#define FLOW_MAX_COMMS 4

/* Who owns a socket, recorded in process context. */
struct sonde_owner {
	__u32 pid;
	__u32 tid;
	__u64 cgroup;
	char comm[FLOW_COMM_LEN];
	/* In the --cgroup cgroup or below it (cgroupfilter.h). */
	__u8 in_cgroup;
	__u8 pad[7];
};

struct sonde_cidr {
	__u8 addr[16];
	__u16 family;
	__u16 prefix;
	__u32 pad;
};

const volatile __u16 family_filter = 0;
const volatile __u32 n_ports = 0;
const volatile __u16 ports[FLOW_MAX_PORTS] = {};
const volatile __u32 n_cidrs = 0;
const volatile struct sonde_cidr cidrs[FLOW_MAX_CIDRS] = {};
const volatile __u32 n_pids = 0;
const volatile __u32 pids[FLOW_MAX_PIDS] = {};
const volatile __u32 n_netns = 0;
const volatile __u32 netns_ids[FLOW_MAX_NETNS] = {};
const volatile __u32 n_comms = 0;
const volatile char comms[FLOW_MAX_COMMS][FLOW_COMM_LEN] = {};

/*
 * Field reads. tp_btf and fentry hand us typed pointers, so `direct` loads
 * them (a plain load the verifier guards; a few ns); raw_tp, kprobes and
 * classic tracepoints need a probe read per field (a helper call each).
 * `direct` is a constant in every program, so only one branch is compiled in.
 */
#define KREAD(direct, src, field) ((direct) ? (src)->field : BPF_CORE_READ(src, field))

static __always_inline void kcopy(bool direct, void *dst, int n, const void *src)
{
	if (direct)
		__builtin_memcpy(dst, src, n);
	else
		bpf_core_read(dst, n, src);
}

/* A dual-stack socket talking IPv4 carries ::ffff:a.b.c.d: report it as IPv4. */
static __always_inline void flow_unmap_v4(__u16 *family, __u8 *saddr, __u8 *daddr)
{
	if (*family != AF_INET6)
		return;
	__u32 *w = (__u32 *)saddr, *d = (__u32 *)daddr;
	if (w[0] || w[1] || w[2] != bpf_htonl(0xffff) || d[0] || d[1] || d[2] != bpf_htonl(0xffff))
		return;
	*family = AF_INET;
	w[0] = w[3];
	d[0] = d[3];
	w[2] = w[3] = d[2] = d[3] = 0;
}

/* Addresses, ports and namespace of a socket (full or request socket:
 * sock_common) whose addresses are of `family`, into any flow struct with
 * the fields saddr, daddr, sport, dport, family and netns. */
#define FLOW_FILL(f, c, fam, direct)                                                               \
	do {                                                                                       \
		(f)->family = (fam);                                                               \
		(f)->netns = (direct) ? (c)->skc_net.net->ns.inum                                  \
		                      : BPF_CORE_READ(c, skc_net.net, ns.inum);                    \
		(f)->sport = KREAD(direct, c, skc_num);                                            \
		(f)->dport = bpf_ntohs(KREAD(direct, c, skc_dport));                               \
		if ((fam) == AF_INET) {                                                            \
			kcopy(direct, (f)->saddr, 4, &(c)->skc_rcv_saddr);                         \
			kcopy(direct, (f)->daddr, 4, &(c)->skc_daddr);                             \
		} else {                                                                           \
			kcopy(direct, (f)->saddr, 16, &(c)->skc_v6_rcv_saddr);                     \
			kcopy(direct, (f)->daddr, 16, &(c)->skc_v6_daddr);                         \
			flow_unmap_v4(&(f)->family, (f)->saddr, (f)->daddr);                       \
		}                                                                                  \
	} while (0)

static __always_inline bool flow_cidr_match(const __u8 *saddr, const __u8 *daddr, __u16 family,
                                            __u32 i)
{
	if (cidrs[i].family != family)
		return false;
	__u32 bits = cidrs[i].prefix;
	/* Compare against either end of the flow. */
	for (int side = 0; side < 2; side++) {
		const __u8 *a = side ? daddr : saddr;
		bool ok = true;
		for (int b = 0; b < 16; b++) {
			__u32 have = b * 8;
			if (have >= bits)
				break;
			__u8 mask = bits - have >= 8 ? 0xff : (__u8)(0xff << (8 - (bits - have)));
			if ((a[b] & mask) != (cidrs[i].addr[b] & mask)) {
				ok = false;
				break;
			}
		}
		if (ok)
			return true;
	}
	return false;
}

/* The filters on the flow itself (not its owner). */
#define FLOW_PASS(f)                                                                               \
	({                                                                                         \
		bool _ok = true;                                                                   \
		if (family_filter && (f)->family != family_filter)                                 \
			_ok = false;                                                               \
		else if (n_netns && !IN_LIST(netns_ids, n_netns, FLOW_MAX_NETNS, (f)->netns))      \
			_ok = false;                                                               \
		else if (n_ports && !IN_LIST(ports, n_ports, FLOW_MAX_PORTS, (f)->sport) &&        \
		         !IN_LIST(ports, n_ports, FLOW_MAX_PORTS, (f)->dport))                     \
			_ok = false;                                                               \
		else if (n_cidrs) {                                                                \
			bool _hit = false;                                                         \
			for (__u32 _i = 0; _i < FLOW_MAX_CIDRS && _i < n_cidrs; _i++)              \
				if (flow_cidr_match((f)->saddr, (f)->daddr, (f)->family, _i))      \
					_hit = true;                                               \
			_ok = _hit;                                                                \
		}                                                                                  \
		_ok;                                                                               \
	})

/* Whether a filter needs the socket's owner. */
static __always_inline bool owner_filtered(void)
{
	return n_pids || cg_filter_id || n_comms;
}

/* Whether an owner's comm is one of `comms` (whole names, as the kernel
 * keeps them: at most 15 bytes). */
static __always_inline bool comm_listed(const char *comm)
{
	for (__u32 i = 0; i < FLOW_MAX_COMMS && i < n_comms; i++) {
		bool same = true;
		for (int b = 0; b < FLOW_COMM_LEN; b++) {
			if (comm[b] != comms[i][b]) {
				same = false;
				break;
			}
			if (!comm[b])
				break;
		}
		if (same)
			return true;
	}
	return false;
}

/* The filters on the owner (NULL: not known). */
static __always_inline bool owner_pass(const struct sonde_owner *o)
{
	if (n_pids && (!o || !IN_LIST(pids, n_pids, FLOW_MAX_PIDS, o->pid)))
		return false;
	if (cg_filter_id && (!o || !o->in_cgroup))
		return false;
	if (n_comms && (!o || !comm_listed(o->comm)))
		return false;
	return true;
}

/* The current task as owner; `id` from bpf_get_current_pid_tgid(). */
static __always_inline void owner_fill_current(struct sonde_owner *o, __u64 id)
{
	o->pid = id >> 32;
	o->tid = (__u32)id;
	o->cgroup = bpf_get_current_cgroup_id();
	o->in_cgroup = cg_current_in();
	bpf_get_current_comm(o->comm, sizeof(o->comm));
}

#endif

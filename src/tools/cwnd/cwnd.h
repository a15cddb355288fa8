// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between cwnd.bpf.c and src/tools/cwnd/mod.rs (which mirrors these layouts). */
#ifndef SONDE_CWND_H
#define SONDE_CWND_H

#define CC_NAME_LEN 16

enum cw_type {
	CW_SAMPLE = 0,    /* congestion state at a received segment (tcp:tcp_probe) */
	CW_IDLE_SEND = 1, /* a send after idle, with the kernel's restart decision */
};

/* Why the send did or did not restart slow start, in the order the kernel's
 * tcp_slow_start_after_idle_check() tests them. */
enum cw_reason {
	REASON_RESTART = 0,      /* idle > RTO: tcp_cwnd_restart() ran */
	REASON_SYSCTL = 1,       /* net.ipv4.tcp_slow_start_after_idle = 0 */
	REASON_IN_FLIGHT = 2,    /* packets still out */
	REASON_CONG_CONTROL = 3, /* the congestion control has its own cong_control (bbr) */
	REASON_IDLE_SHORT = 4,   /* idle <= RTO */
};

/* What showed the cwnd after an idle send. */
enum cw_confirm {
	BY_SEND = 0,  /* the next segment queued by the same or a later send */
	BY_ACK = 1,   /* the next received segment (tcp:tcp_probe, before it is processed) */
	BY_CLOSE = 2, /* the socket was destroyed first */
};

/* serve: idle sends per congestion control and reason (and owner cgroup
 * with by_cgroup; 0: not split, or owner not known). */
struct cw_idle_key {
	__u64 cgroup;
	char cc[CC_NAME_LEN];
	__u32 reason;
	__u32 pad;
};

struct cw_flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u16 pad;
	__u32 netns;
};

/* A send after idle, held until the next observation of the socket shows
 * the cwnd the kernel left. */
struct cw_idle {
	__u64 ts_ns;
	__u32 idle_j; /* jiffies since the last data sent (tp->lsndtime) */
	__u32 rto_j;
	__u32 cwnd;
	__u32 ssthresh;
	__u32 packets_out;
	__u8 reason;
	__u8 sysctl;
	__u8 cong_control;
	__u8 pad;
};

struct cw_event {
	__u64 ts_ns;
	__u64 cookie; /* socket cookie, as `ss -e` prints sk:<hex> (0: unknown) */
	struct cw_flow flow;
	struct sonde_owner owner;
	__u8 type;
	__u8 has_owner;
	__u8 ca_state;
	__u8 confirmed_by;
	__u32 cwnd;
	__u32 ssthresh;
	__u32 srtt_us;
	__u32 rttvar_us;
	__u32 packets_out;
	__u32 inflight;
	__u32 snd_wnd;
	__u32 mss;
	__u32 pad;
	struct cw_idle idle; /* CW_IDLE_SEND */
	char cc[CC_NAME_LEN];
};

/* Per-socket state: in socket storage with typed pointers, in a hash keyed
 * by the socket's address otherwise. */
struct cw_conn {
	__u64 cookie;
	__u64 last_emit_ns;
	__u32 last_cwnd;
	__u32 last_ssthresh;
	__u32 eval_snd_nxt; /* snd_nxt at the last idle evaluation */
	__u8 last_ca;
	__u8 flow_ok;
	__u8 wanted;
	__u8 has_owner;
	__u8 evaluated;
	__u8 pending; /* idle holds a send waiting for its next observation */
	__u8 emitted;
	__u8 init;
	struct cw_flow flow;
	struct sonde_owner owner;
	struct cw_idle idle;
	char cc[CC_NAME_LEN];
};

enum cw_stat {
	STAT_PROBES = 0,   /* tcp_probe on a sending socket */
	STAT_SAMPLES,      /* samples emitted (or lost) */
	STAT_UNCHANGED,    /* observations with cwnd, ssthresh and state unchanged */
	STAT_RATE_LIMITED, /* changes not emitted because of --every */
	STAT_SENDS,        /* send-path hits evaluated for idle */
	STAT_IDLE_SENDS,   /* idle sends reported */
	STAT_RESTARTS,     /* of which restarted slow start */
	STAT_FILTERED,     /* observations of sockets the filters exclude */
	STAT_LOST,         /* ring buffer full */
	STAT_CONN_FULL,    /* no room for a socket's state */
	STAT_UNREADABLE,   /* not a tcp_sock */
	STAT_MAX,
};

#endif

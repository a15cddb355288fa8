// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Shared between msglat.bpf.c and src/tools/msglat/mod.rs (which mirrors these layouts). */
#ifndef SONDE_MSGLAT_H
#define SONDE_MSGLAT_H

#define ML_MAX_PIDS  8
#define ML_MAX_PORTS 8
#define ML_MAX_FD    65536 /* descriptors traced per process: 0 .. ML_MAX_FD-1 */
#define ML_RING      16384 /* FIFO mode: receives waiting for their send, per process (a power of two) */

/* Syscall numbers differ between architectures: msglat.bpf.c's nr_*
 * constants are set by mod.rs from libc's for the build's target. */

/* --id: receives waiting for their send, in a table indexed by a hash of
 * the id (a power of two); a slot taken by another waiting id is replaced. */
#define ML_WAITING_BITS 12
#define ML_WAITING      (1 << ML_WAITING_BITS)

struct ml_waiting {
	__u64 id;
	__u64 ts;
	__u32 fd;
	__u32 tgid1; /* tgid + 1; 0: empty */
	__u32 sock;  /* the receiving socket's id (see ml_flow_key) */
	__u32 pad;
};

#define ML_NO_FD 0xffffffff /* a send not made by write/writev/sendto/sendmsg */

/* --hooks sockets: the send call a CPU saw last. */
struct ml_send_call {
	__u64 sk;
	__u64 msg;  /* its msghdr */
	__u64 left; /* its bytes left then */
	__u32 seq;  /* write_seq then */
	__u32 pad;
};

struct ml_pending {
	__u64 ts;
	__u32 fd;
	__u32 sock;
};

struct ml_fifo_pos {
	__u64 head;
	__u64 tail;
};

/* Messages from one receiving socket to one sending socket. A flow is its
 * sockets, not their descriptor numbers (a descriptor closed and reused is
 * another socket): each socket by a 32-bit id that user space reads too:
 * with the socket hooks the low half of the socket's cookie (SO_COOKIE),
 * with the syscall hooks its inode number (socket:[N] in /proc/PID/fd; 0
 * in the socket table: not traced). A flow's descriptors are those its
 * messages came and went on (in the flow table: its first message's). */
struct ml_flow_key {
	__u32 tgid;
	__u32 in_sock;
	__u32 out_sock;
	__u32 in_fd;
	__u32 out_fd;
	__u32 pad;
};

#define ML_FLOW_WAYS 32 /* flow table: slots per process per descriptor end (a power of two) */

struct ml_flow_slot {
	__u64 key1; /* (in_sock << 32 | out_sock) + 1; 0: free */
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
};

struct ml_flow {
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
};

/* --per-message records. */
struct ml_event {
	__u64 recv_ns;
	__u64 send_ns;
	__u64 id;
	__u32 tgid;
	__u32 tid;
	__u32 in_fd;
	__u32 out_fd;
};

enum ml_stat {
	ML_RECVS =
	        0, /* FIFO: messages received on traced sockets and recorded (by id: the table says) */
	ML_UNMATCHED_SEND, /* sends with no receive waiting */
	ML_SHORT_RECV,     /* receives shorter than the id's end */
	ML_SHORT_SEND,     /* sends shorter than the id's end */
	ML_ID_FAULT,       /* the id could not be read from a receive's buffer */
	ML_SEND_ID_FAULT,  /* ... from a send's */
	ML_REPLACED,       /* a waiting receive replaced by one with its id or its table slot */
	ML_FIFO_OVERFLOW,  /* FIFO: oldest waiting receive dropped */
	ML_LOST,           /* --per-message records lost (ring full) */
	ML_FLOW_FULL,      /* per-flow table full */
	ML_FDS_FULL,       /* sockets past ML_MAX_FD, not traced */
	ML_NEW_FDS,        /* syscall hooks: sockets added at accept/connect */
	ML_OTHER_CALL, /* sockets hooks: receives or sends by calls with no user buffer (recvmmsg, io_uring, sendfile) */
	ML_ENTRY_NOT_SEEN, /* kernels before 5.15: receives and connects whose entry was not seen */
	ML_STAT_MAX,
};

#endif

//! Names for kernel enums the retrans events carry.

/// Retransmission causes, in the order of `enum retrans_kind` in retrans.h.
pub const KINDS: [&str; 7] = ["rto", "tlp", "fast", "loss_recovery", "syn", "synack", "failed"];

/// TCP state names (include/net/tcp_states.h).
pub fn tcp_state(s: u8) -> &'static str {
    match s {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}

/// Congestion-control states (enum tcp_ca_state).
pub fn ca_state(s: u8) -> &'static str {
    match s {
        0 => "open",
        1 => "disorder",
        2 => "cwr",
        3 => "recovery",
        4 => "loss",
        _ => "unknown",
    }
}

/// Symbolic name of a positive errno.
pub fn errno_name(e: u32) -> String {
    let n = match e {
        1 => "EPERM",
        4 => "EINTR",
        11 => "EAGAIN",
        12 => "ENOMEM",
        16 => "EBUSY",
        22 => "EINVAL",
        32 => "EPIPE",
        90 => "EMSGSIZE",
        101 => "ENETUNREACH",
        105 => "ENOBUFS",
        110 => "ETIMEDOUT",
        113 => "EHOSTUNREACH",
        _ => return format!("E{e}"),
    };
    n.to_string()
}

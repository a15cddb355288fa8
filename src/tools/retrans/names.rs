//! Names for kernel enums the retrans events carry.

/// Retransmission causes, in the order of `enum retrans_kind` in retrans.h.
pub const KINDS: [&str; 7] = ["rto", "tlp", "fast", "loss_recovery", "syn", "synack", "failed"];

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

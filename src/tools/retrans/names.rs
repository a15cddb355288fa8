//! Names for kernel enums the retrans events carry.

/// Retransmission causes, in the order of `enum retrans_kind` in retrans.h.
pub const KINDS: [&str; 7] = ["rto", "tlp", "fast", "loss_recovery", "syn", "synack", "failed"];

/// Symbolic name of a positive errno (callers name an `err` with [`err_name`]).
fn errno_name(e: u32) -> String {
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

/// Name of a failed attempt's `err`: a negative errno, or a positive
/// transmit verdict (net_xmit_eval() leaves NET_XMIT_DROP, 1, for a packet a
/// qdisc or device dropped).
pub fn err_name(err: i32) -> String {
    match err {
        e if e < 0 => errno_name(e.unsigned_abs()),
        1 => "NET_XMIT_DROP".into(),
        e => format!("NET_XMIT_{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::err_name;

    #[test]
    fn failed_attempts_are_named_by_sign() {
        assert_eq!(err_name(-16), "EBUSY");
        assert_eq!(err_name(-1), "EPERM");
        assert_eq!(err_name(1), "NET_XMIT_DROP");
        assert_eq!(err_name(-200), "E200");
    }
}

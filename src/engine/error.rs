//! Typed errors that decide sonde's exit status.
use thiserror::Error;

/// An error that is the user's or the environment's to fix: exit status 2.
#[derive(Debug, Error)]
pub enum SondeError {
    /// Bad command-line input; the message names the problem and a fix.
    #[error("{0}")]
    Usage(String),
    /// The host cannot run this (privileges, kernel features, missing files).
    #[error("{0}")]
    Env(String),
}

/// Shorthand for a usage error.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    SondeError::Usage(msg.into()).into()
}

/// Shorthand for an environment error.
pub fn env(msg: impl Into<String>) -> anyhow::Error {
    SondeError::Env(msg.into()).into()
}

/// Exit status for an error chain: 2 for usage/environment, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err.chain().any(|e| e.downcast_ref::<SondeError>().is_some()) {
        2
    } else {
        1
    }
}

/// Whether the error chain is a write to a closed stdout (`| head`): the reader
/// has what it wanted, so sonde ends quietly with status 0.
/// A JSON write that fails counts too: serde_json's error hides the
/// `io::Error` from the chain (its `source` is the io error's own source).
pub fn closed_stdout(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == BrokenPipe)
            || e.downcast_ref::<serde_json::Error>().is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    /// A JSON line that fills a buffer in front of a closed pipe fails inside
    /// serde_json: still a closed stdout, not an error.
    #[test]
    fn a_json_write_to_a_closed_pipe_is_a_closed_stdout() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let e = serde_json::to_writer(Closed, &vec!["x"; 10]).unwrap_err();
        assert!(super::closed_stdout(&anyhow::Error::from(e).context("writing the summary")));
        let other = serde_json::from_str::<u32>("x").unwrap_err();
        assert!(!super::closed_stdout(&anyhow::Error::from(other)));
    }
}

/// `msg` with the kernel-internal errno that libc has no name for spelled
/// out: the kernel returns ENOTSUPP (524) when it lacks what a program needs
/// (e.g. arm64 before BPF trampolines reached kernel functions), which
/// `strerror` prints as "Unknown error 524".
pub fn plain(msg: &str) -> String {
    msg.replace("Unknown error 524 (os error 524)", "not supported by this kernel (ENOTSUPP, error 524)")
        .replace("Unknown error 524", "not supported by this kernel (ENOTSUPP, error 524)")
}

#[cfg(test)]
mod plain_tests {
    #[test]
    fn enotsupp_is_named() {
        let e = std::io::Error::from_raw_os_error(524);
        let m = super::plain(&format!("attach: failed to attach BPF program: {e}"));
        assert_eq!(m, "attach: failed to attach BPF program: not supported by this kernel (ENOTSUPP, error 524)");
    }
}

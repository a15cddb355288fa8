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
pub fn closed_stdout(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

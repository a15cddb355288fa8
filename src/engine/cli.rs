//! A tool's arguments built from an argv, the way a user types them.
//!
//! Labs run the tools through this rather than by filling in every field of
//! the tool's args struct: a flag added to a tool with a default then needs
//! no edit in any lab, and a lab's run is exactly `sonde TOOL ARGS...`.
use std::ffi::OsString;

use clap::{Args, Command, FromArgMatches};

/// Parses `argv` (without the tool's name) into the tool's args struct `T`,
/// with the same parser, defaults and checks as the command line.
pub fn parse<T: Args + FromArgMatches>(
    tool: &str,
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> anyhow::Result<T> {
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let cmd = T::augment_args(Command::new("sonde").no_binary_name(true));
    let m = cmd.try_get_matches_from(&argv).map_err(|e| {
        let shown: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        anyhow::anyhow!("sonde {tool} {}: {}", shown.join(" "), e.render().to_string().lines().next().unwrap_or(""))
    })?;
    Ok(T::from_arg_matches(&m)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{offcpu::OffcpuArgs, profile::ProfileArgs};

    #[test]
    fn an_argv_gives_the_command_lines_defaults_and_values() {
        let p: ProfileArgs = parse("profile", ["-p", "1", "-p", "2", "-F", "99", "-o", "x.svg"]).unwrap();
        assert_eq!(p.task.pid, vec![1, 2]);
        assert_eq!(p.frequency, 99);
        assert_eq!(p.top, 25, "the default, as on the command line");
        let o: OffcpuArgs = parse("offcpu", ["--comm", "x"]).unwrap();
        assert_eq!(o.min_block, std::time::Duration::from_micros(1));
        assert!(parse::<ProfileArgs>("profile", ["--no-such-flag"]).is_err());
    }
}

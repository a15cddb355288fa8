//! Output sinks: JSON lines and aligned tables, to stdout or a file.
//!
//! Which stream gets what (every tool and lab):
//! - **stdout** (or the `-o` file for formats that have one): the results. Events, `--json`
//!   lines, the tables and summaries a run prints at its end, doctor's report, a lab's verdict.
//! - **stderr**: everything about the run rather than its results: "attached ..." and progress
//!   lines, warnings, hints, counts of lost events and truncated stacks, and errors. Piping
//!   stdout into another program therefore gets only results.
//!
//! A closed stdout (`sonde doctor | head -1`) is not an error: writes return
//! [`std::io::ErrorKind::BrokenPipe`], the tool stops as after Ctrl-C (links dropped,
//! nothing left attached), and `main` exits with status 0 without a message
//! ([`crate::engine::error::closed_stdout`]). So every write to stdout goes through
//! [`Sink`] or the [`outln!`](crate::outln) / [`out!`](crate::out) macros, which return the
//! error instead of panicking as `println!` does.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{error::usage, run::duration_arg};

/// `-d`, `--json` and `-o` as every tool takes them, declared once and
/// flattened in. A tool names its own record types and formats in the help
/// with `#[command(mut_arg("output", ...))]`, and lists the formats it writes
/// in a table for [`RunArgs::outputs`] / [`RunArgs::output`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Stop after this long (e.g. 10s, 2m); default: until Ctrl-C.
    #[arg(short = 'd', long, value_parser = duration_arg)]
    pub duration: Option<Duration>,
    /// One JSON object per line: the tool's records, then a summary.
    #[arg(long)]
    pub json: bool,
    /// Write to this file; its extension picks the format.
    #[arg(short = 'o', long = "output")]
    pub output: Vec<PathBuf>,
}

/// The formats a tool writes: (file-name ending, format), e.g. `(".json", Json)`.
pub type Formats<F> = [(&'static str, F)];

impl RunArgs {
    /// Every `-o` with its format (a tool that writes several files at once).
    pub fn outputs<F: Copy>(&self, tool: &str, formats: &Formats<F>) -> anyhow::Result<Vec<(PathBuf, F)>> {
        self.output.iter().map(|p| Ok((p.clone(), pick(p, tool, formats)?))).collect()
    }

    /// The one `-o`, if given, with its format (a tool that writes one file).
    pub fn output<F: Copy>(&self, tool: &str, formats: &Formats<F>) -> anyhow::Result<Option<(PathBuf, F)>> {
        if self.output.len() > 1 {
            return Err(usage(format!("-o given {} times; {tool} writes one file", self.output.len())));
        }
        Ok(self.outputs(tool, formats)?.pop())
    }

    /// The `-o` path, if any (after [`RunArgs::output`] has checked it).
    pub fn path(&self) -> Option<&Path> {
        self.output.first().map(PathBuf::as_path)
    }
}

/// The format of `path` by its ending, or a usage error that names the
/// endings `tool` writes.
pub fn pick<F: Copy>(path: &Path, tool: &str, formats: &Formats<F>) -> anyhow::Result<F> {
    let name = path.to_string_lossy();
    if let Some((_, f)) = formats.iter().find(|(end, _)| name.ends_with(end)) {
        return Ok(*f);
    }
    let mut ends: Vec<&str> = formats.iter().map(|(e, _)| *e).collect();
    ends.dedup();
    let list = match ends.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => ends.join(""),
    };
    Err(usage(format!("-o {}: {tool} cannot write that format; use a {list} file name", path.display())))
}

/// `println!` that returns an `io::Result` instead of panicking on a closed stdout.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` that returns an `io::Result` instead of panicking on a closed stdout.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// Where a tool writes its events and summary.
pub struct Sink {
    out: Box<dyn Write>,
}

impl Sink {
    /// stdout, or the file named by `-o` (created or truncated now, so an
    /// unwritable path fails before anything is attached).
    pub fn open(path: Option<&Path>) -> anyhow::Result<Self> {
        // Buffered either way: tools flush after every ring-buffer drain
        // (50 ms), not once per line.
        let out: Box<dyn Write> = match path {
            None => Box::new(BufWriter::with_capacity(1 << 16, io::stdout())),
            Some(p) => {
                let f = File::create(p)
                    .map_err(|e| usage(format!("-o {}: cannot write it ({e}); pick a writable path", p.display())))?;
                Box::new(BufWriter::new(f))
            }
        };
        Ok(Self { out })
    }

    /// Writes one JSON object as a line.
    pub fn json(&mut self, v: &impl serde::Serialize) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, v)?;
        self.out.write_all(b"\n")
    }

    /// Writes a text line.
    pub fn line(&mut self, s: &str) -> io::Result<()> {
        self.out.write_all(s.as_bytes())?;
        self.out.write_all(b"\n")
    }

    /// Flushes buffered output.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Formats rows into left-aligned columns (numbers right-aligned).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.len());
            }
        }
    }
    let fmt_row = |cells: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let numeric = !c.is_empty() && c.chars().all(|ch| ch.is_ascii_digit());
            if numeric {
                s.push_str(&format!("{:>width$}", c, width = w[i]));
            } else {
                s.push_str(&format!("{:<width$}", c, width = w[i]));
            }
            if i + 1 < cells.len() {
                s.push_str("  ");
            }
        }
        s.trim_end().to_string()
    };
    let mut out = fmt_row(header.to_vec());
    for r in rows {
        out.push('\n');
        out.push_str(&fmt_row(r.iter().map(|s| s.as_str()).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_picker_names_the_endings_a_tool_writes() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum F {
            Json,
            Pprof,
            Text,
        }
        let formats: &Formats<F> = &[(".json", F::Json), (".pb.gz", F::Pprof), (".txt", F::Text), (".log", F::Text)];
        assert_eq!(pick(Path::new("a.pb.gz"), "t", formats).unwrap(), F::Pprof);
        assert_eq!(pick(Path::new("/x/y.json"), "t", formats).unwrap(), F::Json);
        let e = pick(Path::new("out.svg"), "t", formats).unwrap_err().to_string();
        assert_eq!(e, "-o out.svg: t cannot write that format; use a .json, .pb.gz, .txt or .log file name");
        let two = RunArgs { output: vec!["a.json".into(), "b.json".into()], ..Default::default() };
        assert!(two.output("t", formats).is_err());
        assert_eq!(two.outputs("t", formats).unwrap().len(), 2);
    }
}

//! Renderers of symbolized stacks ([`super::stacks::Stack`]): folded lines
//! (flamegraph.pl / inferno input), SVG flame graphs (inferno) and the
//! terminal's top-functions table. Picked by output file extension.
use std::{collections::HashMap, io::Write, path::Path};

use anyhow::Context;

use super::{
    error::usage,
    stacks::{FrameKind, Stack},
};

/// Output formats of the stack tools, by file extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.folded`: one `root;...;leaf count` line per stack.
    Folded,
    /// `.svg`: an inferno flame graph.
    Svg,
    /// `.json`: one object per stack with its frames (name, file, line,
    /// kind, module, inlined), root first, and its count.
    Json,
    /// `.pb.gz`: pprof (see [`super::pprof`]).
    Pprof,
    /// `.html`: the interactive flame graph (zoom on click, search with
    /// Ctrl-F, details on hover) in one self-contained page; no network.
    Html,
}

impl Format {
    /// The endings the stack tools write.
    pub const ALL: &'static super::output::Formats<Format> = &[
        (".folded", Format::Folded),
        (".svg", Format::Svg),
        (".html", Format::Html),
        (".json", Format::Json),
        (".pb.gz", Format::Pprof),
    ];

    /// The format for `path`, or a usage error naming the ones we write.
    pub fn of(path: &Path) -> anyhow::Result<Format> {
        super::output::pick(path, "the stack tools", Self::ALL)
    }
}

/// The marker that ends a Go frame's label in folded output.
pub const GO_MARK: &str = "_[go]";
/// The marker that ends a perf map's JIT frame label in folded output (as a
/// Java method's, as async-profiler and flamegraph.pl's java palette have it).
pub const JIT_MARK: &str = "_[j]";

/// The label of a frame in folded output: kernel frames end in `_[k]` (as
/// flamegraph.pl's --kernel colouring expects), inlined ones in `_[i]`,
/// JIT ones in `_[j]`, Go functions in `_[go]`, a language runtime's in
/// its own mark (Python `_[py]`, Java `_[j]`, JavaScript `_[js]`; inlined
/// Java and JavaScript `_[i]`, as async-profiler writes them).
fn label(f: &super::stacks::Frame) -> String {
    // `;` separates frames and a trailing number is the count: keep both out.
    let name = f.name.replace(';', ":");
    match (f.kind, f.inlined) {
        (FrameKind::Kernel, _) => format!("{name}_[k]"),
        (FrameKind::Jit, _) => format!("{name}{JIT_MARK}"),
        (FrameKind::Lang(l), i) if !i || l.inlined_keeps_mark => format!("{name}{}", l.folded),
        (FrameKind::Go, false) => format!("{name}{GO_MARK}"),
        (_, true) => format!("{name}_[i]"),
        _ => name,
    }
}

/// Folded lines, the process name as root frame, merged and sorted.
pub fn folded(stacks: &[Stack]) -> Vec<String> {
    let mut m: HashMap<String, u64> = HashMap::new();
    for s in stacks {
        let mut line = s.process.replace(';', ":");
        for f in &s.frames {
            line.push(';');
            line.push_str(&label(f));
        }
        *m.entry(line).or_default() += s.count;
    }
    let mut v: Vec<String> = m.into_iter().map(|(k, c)| format!("{k} {c}")).collect();
    v.sort();
    v
}

/// What renderers need besides the stacks.
pub struct Meta<'a> {
    /// Heads the SVG.
    pub title: String,
    /// What a count is ("samples").
    pub count_name: String,
    /// For pprof.
    pub pprof: super::pprof::Meta<'a>,
}

/// Writes `stacks` to `path` in `format`.
pub fn write(path: &Path, format: Format, stacks: &[Stack], meta: &Meta<'_>) -> anyhow::Result<()> {
    if format == Format::Pprof {
        return super::pprof::write(path, stacks, &meta.pprof);
    }
    let (title, count_name) = (meta.title.as_str(), meta.count_name.as_str());
    let lines = folded(stacks);
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|e| usage(format!("-o {}: {e}; pick a writable path", path.display())))?,
    );
    match format {
        Format::Folded => {
            for l in &lines {
                writeln!(out, "{l}")?;
            }
        }
        Format::Json => json_lines(&mut out, stacks)?,
        Format::Pprof => unreachable!("written above"),
        Format::Svg => out.write_all(&svg(&lines, title, count_name)?)?,
        Format::Html => {
            // The SVG inline in a page: its script (zoom, search, details)
            // runs in the page; nothing is fetched. That script (inferno's
            // fluid drawing) removes the <svg>'s width and viewBox and sizes
            // the frames, title and Search to the width the <svg> then has.
            // A standalone SVG document then fills the window, but an inline
            // <svg> without width or viewBox is a replaced element with no
            // size of its own: CSS's default 300 px. The page's CSS gives the
            // outer <svg> (not the nested #frames one) the page's width, so it
            // lays out as the standalone SVG does, and follows resizes.
            let svg = String::from_utf8(svg(&lines, title, count_name)?)?;
            let body = svg.find("<svg").map(|i| &svg[i..]).unwrap_or(&svg);
            // A zoomed view's link (?x=..&y=..) finds its frame by the
            // namespaced attribute fg:x; in an HTML page that attribute is
            // named "fg:x" literally, so the selector names it so.
            let body = body.replace(r#"'[*|x="'"#, r#"'[fg\\:x="'"#);
            write!(
                out,
                "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>\
                 <style>body{{margin:0;font-family:sans-serif}}body>svg{{display:block;width:100%}}</style>\
                 </head><body>\n{body}\n\
                 <script>window.addEventListener('load',function(){{document.body.setAttribute('data-frames',\
                 document.querySelectorAll('#frames > g').length);}});</script>\n</body></html>\n",
                html_escape(title)
            )?;
        }
    }
    out.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One `{"type":"stack",...}` line per stack (schema in the README).
pub fn json_lines(out: &mut impl Write, stacks: &[Stack]) -> std::io::Result<()> {
    for s in stacks {
        let frames: Vec<serde_json::Value> = s
            .frames
            .iter()
            .map(|f| {
                serde_json::json!({
                    "name": f.name, "file": f.file, "line": f.line,
                    "kind": f.kind.name(),
                    "module": &*f.module, "inlined": f.inlined,
                })
            })
            .collect();
        let v = serde_json::json!({"type": "stack", "pid": s.pid, "tid": s.tid, "process": s.process, "count": s.count, "frames": frames});
        writeln!(out, "{v}")?;
    }
    Ok(())
}

/// Text for HTML or SVG content and attribute values.
pub fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An inferno flame graph of folded `lines`.
fn svg(lines: &[String], title: &str, count_name: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    if lines.is_empty() {
        // inferno refuses empty input; say so in a valid SVG.
        write!(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\"><text x=\"10\" y=\"25\">{}: no samples</text></svg>", html_escape(title))?;
        return Ok(out);
    }
    let (lines, mut palette) = language_colours(lines);
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = count_name.to_string();
    opts.colors = inferno::flamegraph::color::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
    opts.palette_map = Some(&mut palette);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(|s| s.as_str()), &mut out)
        .context("rendering the flame graph")?;
    Ok(out)
}

/// Language frames in a flame graph: shown without their folded marker, in
/// colours of their own (each runtime's [`super::runtime::plugin::Lang::colour`]; Go teal, JIT code
/// green) (inferno colours by name: each such name gets its colour up front,
/// unless a native frame of the graph has the same name).
fn language_colours(lines: &[String]) -> (Vec<String>, inferno::flamegraph::color::PaletteMap) {
    use std::collections::{HashMap, HashSet};
    const GO: [(u8, i8); 3] = [(40, 1), (170, 2), (160, 1)];
    const JIT: [(u8, i8); 3] = [(50, 1), (165, 2), (40, 1)];
    let mut marks: Vec<(&str, [(u8, i8); 3])> = vec![(GO_MARK, GO), (JIT_MARK, JIT)];
    for r in super::runtime::registry::RUNTIMES {
        if !marks.iter().any(|m| m.0 == r.lang().folded) {
            marks.push((r.lang().folded, r.lang().colour));
        }
    }
    let mut lang: HashMap<String, [(u8, i8); 3]> = HashMap::new();
    let mut native: HashSet<String> = HashSet::new();
    let out = lines
        .iter()
        .map(|l| {
            if !marks.iter().any(|m| l.contains(m.0)) {
                return l.clone();
            }
            let (stack, count) = l.rsplit_once(' ').unwrap_or((l, ""));
            let frames: Vec<&str> = stack
                .split(';')
                .map(|f| {
                    for (mark, colour) in &marks {
                        if let Some(n) = f.strip_suffix(mark) {
                            lang.insert(n.to_string(), *colour);
                            return n;
                        }
                    }
                    native.insert(f.to_string());
                    f
                })
                .collect();
            format!("{} {count}", frames.join(";"))
        })
        .collect();
    let mut map = inferno::flamegraph::color::PaletteMap::default();
    for (name, colour) in lang.iter().filter(|(n, _)| !native.contains(*n)) {
        let h = name.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32));
        let v = (h % 60) as i32;
        let ch = |(base, slope): (u8, i8)| (base as i32 + v * slope as i32 / 2).clamp(0, 255) as u8;
        map.insert(name, inferno::flamegraph::color::Color { r: ch(colour[0]), g: ch(colour[1]), b: ch(colour[2]) });
    }
    (out, map)
}

/// One row of the top-functions table.
#[derive(Debug, Clone)]
pub struct TopRow {
    /// Function (with `[k]` for kernel code).
    pub name: String,
    /// Samples where it was the leaf.
    pub self_count: u64,
    /// Samples where it was anywhere on the stack.
    pub total_count: u64,
}

/// Functions by self samples, then total.
pub fn top(stacks: &[Stack]) -> (Vec<TopRow>, u64) {
    let mut selfc: HashMap<String, u64> = HashMap::new();
    let mut total: HashMap<String, u64> = HashMap::new();
    let mut all = 0;
    for s in stacks {
        all += s.count;
        let names: Vec<String> = s
            .frames
            .iter()
            .map(|f| match f.kind {
                FrameKind::Kernel => format!("{} [k]", f.name),
                FrameKind::Lang(l) => format!("{} {}", f.name, l.top),
                FrameKind::Go if !f.inlined => format!("{} [go]", f.name),
                _ => f.name.clone(),
            })
            .collect();
        let leaf = names.last().cloned().unwrap_or_else(|| format!("[{}]", s.process));
        *selfc.entry(leaf.clone()).or_default() += s.count;
        let mut seen = std::collections::HashSet::new();
        for n in names.iter().chain(std::iter::once(&leaf)) {
            if seen.insert(n.clone()) {
                *total.entry(n.clone()).or_default() += s.count;
            }
        }
    }
    let mut rows: Vec<TopRow> = total
        .into_iter()
        .map(|(name, t)| TopRow { self_count: selfc.get(&name).copied().unwrap_or(0), name, total_count: t })
        .collect();
    rows.sort_by(|a, b| {
        b.self_count.cmp(&a.self_count).then(b.total_count.cmp(&a.total_count)).then(a.name.cmp(&b.name))
    });
    (rows, all)
}

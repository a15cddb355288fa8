//! `sonde why -o report.html`: one offline page (no script, nothing
//! fetched). Per process: its verdict, its time as one bar, and per thread a
//! timeline of its states across the whole window (a column per sample,
//! stacked by the share of each category in it) beside its breakdown.
use std::fmt::Write as _;

use super::{
    report::{Class, Process, Report, Thread},
    timeline::{Timeline, SLOTS},
};
use crate::engine::render::html_escape;

/// Each slot's name and colour (on CPU, run queue, throttled, the classes
/// in enum why_class order). Saturated and apart, so that a screenshot can
/// be read back by colour (tests/integration/why.rs).
pub const PALETTE: [(&str, &str); SLOTS] = [
    ("on CPU", "#2ca02c"),
    ("run queue", "#ffbf00"),
    ("throttled", "#d62728"),
    ("disk", "#1f77b4"),
    ("network", "#9467bd"),
    ("lock", "#e377c2"),
    ("sleep", "#17becf"),
    ("poll", "#bcbd22"),
    ("pipe", "#8c564b"),
    ("memory", "#ff7f0e"),
    ("io_uring", "#393b79"),
    ("other", "#7f7f7f"),
];

/// Threads drawn per process (the rest are counted under the table).
const MAX_ROWS: usize = 64;
/// The timeline's width in user units (the window), and height.
const W: f64 = 10000.0;
const H: f64 = 1000.0;
/// How far a column's rects reach into the next (user units).
const OVERLAP: f64 = 5.0;

/// A thread's time per slot (on CPU, run queue, throttled, classes).
fn slots(t: &Thread) -> [u64; SLOTS] {
    let mut s = [0; SLOTS];
    s[0] = t.on_cpu_ns;
    s[1] = t.runqueue_ns;
    s[2] = t.throttled_ns;
    for c in Class::ALL {
        s[3 + c as usize] = t.blocked_ns[c as usize];
    }
    s
}

fn secs(ns: u64) -> String {
    format!("{:.2} s", ns as f64 / 1e9)
}

/// A horizontal bar of `t`'s slots, and its words ("on CPU 49%, ...").
fn bar(t: &Thread, class: &str) -> (String, String) {
    let s = slots(t);
    let total: u64 = s.iter().sum();
    let mut html = format!("<div class=\"{class}\">");
    let mut words = Vec::new();
    for (i, v) in s.iter().enumerate() {
        if *v == 0 || total == 0 {
            continue;
        }
        let p = 100.0 * *v as f64 / total as f64;
        let (name, colour) = PALETTE[i];
        let _ = write!(
            html,
            "<span style=\"width:{p:.3}%;background:{colour}\" title=\"{name}: {} ({p:.1}%)\"></span>",
            secs(*v)
        );
        if p >= 0.5 {
            words.push(format!("{name} {p:.0}%"));
        }
    }
    html.push_str("</div>");
    (html, words.join(", "))
}

/// Thread `tid`'s timeline: an SVG as wide as the window, a column per
/// sample stacked by slot (a run of columns all in one slot is one rect).
fn timeline_svg(tl: &Timeline, start: u64, end: u64, tid: u32) -> String {
    let span = end.saturating_sub(start).max(1) as f64;
    let x = |t: u64| (t.saturating_sub(start) as f64 / span * W).min(W);
    let mut out = format!(
        "<svg id=\"tl-{tid}\" class=\"tl\" viewBox=\"0 0 {W} {H}\" preserveAspectRatio=\"none\" shape-rendering=\"crispEdges\">"
    );
    // The open run of columns all in one slot: (slot, from, to).
    let mut run: Option<(usize, f64, f64)> = None;
    let rect = |out: &mut String, slot: usize, x0: f64, w: f64, y: f64, h: f64| {
        let _ = write!(
            out,
            "<rect x=\"{x0:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"{}\"/>",
            PALETTE[slot].1
        );
    };
    for (from, to, d) in tl.columns(tid) {
        let (x0, x1) = (x(from), x(to));
        // A column's height is its length of time: a thread's slots grow by
        // that between two samples while it lives (see `sample`), less
        // where it started or exited in it (the rest blank). Where the
        // slots still sum to more (a change placed later that no earlier
        // column could take back), they are drawn in their own proportions.
        let sum: u64 = d.iter().sum();
        let len = to.saturating_sub(from).max(sum).max(1) as f64;
        let full = d.iter().position(|v| *v as f64 >= len * 0.999);
        match (run, full) {
            (Some((s, a, b)), Some(f)) if s == f && (b - x0).abs() < 1e-6 => {
                run = Some((s, a, x1));
                continue;
            }
            (Some((s, a, b)), _) => rect(&mut out, s, a, b - a, 0.0, H),
            (None, _) => {}
        }
        run = full.map(|f| (f, x0, x1));
        if full.is_some() {
            continue;
        }
        // Each slot from its top to the bottom, over the ones before it,
        // and a little wider than its column: pixel snapping leaves no gap
        // between neighbours.
        let mut y = 0.0;
        for (slot, v) in d.iter().enumerate() {
            if *v == 0 || y >= H {
                continue;
            }
            rect(&mut out, slot, x0, (x1 - x0 + OVERLAP).min(W - x0), y, H - y);
            y += *v as f64 / len * H;
        }
    }
    if let Some((s, a, b)) = run {
        rect(&mut out, s, a, b - a, 0.0, H);
    }
    out.push_str("</svg>");
    out
}

fn process_html(out: &mut String, p: &Process, tl: &Timeline, r: &Report) {
    let s = &p.sum;
    let _ = write!(
        out,
        "<section class=\"proc\" id=\"pid-{}\"><h2>PID {} {} <small>{} thread{}, {} of thread time</small></h2>",
        p.pid,
        p.pid,
        html_escape(&p.comm),
        p.threads.len(),
        if p.threads.len() == 1 { "" } else { "s" },
        secs(s.window_ns)
    );
    let next = p.next.as_ref().map(|n| format!("; next: <code>{}</code>", html_escape(n))).unwrap_or_default();
    let _ = write!(out, "<p class=\"verdict\">{}{next}</p>", html_escape(&p.verdict));
    let (b, words) = bar(s, "bar");
    let _ = write!(out, "{b}<p class=\"words\">{}</p>", html_escape(&words));
    let _ = write!(
        out,
        "<table><tr><th class=\"name\">thread</th><th><span class=\"axis\"><span>0 s</span><span>{}</span><span>{}</span></span></th><th class=\"sum\">its time</th></tr>",
        secs(r.window_ns / 2),
        secs(r.window_ns)
    );
    // Threads as the report groups them (most time lost first), each by tid.
    let mut order: Vec<&Thread> = Vec::new();
    for g in &p.groups {
        let mut ts: Vec<&Thread> = p
            .threads
            .iter()
            .filter(|t| if r.per_thread { g.comm == format!("{} ({})", t.comm, t.tid) } else { t.comm == g.comm })
            .collect();
        ts.sort_by_key(|t| t.tid);
        order.extend(ts);
    }
    for t in order.iter().take(MAX_ROWS) {
        let (b, words) = bar(t, "mini");
        let _ = write!(
            out,
            "<tr id=\"row-{tid}\"><td class=\"name\">{} <small>{tid}</small></td><td>{}</td><td class=\"sum\">{b}<small>{}</small></td></tr>",
            html_escape(&t.comm),
            timeline_svg(tl, r.start_mono_ns, r.end_mono_ns, t.tid),
            html_escape(&words),
            tid = t.tid,
        );
    }
    out.push_str("</table>");
    if order.len() > MAX_ROWS {
        let _ = write!(out, "<p class=\"words\">and {} more threads (in the JSON report)</p>", order.len() - MAX_ROWS);
    }
    out.push_str("</section>");
}

/// The page for `r` (its `top` processes when every process was traced).
pub fn render(r: &Report, tl: &Timeline, top: usize) -> String {
    let mut out = String::with_capacity(1 << 16);
    let shown = if r.host { top } else { usize::MAX };
    let title = format!(
        "sonde why: {} window, {} process{}",
        secs(r.window_ns),
        r.processes.len(),
        if r.processes.len() == 1 { "" } else { "es" }
    );
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
         body{{margin:16px;font:13px sans-serif;color:#222}}h1{{font-size:18px}}h2{{font-size:15px;margin:18px 0 4px}}\
         small{{color:#666;font-weight:normal}}.verdict{{font-weight:bold;margin:4px 0}}.words{{margin:2px 0 8px;color:#444}}\
         .bar,.mini{{display:flex;height:16px;background:#fff;border:1px solid #ccc}}.mini{{height:10px;width:100%}}\
         .bar span,.mini span{{display:block;height:100%}}table{{width:100%;border-collapse:collapse;table-layout:fixed}}\
         td,th{{padding:2px 6px;vertical-align:middle;text-align:left;font-weight:normal}}th.name,td.name{{width:170px;overflow:hidden;white-space:nowrap}}\
         th.sum,td.sum{{width:260px}}td.sum small{{display:block;white-space:nowrap;overflow:hidden}}\
         svg.tl{{display:block;width:100%;height:24px;background:#fff;border-left:1px solid #ccc;border-right:1px solid #ccc}}\
         .axis{{display:flex;justify-content:space-between;color:#666}}\
         .legend span{{display:inline-block;margin-right:12px}}.legend i{{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}}\
         </style></head><body>\n<h1>{t}</h1>",
        t = html_escape(&title)
    );
    let _ = write!(
        out,
        "<p>Every nanosecond of each thread's time in the window, in one category; each timeline spans the window \
         ({} to {} CLOCK_MONOTONIC ns), a column per {} ms sample{}.</p><p class=\"legend\">",
        r.start_mono_ns,
        r.end_mono_ns,
        tl.tick.as_millis(),
        if r.host && r.processes.len() > top {
            format!("; the {top} processes that lost the most time")
        } else {
            String::new()
        }
    );
    for (name, colour) in PALETTE {
        let _ = write!(out, "<span><i style=\"background:{colour}\"></i>{name}</span>");
    }
    out.push_str("</p>");
    for p in r.processes.iter().take(shown) {
        process_html(&mut out, p, tl, r);
    }
    if tl.threads_dropped > 0 {
        let _ =
            write!(out, "<p>{} threads have no timeline: only the first 1,000 are followed.</p>", tl.threads_dropped);
    }
    out.push_str("\n</body></html>\n");
    out
}

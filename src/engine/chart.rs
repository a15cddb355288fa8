//! Time-series charts as standalone SVG or HTML: one step line per series
//! (a value holds until the next sample, as a congestion window does) with
//! event markers carrying tooltips. Long series are thinned per pixel column
//! to the first, smallest, largest and last point, so the drawing keeps
//! every extreme however many samples there were.
use std::fmt::Write;

use super::render::html_escape;

/// A point event on a series: drawn at `x` from `y_from` to `y_to`.
#[derive(Debug, Clone, Default)]
pub struct Marker {
    /// Time.
    pub x: f64,
    /// Value before the event.
    pub y_from: f64,
    /// Value after it.
    pub y_to: f64,
    /// Drawn as a red triangle with a drop line (else a grey dot).
    pub strong: bool,
    /// Tooltip.
    pub label: String,
}

/// One line of the chart.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) in time order.
    pub points: Vec<(f64, f64)>,
    /// Events on this series.
    pub markers: Vec<Marker>,
}

/// A chart of several series over a shared time axis.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

const W: f64 = 1100.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const LEGEND_ROW: f64 = 18.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#ff7f0e", "#393b79"];

/// A step of 1, 2 or 5 times a power of ten giving about `n` ticks over `span`.
fn tick_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 {
        return 1.0;
    }
    let raw = span / n;
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10.0 * p)
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Keeps, per pixel column, the first, smallest, largest and last point.
fn thin(points: &[(f64, f64)], px: impl Fn(f64) -> i64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let col = px(points[i].0);
        let mut j = i;
        while j + 1 < points.len() && px(points[j + 1].0) == col {
            j += 1;
        }
        let group = &points[i..=j];
        if group.len() <= 4 {
            out.extend_from_slice(group);
        } else {
            let (mut lo, mut hi) = (0, 0);
            for (k, p) in group.iter().enumerate() {
                if p.1 < group[lo].1 {
                    lo = k;
                }
                if p.1 > group[hi].1 {
                    hi = k;
                }
            }
            let mut keep = vec![0, lo, hi, group.len() - 1];
            keep.sort_unstable();
            keep.dedup();
            out.extend(keep.into_iter().map(|k| group[k]));
        }
        i = j + 1;
    }
    out
}

impl Chart {
    fn bounds(&self) -> (f64, f64) {
        let mut xmax: f64 = 0.0;
        let mut ymax: f64 = 0.0;
        for s in &self.series {
            for p in &s.points {
                xmax = xmax.max(p.0);
                ymax = ymax.max(p.1);
            }
            for m in &s.markers {
                xmax = xmax.max(m.x);
                ymax = ymax.max(m.y_from).max(m.y_to);
            }
        }
        (if xmax > 0.0 { xmax } else { 1.0 }, if ymax > 0.0 { ymax * 1.05 } else { 1.0 })
    }

    /// The chart as a standalone SVG document.
    pub fn svg(&self) -> String {
        let (xmax, ymax) = self.bounds();
        let pw = W - LEFT - RIGHT;
        let ph = H - TOP - BOTTOM;
        let sx = |x: f64| LEFT + x / xmax * pw;
        let sy = |y: f64| TOP + ph - y / ymax * ph;
        let total_h = H + LEGEND_ROW * self.series.len() as f64 + 10.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" viewBox="0 0 {W} {total_h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            W / 2.0,
            html_escape(&self.title)
        );
        // Axes, grid and ticks.
        let _ = writeln!(s, r##"<g stroke="#ccc" stroke-width="1">"##);
        let ys = tick_step(ymax, 6.0);
        let mut y = 0.0;
        while y <= ymax {
            let _ = writeln!(s, r#"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}"/>"#, W - RIGHT, sy(y), sy(y));
            y += ys;
        }
        let _ = writeln!(s, "</g>");
        let mut y = 0.0;
        while y <= ymax {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                sy(y) + 4.0,
                fmt_num(y)
            );
            y += ys;
        }
        let xs = tick_step(xmax, 10.0);
        let mut x = 0.0;
        while x <= xmax + 1e-9 {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                sx(x),
                TOP + ph + 16.0,
                fmt_num(x)
            );
            x += xs;
        }
        let _ = writeln!(s, r##"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="#333"/>"##, TOP + ph, W - RIGHT);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            TOP + ph + 36.0,
            html_escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            TOP + ph / 2.0,
            html_escape(&self.y_label)
        );
        // Series.
        for (i, ser) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let _ = writeln!(s, r#"<g class="series" data-series="{i}">"#);
            let mut pts = thin(&ser.points, |x| sx(x).round() as i64);
            // The last value holds up to the series' last event.
            if let (Some(&(lx, ly)), Some(mx)) = (pts.last(), ser.markers.iter().map(|m| m.x).reduce(f64::max)) {
                if mx > lx {
                    pts.push((mx, ly));
                }
            }
            if !pts.is_empty() {
                let mut d = format!("M{:.1},{:.1}", sx(pts[0].0), sy(pts[0].1));
                for w in pts.windows(2) {
                    let _ = write!(d, " H{:.1} V{:.1}", sx(w[1].0), sy(w[1].1));
                }
                let _ = writeln!(
                    s,
                    r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"><title>{}</title></path>"#,
                    html_escape(&ser.name)
                );
            }
            for m in &ser.markers {
                let (x, y0, y1) = (sx(m.x), sy(m.y_from), sy(m.y_to));
                if m.strong {
                    let _ = writeln!(
                        s,
                        r##"<g class="marker restart"><line x1="{x:.1}" x2="{x:.1}" y1="{y0:.1}" y2="{y1:.1}" stroke="#d62728" stroke-dasharray="4 2"/><path d="M{:.1},{:.1} h10 l-5,8 z" fill="#d62728"/><title>{}</title></g>"##,
                        x - 5.0,
                        y0 - 9.0,
                        html_escape(&m.label)
                    );
                } else {
                    let _ = writeln!(
                        s,
                        r##"<g class="marker"><circle cx="{x:.1}" cy="{y0:.1}" r="4" fill="none" stroke="#555"/><title>{}</title></g>"##,
                        html_escape(&m.label)
                    );
                }
            }
            let _ = writeln!(s, "</g>");
            let ly = H + LEGEND_ROW * i as f64;
            let _ = writeln!(
                s,
                r#"<g class="legend" data-series="{i}"><rect x="{LEFT}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{}">{}</text></g>"#,
                ly - 4.0,
                LEFT + 20.0,
                ly,
                html_escape(&ser.name)
            );
        }
        if self.series.is_empty() {
            let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">no data</text>"#, W / 2.0, TOP + ph / 2.0);
        }
        s.push_str("</svg>\n");
        s
    }

    /// The chart in a standalone HTML page: the SVG (hover a marker for its
    /// details, click a legend entry to hide or show a series) and a table
    /// of every marker.
    pub fn html(&self) -> String {
        let mut rows = String::new();
        for (i, ser) in self.series.iter().enumerate() {
            for m in &ser.markers {
                let _ = writeln!(
                    rows,
                    "<tr class=\"{}\"><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    if m.strong { "strong" } else { "" },
                    m.x,
                    i,
                    fmt_num(m.y_from),
                    fmt_num(m.y_to),
                    html_escape(&m.label)
                );
            }
        }
        format!(
            r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; }}
.legend {{ cursor: pointer; }}
.hidden {{ opacity: 0.08; }}
table {{ border-collapse: collapse; margin-top: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; font-size: 13px; }}
tr.strong td {{ color: #b00; }}
</style></head><body>
{svg}
<table id="markers"><thead><tr><th>t (s)</th><th>series</th><th>before</th><th>after</th><th>event</th></tr></thead>
<tbody>
{rows}</tbody></table>
<script>
document.querySelectorAll('.legend').forEach(function (l) {{
  l.addEventListener('click', function () {{
    var i = l.getAttribute('data-series');
    document.querySelectorAll('.series[data-series="' + i + '"]').forEach(function (g) {{ g.classList.toggle('hidden'); }});
    l.classList.toggle('hidden');
  }});
}});
</script>
</body></html>
"#,
            title = html_escape(&self.title),
            svg = self.svg(),
            rows = rows
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_each_columns_extremes_in_order() {
        let pts: Vec<(f64, f64)> = (0..100).map(|i| (0.0, ((i * 37) % 100) as f64)).chain([(5.0, 7.0)]).collect();
        let t = thin(&pts, |x| x as i64);
        assert_eq!(t.first(), Some(&(0.0, 0.0)));
        assert!(t.contains(&(0.0, 99.0)), "{t:?}");
        assert_eq!(t.last(), Some(&(5.0, 7.0)));
        assert!(t.len() <= 5, "{t:?}");
        assert_eq!(tick_step(1000.0, 5.0), 200.0);
        assert_eq!(tick_step(7.0, 10.0), 1.0);
    }
}

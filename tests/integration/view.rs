//! What a person sees: the `.html` and the `.svg` of one real profile,
//! screenshotted by headless Chromium at 1400 px wide and measured pixel by
//! pixel, so a page whose DOM is right but paints the flame graph in a
//! corner fails.
use super::common::*;

/// The window, as in the user's report.
const WINDOW: (u32, u32) = (1400, 900);

/// Prints, for each PNG given, the share of the window's columns and of its
/// pixels that are flame-graph colour, and the first and last such column.
/// inferno's frames are saturated (red, orange, yellow, green, aqua; black
/// labels on them stay saturated once blended); the page is white, the
/// flame graph's background a #eeeeee to #eeeeb0 gradient, and its title,
/// Search and details text black or grey on that gradient: those are grey
/// (max - min < 40) or keep the gradient's r = g and b >= 0.7 r (yellow
/// frames have b <= 0.4 r).
const MEASURE: &str = r#"
import json, sys
from PIL import Image
out = []
for path in sys.argv[1:]:
    im = Image.open(path).convert("RGB")
    w, h = im.size
    cols = [0] * w
    n = 0
    for i, (r, g, b) in enumerate(im.getdata()):
        if max(r, g, b) - min(r, g, b) < 40:
            continue
        if abs(r - g) <= 4 and b >= 0.7 * r:
            continue
        n += 1
        cols[i % w] = 1
    xs = [x for x in range(w) if cols[x]]
    out.append({"w": w, "h": h, "width": sum(cols) / w, "area": n / (w * h),
                "left": xs[0] if xs else -1, "right": xs[-1] if xs else -1})
print(json.dumps(out))
"#;

/// Added to a copy of the page (never to the file under test): once the
/// flame graph's own setup has run, the boxes of its title, Search control
/// and frames, in CSS pixels, as `data-boxes` on the body.
const PROBE: &str = "<script>window.addEventListener('load',function(){setTimeout(function(){\
    var b=function(id){var r=document.getElementById(id).getBoundingClientRect();\
    return id+' '+[r.left,r.top,r.right,r.bottom].map(Math.round).join(' ');};\
    document.body.setAttribute('data-boxes',[b('title'),b('search'),b('frames')].join(';'));},500);});</script>";

fn chromium(args: &[&str], url: &str) -> std::process::Output {
    Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
        // inferno sizes the graph in a timer after load: let it run.
        .arg("--virtual-time-budget=3000")
        .args(args)
        .arg(url)
        .output()
        .expect("chromium (Debian package chromium)")
}

fn screenshot(file: &std::path::Path, png: &std::path::Path) {
    let out = chromium(&[&format!("--screenshot={}", png.display())], &format!("file://{}", file.display()));
    assert!(png.exists(), "screenshot of {file:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn html_flame_graph_paints_as_wide_as_the_svg() {
    let bin = build_workload("burn", FP);
    let dir = std::env::temp_dir().join(format!("sonde-view-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = KillOnDrop(Command::new(&bin).arg("6").spawn().unwrap());
    thread::sleep(Duration::from_millis(200));
    let (html, svg) = (dir.join("p.html"), dir.join("p.svg"));
    let pid = w.0.id().to_string();
    let (code, err) =
        profile(&["-p", &pid, "-F", "199", "-d", "2s", "-o", html.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    let _ = w.0.kill();
    assert_eq!(code, 0, "{err}");

    let (html_png, svg_png) = (dir.join("html.png"), dir.join("svg.png"));
    screenshot(&html, &html_png);
    screenshot(&svg, &svg_png);
    // Debian's interpreter, the one python3-pil installs into (a python3
    // earlier in PATH, e.g. pyenv's, may not have it).
    let out = Command::new("/usr/bin/python3")
        .args(["-c", MEASURE])
        .args([&html_png, &svg_png])
        .output()
        .expect("/usr/bin/python3 (Debian package python3)");
    assert!(out.status.success(), "measuring (needs python3-pil): {}", String::from_utf8_lossy(&out.stderr));
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (h, s) = (&m[0], &m[1]);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    let figures = format!("HTML {h}\nSVG  {s}\nscreenshots in {}", dir.display());
    eprintln!("{figures}");
    assert_eq!((h["w"].as_u64(), h["h"].as_u64()), (Some(WINDOW.0 as u64), Some(WINDOW.1 as u64)), "{figures}");
    // The SVG alone fills the window but for inferno's 10 px margins.
    assert!(f(s, "width") >= 0.95, "the SVG's own flame graph: {figures}");
    // The page paints as wide as the SVG, and as much of the window.
    assert!(f(h, "width") >= 0.90, "the HTML's flame graph covers too little of the window's width: {figures}");
    assert!((f(h, "width") - f(s, "width")).abs() <= 0.03, "HTML vs SVG width: {figures}");
    assert!((f(h, "area") - f(s, "area")).abs() <= 0.1 * f(s, "area"), "HTML vs SVG area: {figures}");

    // The title, centred over the frames, clear of the Search control.
    let probe = dir.join("probe.html");
    std::fs::write(&probe, std::fs::read_to_string(&html).unwrap().replace("</body>", &format!("{PROBE}</body>")))
        .unwrap();
    let out = chromium(&["--dump-dom"], &format!("file://{}", probe.display()));
    let dom = String::from_utf8_lossy(&out.stdout);
    let boxes = dom.split("data-boxes=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
    let get = |id: &str| -> Vec<f64> {
        boxes
            .split(';')
            .find_map(|b| b.strip_prefix(id))
            .unwrap_or_else(|| panic!("box of #{id} in {boxes:?}: {}", String::from_utf8_lossy(&out.stderr)))
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    };
    eprintln!("boxes (left top right bottom): {boxes}");
    let (title, search, frames) = (get("title "), get("search "), get("frames "));
    let overlap = title[0] < search[2] && search[0] < title[2] && title[1] < search[3] && search[1] < title[3];
    assert!(!overlap, "title {title:?} overlaps Search {search:?}; {figures}");
    let centre = (title[0] + title[2]) / 2.0;
    assert!((centre - WINDOW.0 as f64 / 2.0).abs() < 20.0, "title {title:?} not centred in the window; {figures}");
    assert!(frames[2] - frames[0] >= WINDOW.0 as f64 - 40.0, "frames {frames:?} narrower than the window");

    // A zoomed view's link (?x=..&y=.. as a click writes it) opens zoomed:
    // every frame outside the clicked one's subtree hidden, no script error.
    let page = std::fs::read_to_string(&html).unwrap();
    let rect = page.split("<rect ").find(|r| r.contains("fg:x=\"") && !r.contains("fg:x=\"0\"")).expect("a frame");
    let attr = |k: &str| rect.split(&format!(" {k}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap().to_string();
    let out = chromium(&["--dump-dom"], &format!("file://{}?x={}&y={}", html.display(), attr("fg:x"), attr("y")));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("Uncaught"), "opening a zoomed link: {log}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("class=\"hide\""), "the link did not zoom: {log}");
    let _ = std::fs::remove_dir_all(&dir);
}

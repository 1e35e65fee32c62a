//! `kairos report` as a reader meets it: the page drawn from small fixed result files (real
//! bench runs at tiny parameters, see tests/fixtures/report/README.md) has every figure with its
//! plotted series, axis labels with units and the numbers of the runs it names; and a headless
//! Chromium, when installed, loads it without console errors.

// A test that drives a browser process: it bounds its run with the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the fixture folder exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "fixtures missing in {}", dir.display());
    files
}

fn kairos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos")).args(args).output().expect("kairos runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Renders the report from the fixtures into `out` and returns the page.
fn render(out: &Path) -> String {
    let files = fixtures();
    let mut args = vec!["report".to_string(), "--out".to_string(), out.display().to_string()];
    args.extend(files.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = kairos(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::read_to_string(out.join("index.html")).expect("the report wrote index.html")
}

/// The page's figures by id (`<figure id="fig-ID" …>…</figure>`).
fn figures(html: &str) -> BTreeMap<String, String> {
    html.split("<figure id=\"fig-")
        .skip(1)
        .map(|chunk| {
            let id = chunk.split('"').next().unwrap().to_string();
            let body = chunk.split("</figure>").next().unwrap().to_string();
            (id, body)
        })
        .collect()
}

#[test]
fn report_from_result_files_draws_every_figure_with_its_series_and_units() {
    let dir = tempfile::tempdir().unwrap();
    let html = render(dir.path());
    let figs = figures(&html);

    // figure id → series names it must plot and axis labels (with units) it must carry.
    let expected: &[(&str, &[&str], &[&str])] = &[
        (
            "tiga-cdf",
            &["tiga", "2pl-paxos", "occ-paxos", "tapir", "coordinators in hk"],
            &["commit latency (ms)", "share of committed transactions"],
        ),
        (
            "tiga-throughput",
            &["tiga", "2pl-paxos", "occ-paxos", "tapir"],
            &["throughput (txn/s)", "median latency (ms)"],
        ),
        ("tiga-skew", &["tiga", "2pl-paxos", "occ-paxos", "tapir"], &["Zipf skew (exponent)", "median latency (ms)"]),
        ("tiga-clocks", &["huygens", "chrony", "bad"], &["commit latency (ms)"]),
        ("tiga-placement", &["co-located", "separated"], &["commit latency (ms)"]),
        ("tiga-headroom", &["p50", "p90", "zero headroom"], &["headroom shift (ms)", "commit latency (ms)"]),
        (
            "swarm-cdf-sim",
            &["swarm-kv", "dm-abd", "raw"],
            &["get latency (µs)", "update latency (µs)", "share of operations"],
        ),
        ("swarm-cdf-shm", &["swarm-kv", "dm-abd", "raw"], &["get latency (µs)", "update latency (µs)"]),
        (
            "swarm-offset",
            &["gets in 1 RTT", "updates in 1 RTT"],
            &["largest client clock offset (µs)", "operations in one round trip (%)"],
        ),
        ("swarm-memory", &["swarm-kv", "dm-abd", "raw"], &["bytes per key (B)"]),
        ("causal-throughput", &["3 members, on", "5 members, off"], &["throughput (ops/s)"]),
        ("causal-hmac", &["3 members, range", "3 members, per-reply"], &["HMACs per 10⁶ replies"]),
        ("causal-reads", &["3 members", "5 members", "read preference secondary"], &["reads (ops/s)"]),
    ];
    for (id, series, labels) in expected {
        let body = figs.get(*id).unwrap_or_else(|| panic!("figure {id} missing; figures: {:?}", figs.keys()));
        assert!(body.contains("<svg"), "figure {id} has no SVG plot");
        let svg: String = body.split("<svg").skip(1).collect::<Vec<_>>().join("<svg");
        for s in *series {
            assert!(svg.contains(&format!(">{s}<")) || svg.contains(s), "figure {id}: series `{s}` not plotted");
        }
        for l in *labels {
            assert!(svg.contains(l), "figure {id}: axis label `{l}` missing");
        }
        assert!(
            body.contains("<figcaption>") && body.contains("Paper") && body.contains("Kairos"),
            "figure {id}: caption"
        );
        assert!(body.contains("<table>"), "figure {id}: no table beside the plot");
    }
    // The recovery timeline says why it is not drawn instead of drawing nothing silently.
    let recovery = &figs["tiga-recovery"];
    assert!(!recovery.contains("<svg") && recovery.contains("no view change"), "{recovery}");

    // One section per system, each with its figures, and the provenance block.
    for section in ["tiga", "swarm", "causal", "provenance"] {
        assert!(html.contains(&format!("<section id=\"{section}\">")), "section {section} missing");
    }
    for f in fixtures() {
        assert!(html.contains(&f.display().to_string()), "provenance does not name {}", f.display());
    }
    assert!(html.contains("read result files given on the command line"));
    assert!(html.contains("strict-serializable valid") && html.contains("linearizable valid"));
    assert!(!html.contains("<script"), "the page needs no JavaScript");
}

#[test]
fn report_numbers_come_from_the_result_files() {
    let dir = tempfile::tempdir().unwrap();
    let html = render(dir.path());
    let micro: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/tiga-micro.json"))
            .unwrap(),
    )
    .unwrap();
    // Each protocol's median from its recorded CDF is in the table beside the CDF figure.
    let figs = figures(&html);
    for run in micro.as_array().unwrap() {
        let cdf = run["latency_cdf_ms"].as_array().unwrap();
        let p50 = cdf.iter().find(|p| p[1].as_f64().unwrap() >= 0.5 - 1e-9).unwrap()[0].as_f64().unwrap();
        let cell = format!("<td>{p50:.1} / ");
        assert!(figs["tiga-cdf"].contains(&cell), "{} median {cell} not in the table", run["protocol"]);
    }
    // The trace hash of every simulated run is in the provenance block.
    let hash = micro[0]["trace_hash"].as_str().unwrap();
    assert!(html.contains(hash));
}

#[test]
fn report_explains_bad_input_and_teaches_in_help() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("notes.json");
    std::fs::write(&bad, "this is not a result file").unwrap();
    let o = kairos(&["report", "--out", dir.path().join("out").to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("kairos bench"), "the error says what to pass: {}", text(&o));

    let o = kairos(&["report", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = text(&o);
    assert!(help.contains("Examples:") && help.contains("kairos report --quick") && help.contains("--out"), "{help}");
}

/// Loads the page in headless Chromium (Debian's `chromium`, installed by .ci/run) and takes a
/// screenshot: the PNG must be a real picture and the console must show no error.
#[test]
fn chromium_loads_the_report_without_console_errors() {
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        eprintln!("SKIPPED: /usr/bin/chromium is not installed (apt-get install -y chromium)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    render(dir.path());
    let page = dir.path().join("index.html");
    let png = dir.path().join("report.png");
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", dir.path().join("profile").display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,3000")
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().ok();
            panic!("chromium did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let log = text(&out);
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Uncaught") || l.contains("ERROR:CONSOLE") || l.contains(":CONSOLE("))
        .collect();
    assert!(console_errors.is_empty(), "console errors: {console_errors:?}");
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot ({e}); chromium said:\n{log}"));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "the screenshot is not a PNG");
    // A blank 1200×3000 page compresses to a few kB; figures and tables make it far larger.
    assert!(bytes.len() > 50_000, "the screenshot is nearly empty ({} bytes)", bytes.len());
    if let Ok(keep) = std::env::var("KAIROS_REPORT_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
}

#[test]
fn bench_plot_writes_the_runs_figure() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("figs/swarm.svg");
    let o = kairos(&[
        "bench",
        "swarm",
        "--backend",
        "sim",
        "--ops",
        "100",
        "--keys",
        "200",
        "--warmup",
        "200",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let svg = std::fs::read_to_string(&svg).expect("--plot wrote the SVG");
    for series in ["swarm-kv get", "swarm-kv update", "dm-abd get", "raw update"] {
        assert!(svg.contains(series), "series `{series}` not plotted");
    }
    assert!(svg.contains("latency (µs)") && svg.contains("share of completed operations"));

    let svg = dir.path().join("tiga.svg");
    let o = kairos(&["bench", "tiga", "--load", "300,600", "--duration-s", "0.5", "--plot", svg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let svg = std::fs::read_to_string(&svg).expect("--plot wrote the SVG");
    assert!(svg.contains("tiga, 300 ops/s offered") && svg.contains("tiga, 600 ops/s offered"), "one series per load");
    assert!(svg.contains("latency (ms)"));
}

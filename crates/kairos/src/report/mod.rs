//! The report page: the papers' figures as inline SVG with the tables beside them, each
//! captioned with the paper's number it reproduces and Kairos's measured ratio, and a
//! provenance block naming every run plotted. One self-contained HTML file, no JavaScript.

pub mod figures;
pub mod plot;

use crate::result::RunResult;

/// Where a set of results came from: a run made by this report, or a file it was given.
pub struct Input {
    /// The result file (written by the report's own run, or given on the command line).
    pub path: String,
    /// The command line of the run, when the report ran it itself.
    pub command: Option<String>,
    /// Wall seconds the run took, when the report ran it itself.
    pub wall_s: Option<f64>,
    pub results: Vec<RunResult>,
}

/// One figure: its SVG panels, what the paper reports and what Kairos measured.
pub struct Figure {
    pub id: String,
    /// The paper's figure (or section) it reproduces.
    pub number: String,
    pub title: String,
    pub svgs: Vec<String>,
    pub paper: String,
    pub measured: String,
    /// An HTML table of the plotted numbers.
    pub table: String,
}

pub struct Section {
    pub id: String,
    pub title: String,
    pub figures: Vec<Figure>,
}

/// Facts about the report itself for the provenance block.
pub struct Provenance {
    /// "ran the quick plan", "ran the full plan" or "read result files".
    pub mode: String,
    pub commit: String,
    pub cores: usize,
    pub kairos_version: String,
    pub generated_unix_s: u64,
    pub wall_s: f64,
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The sections of the report from every result given.
pub fn sections(inputs: &[Input]) -> Vec<Section> {
    let all: Vec<&RunResult> = inputs.iter().flat_map(|i| &i.results).collect();
    vec![figures::tiga(&all), figures::swarm(&all), figures::causal(&all)]
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1500px}\
h1{font-size:24px}h2{font-size:20px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:36px}\
figure{margin:18px 0;padding:12px;border:1px solid #ddd;border-radius:6px}\
figure .row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}\
figure .panels{display:flex;flex-wrap:wrap;gap:8px;max-width:1140px}\
figcaption{margin-top:8px;font-size:14px;line-height:1.45}\
figcaption .paper{color:#555}figcaption .measured{font-weight:bold}\
figure.missing{background:#fafafa;color:#555}\
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\
th{background:#f2f2f2}td:first-child{text-align:left}\
.prov td{text-align:left}code{font-size:12px}";

/// The whole page.
pub fn page(sections: &[Section], inputs: &[Input], prov: &Provenance) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str("<title>Kairos report</title>");
    h.push_str(&format!("<style>{STYLE}</style></head><body>\n"));
    h.push_str("<h1>Kairos report: the papers' figures, measured</h1>\n");
    h.push_str(&format!(
        "<p>{} result objects from {} result files ({}). Every plotted point, table cell and measured ratio \
         below is read from those results; the paper's numbers are quoted from the project's briefs. \
         The provenance block at the end names every run.</p>\n",
        inputs.iter().map(|i| i.results.len()).sum::<usize>(),
        inputs.len(),
        esc(&prov.mode)
    ));
    h.push_str("<ul>");
    for s in sections {
        h.push_str(&format!("<li><a href=\"#{}\">{}</a></li>", esc(&s.id), esc(&s.title)));
    }
    h.push_str("<li><a href=\"#provenance\">Provenance</a></li></ul>\n");
    for s in sections {
        h.push_str(&format!("<section id=\"{}\"><h2>{}</h2>\n", esc(&s.id), esc(&s.title)));
        for f in &s.figures {
            let class = if f.svgs.is_empty() { " class=\"missing\"" } else { "" };
            h.push_str(&format!("<figure id=\"fig-{}\"{class}><div class=\"row\"><div class=\"panels\">", esc(&f.id)));
            for svg in &f.svgs {
                h.push_str(&format!("<div class=\"panel\">{svg}</div>"));
            }
            h.push_str(&format!("</div><div class=\"table\">{}</div></div>", f.table));
            h.push_str(&format!(
                "<figcaption><b>{} — {}.</b> <span class=\"paper\">{}</span> <span class=\"measured\">{}</span></figcaption></figure>\n",
                esc(&f.number),
                esc(&f.title),
                esc(&f.paper),
                esc(&f.measured)
            ));
        }
        h.push_str("</section>\n");
    }
    h.push_str(&provenance(inputs, prov));
    h.push_str("</body></html>\n");
    h
}

fn provenance(inputs: &[Input], prov: &Provenance) -> String {
    let mut h = String::from("<section id=\"provenance\"><h2>Provenance</h2>\n<table class=\"prov\">");
    for (k, v) in [
        ("source of the results", prov.mode.clone()),
        ("kairos", prov.kairos_version.clone()),
        ("commit", prov.commit.clone()),
        ("machine cores", prov.cores.to_string()),
        ("generated (Unix seconds)", prov.generated_unix_s.to_string()),
        ("report wall time", format!("{:.1} s", prov.wall_s)),
    ] {
        h.push_str(&format!("<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v)));
    }
    h.push_str("</table>\n");
    for i in inputs {
        h.push_str(&format!(
            "<h3><code>{}</code></h3><p>{}</p>",
            esc(&i.path),
            match (&i.command, i.wall_s) {
                (Some(c), Some(w)) => format!("run by this report ({w:.1} s wall): <code>{}</code>", esc(c)),
                (Some(c), None) => format!("run by this report: <code>{}</code>", esc(c)),
                _ => "read from the file given on the command line".into(),
            }
        ));
        h.push_str(
            "<table class=\"prov\"><tr><th>system</th><th>protocol</th><th>host</th><th>clock</th><th>seed</th>\
             <th>workload</th><th>check</th><th>checker</th><th>ops checked</th><th>trace hash</th><th>wall s</th></tr>",
        );
        for r in &i.results {
            h.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td></tr>",
                esc(&r.system),
                esc(&r.protocol),
                esc(&r.host),
                esc(&r.clock),
                r.seed,
                esc(&r.workload.to_string()),
                esc(&format!("{} {}", r.check.model, r.check.verdict)),
                esc(&r.check.checker),
                r.check.ops,
                esc(r.trace_hash.as_deref().unwrap_or("-")),
                r.wall_s
            ));
        }
        h.push_str("</table>\n");
    }
    h.push_str("</section>\n");
    h
}

/// The figure of one `kairos bench … --plot PATH.svg` run: the latency CDF of every result
/// (SWARM: of gets and updates, in µs), one series per result, labelled by what differs.
pub fn run_figure(title: &str, results: &[RunResult]) -> Result<String, String> {
    let by_op = results.iter().any(|r| !r.latency_cdf_ms_by_op.is_empty());
    let label = |r: &RunResult| {
        let same_protocol = results.iter().filter(|o| o.protocol == r.protocol).count() > 1;
        if !same_protocol {
            return r.protocol.clone();
        }
        match (r.system.as_str(), r.offered_ops_per_s) {
            ("causal", _) => format!(
                "{}, {} members, {} signing",
                r.protocol,
                r.workload.get("members").and_then(|v| v.as_u64()).unwrap_or(0),
                r.workload.get("signing").and_then(|v| v.as_str()).unwrap_or("?").to_lowercase()
            ),
            (_, Some(load)) => format!("{}, {load:.0} ops/s offered", r.protocol),
            _ => format!("{}, seed {}", r.protocol, r.seed),
        }
    };
    let mut series = Vec::new();
    for r in results {
        if by_op {
            for (op, cdf) in &r.latency_cdf_ms_by_op {
                series.push(plot::Series {
                    name: format!("{} {op}", label(r)),
                    points: cdf.iter().map(|p| (p[0] * 1e3, p[1])).collect(),
                    markers: false,
                });
            }
        } else if !r.latency_cdf_ms.is_empty() {
            series.push(plot::Series {
                name: label(r),
                points: r.latency_cdf_ms.iter().map(|p| (p[0], p[1])).collect(),
                markers: false,
            });
        }
    }
    if series.is_empty() {
        return Err("no run completed an operation, so there is no latency to plot".into());
    }
    let x_label = if by_op { "latency (µs)" } else { "latency (ms)" };
    plot::lines(title, x_label, "share of completed operations", &series, true)
}

/// Writes `run_figure` to `path` (`kairos bench … --plot PATH.svg`), creating parent folders.
pub fn write_run_figure(path: &std::path::Path, title: &str, results: &[RunResult]) -> Result<(), crate::CliError> {
    let svg =
        run_figure(title, results).map_err(|e| crate::CliError::Runtime(format!("--plot {}: {e}", path.display())))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| crate::CliError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(path, svg).map_err(|e| crate::CliError::Io(format!("cannot write {}: {e}", path.display())))?;
    println!("wrote {}", path.display());
    Ok(())
}

//! The papers' figures, drawn from result objects. Every number a figure shows — the plotted
//! points, the table beside it and the measured ratio in its caption — is read from the result
//! objects given; the paper's numbers are quoted from the project's briefs (tiga.md, swarm.md,
//! causal.md) and say so.

use super::plot::{self, Series};
use super::{Figure, Section};
use crate::result::RunResult;
use crate::stats::Cdf;
use std::collections::BTreeMap;

/// The value of a CDF at quantile `q` (the first sampled point at or above it).
pub fn quantile(cdf: &Cdf, q: f64) -> Option<f64> {
    cdf.iter().find(|p| p[1] >= q - 1e-9).map(|p| p[0])
}

fn extra_f64(r: &RunResult, key: &str) -> Option<f64> {
    r.extra.get(key).and_then(|v| v.as_f64())
}

fn workload_f64(r: &RunResult, key: &str) -> Option<f64> {
    r.workload.get(key).and_then(|v| v.as_f64())
}

fn workload_str<'a>(r: &'a RunResult, key: &str) -> Option<&'a str> {
    r.workload.get(key).and_then(|v| v.as_str())
}

fn cdf_series(name: &str, cdf: &Cdf, x_scale: f64) -> Series {
    Series { name: name.to_string(), points: cdf.iter().map(|p| (p[0] * x_scale, p[1])).collect(), markers: false }
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

fn x(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}×"))
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let esc = super::esc;
    let mut t = String::from("<table><thead><tr>");
    for h in header {
        t.push_str(&format!("<th>{}</th>", esc(h)));
    }
    t.push_str("</tr></thead><tbody>");
    for r in rows {
        t.push_str("<tr>");
        for c in r {
            t.push_str(&format!("<td>{}</td>", esc(&c)));
        }
        t.push_str("</tr>");
    }
    t.push_str("</tbody></table>");
    t
}

fn svg_or_note(result: Result<String, String>, notes: &mut Vec<String>) -> Option<String> {
    match result {
        Ok(s) => Some(s),
        Err(e) => {
            notes.push(e);
            None
        }
    }
}

fn missing(id: &str, number: &str, title: &str, paper: &str, why: &str) -> Figure {
    Figure {
        id: id.into(),
        number: number.into(),
        title: title.into(),
        svgs: Vec::new(),
        paper: paper.into(),
        measured: why.into(),
        table: String::new(),
    }
}

/// What a figure is: its id in the page, the paper's figure it reproduces, its title and the
/// paper's claim.
struct Head<'a> {
    id: &'a str,
    number: &'a str,
    title: &'a str,
    paper: &'a str,
}

const REGION_ORDER: [&str; 4] = ["sc", "fi", "br", "hk"];

fn order_regions(mut regions: Vec<String>) -> Vec<String> {
    regions.sort_by_key(|r| (REGION_ORDER.iter().position(|o| o == r).unwrap_or(usize::MAX), r.clone()));
    regions.dedup();
    regions
}

fn verdict(r: &RunResult) -> String {
    r.extra.get("verdict").and_then(|v| v.as_str()).map(str::to_string).unwrap_or_else(|| r.check.verdict.clone())
}

// ---------------------------------------------------------------- Tiga

/// Tiga and its peers side by side (`kairos bench micro`): results carry the throughput search.
fn is_micro(r: &RunResult) -> bool {
    r.system == "tiga" && r.extra.contains_key("throughput_search")
}

pub fn tiga(results: &[&RunResult]) -> Section {
    let micro: Vec<&RunResult> = results.iter().copied().filter(|r| is_micro(r)).collect();
    let single: Vec<&RunResult> =
        results.iter().copied().filter(|r| r.system == "tiga" && r.protocol == "tiga" && !is_micro(r)).collect();
    let mut figures = vec![
        tiga_cdf(&micro),
        tiga_throughput_latency(&micro),
        tiga_skew(&micro),
        tiga_clocks(&single),
        tiga_placement(&single),
        tiga_headroom(&single),
    ];
    figures.push(missing(
        "tiga-recovery",
        "Tiga §leader failure",
        "Recovery timeline after a leader failure",
        "Paper: back to the same throughput 3.8 s after the leader is killed at 80k txn/s.",
        "Not drawn: Kairos's Tiga has no view change yet (leaders cannot fail over; see README, Next), so there \
         is no run to plot. This figure appears once `kairos bench tiga` can kill a leader.",
    ));
    Section {
        id: "tiga".into(),
        title: "Tiga (SOSP 2025): strictly serializable transactions in one WAN round trip".into(),
        figures,
    }
}

fn tiga_cdf(micro: &[&RunResult]) -> Figure {
    let paper = "Paper (MicroBench, skew 0.5): Tiga's median latency is 1.4–4.6× lower than every baseline's; \
                 per-region medians SC 134, FI 186, BR 188, HK 313 ms.";
    let title = "Latency CDF per coordinator region, Tiga and every peer";
    if micro.is_empty() {
        return missing("tiga-cdf", "Tiga Fig. 8/9", title, paper, "No `kairos bench micro` result given.");
    }
    let regions = order_regions(micro.iter().flat_map(|r| r.latency_cdf_ms_by_region.keys().cloned()).collect());
    let mut notes = Vec::new();
    let mut svgs = Vec::new();
    for region in &regions {
        let series: Vec<Series> = micro
            .iter()
            .filter_map(|r| r.latency_cdf_ms_by_region.get(region).map(|c| cdf_series(&r.protocol, c, 1.0)))
            .collect();
        let load = micro[0].offered_ops_per_s.unwrap_or(0.0);
        svgs.extend(svg_or_note(
            plot::lines(
                &format!("coordinators in {region}, {load:.0} txn/s"),
                "commit latency (ms)",
                "share of committed transactions",
                &series,
                true,
            ),
            &mut notes,
        ));
    }
    let tiga_p50 = micro.iter().find(|r| r.protocol == "tiga").and_then(|r| quantile(&r.latency_cdf_ms, 0.5));
    let peers: Vec<String> = micro
        .iter()
        .filter(|r| r.protocol != "tiga")
        .map(|r| format!("{} {}", r.protocol, x(ratio(quantile(&r.latency_cdf_ms, 0.5), tiga_p50))))
        .collect();
    let mut header = vec!["protocol".to_string(), "all p50 / p90 ms".to_string()];
    header.extend(regions.iter().map(|r| format!("{r} p50 / p90 ms")));
    header.push("check".into());
    let rows = micro
        .iter()
        .map(|r| {
            let pq = |c: Option<&Cdf>| match c {
                Some(c) => format!("{:.1} / {:.1}", quantile(c, 0.5).unwrap_or(0.0), quantile(c, 0.9).unwrap_or(0.0)),
                None => "-".into(),
            };
            let mut row = vec![r.protocol.clone(), pq(Some(&r.latency_cdf_ms))];
            row.extend(regions.iter().map(|g| pq(r.latency_cdf_ms_by_region.get(g))));
            row.push(verdict(r));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    Figure {
        id: "tiga-cdf".into(),
        number: "Tiga Fig. 8/9".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos: peers' median latency over Tiga's (all regions, from the plotted CDFs): {}.{}",
            if peers.is_empty() { "no peer ran".into() } else { peers.join(", ") },
            notes.join(" ")
        ),
        table: table(&header, rows),
    }
}

fn sweep_points(r: &RunResult, key: &str) -> Vec<serde_json::Value> {
    r.extra.get(key).and_then(|v| v.as_array()).cloned().unwrap_or_default()
}

fn point_f64(p: &serde_json::Value, path: &[&str]) -> Option<f64> {
    let mut v = p;
    for k in path {
        v = v.get(k)?;
    }
    v.as_f64()
}

fn tiga_throughput_latency(micro: &[&RunResult]) -> Figure {
    let paper = "Paper (MicroBench, skew 0.5, max 10³ txn/s): Tiga 157.3, 2PL+Paxos 22.9, OCC+Paxos 21.8, Tapir 44.2, \
                 Janus 77.8, Calvin+ 119.6, Detock 34.5, NCC 47.4 (unreplicated; NCC+ is not in the table) — Tiga 6.9×, 7.2×, \
                 3.6×, 2.0×, 1.3×, 4.6×, 3.3× \
                 (1.3–7.2× over all baselines).";
    let title = "Throughput–latency curves (saturation sweeps)";
    if micro.is_empty() {
        return missing("tiga-throughput", "Tiga Fig. 7", title, paper, "No `kairos bench micro` result given.");
    }
    let mut series = Vec::new();
    let mut rows = Vec::new();
    let mut max = BTreeMap::new();
    for r in micro {
        let pts = sweep_points(r, "throughput_search");
        // In order of offered load: past saturation the curve turns back (less throughput, more latency).
        let mut by_offered: Vec<(f64, f64, f64)> = pts
            .iter()
            .filter_map(|p| {
                Some((
                    point_f64(p, &["offered_txn_per_s"])?,
                    point_f64(p, &["throughput_txn_per_s"])?,
                    point_f64(p, &["latency_ms", "p50"])?,
                ))
            })
            .collect();
        by_offered.sort_by(|a, b| a.0.total_cmp(&b.0));
        let xy: Vec<(f64, f64)> = by_offered.iter().map(|p| (p.1, p.2)).collect();
        max.insert(r.protocol.clone(), xy.iter().map(|p| p.0).fold(0.0, f64::max));
        for p in &pts {
            rows.push(vec![
                r.protocol.clone(),
                format!("{:.0}", point_f64(p, &["offered_txn_per_s"]).unwrap_or(0.0)),
                format!("{:.0}", point_f64(p, &["throughput_txn_per_s"]).unwrap_or(0.0)),
                format!("{:.1}", point_f64(p, &["latency_ms", "p50"]).unwrap_or(0.0)),
                format!("{:.3}", point_f64(p, &["commit_rate"]).unwrap_or(0.0)),
                p.get("verdict").and_then(|v| v.as_str()).unwrap_or("-").to_string(),
            ]);
        }
        series.push(Series { name: r.protocol.clone(), points: xy, markers: true });
    }
    let mut notes = Vec::new();
    let svgs: Vec<String> =
        svg_or_note(plot::lines(title, "throughput (txn/s)", "median latency (ms)", &series, true), &mut notes)
            .into_iter()
            .collect();
    let tiga_max = max.get("tiga").copied();
    let ratios: Vec<String> = max
        .iter()
        .filter(|(p, _)| p.as_str() != "tiga")
        .map(|(p, m)| format!("over {p} {}", x(ratio(tiga_max, Some(*m)))))
        .collect();
    Figure {
        id: "tiga-throughput".into(),
        number: "Tiga Fig. 7".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos: Tiga's highest plotted throughput {} (CPU model {}: each handler costs a fixed time, so the \
             ratio reflects work per transaction, not code speed; a sweep that never saturated understates it).{}",
            ratios.join(", "),
            micro[0].extra.get("cpu_model").and_then(|v| v.as_str()).unwrap_or("?"),
            notes.join(" ")
        ),
        table: table(&["protocol", "offered txn/s", "throughput txn/s", "p50 ms", "commit rate", "check"], rows),
    }
}

fn tiga_skew(micro: &[&RunResult]) -> Figure {
    let paper = "Paper: from skew 0.5 to 0.99 at a fixed load every baseline degrades except Calvin+, whose latency \
                 is 33% higher than Tiga's.";
    let title = "Median latency against Zipf skew";
    let with: Vec<&&RunResult> = micro.iter().filter(|r| !sweep_points(r, "skew_sweep").is_empty()).collect();
    if with.is_empty() {
        return missing(
            "tiga-skew",
            "Tiga Fig. 10",
            title,
            paper,
            "No `kairos bench micro --skew-sweep` result given.",
        );
    }
    let mut series = Vec::new();
    let mut rows = Vec::new();
    for r in &with {
        let pts = sweep_points(r, "skew_sweep");
        let xy: Vec<(f64, f64)> = pts
            .iter()
            .filter_map(|p| Some((point_f64(p, &["skew"])?, point_f64(p, &["latency_ms", "p50"])?)))
            .collect();
        for p in &pts {
            rows.push(vec![
                r.protocol.clone(),
                format!("{}", point_f64(p, &["skew"]).unwrap_or(0.0)),
                format!("{:.1}", point_f64(p, &["latency_ms", "p50"]).unwrap_or(0.0)),
                format!("{:.1}", point_f64(p, &["latency_ms", "p90"]).unwrap_or(0.0)),
                format!("{:.3}", point_f64(p, &["commit_rate"]).unwrap_or(0.0)),
                p.get("verdict").and_then(|v| v.as_str()).unwrap_or("-").to_string(),
            ]);
        }
        series.push(Series { name: r.protocol.clone(), points: xy, markers: true });
    }
    let top = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(f64::NEG_INFINITY, f64::max);
    let at_top = |s: &Series| s.points.iter().find(|p| p.0 == top).map(|p| p.1);
    let tiga = series.iter().find(|s| s.name == "tiga").and_then(at_top);
    let ratios: Vec<String> = series
        .iter()
        .filter(|s| s.name != "tiga")
        .map(|s| format!("{} {}", s.name, x(ratio(at_top(s), tiga))))
        .collect();
    let mut notes = Vec::new();
    let svgs =
        svg_or_note(plot::lines(title, "Zipf skew (exponent)", "median latency (ms)", &series, true), &mut notes)
            .into_iter()
            .collect();
    Figure {
        id: "tiga-skew".into(),
        number: "Tiga Fig. 10".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!("Kairos at skew {top}: peers' median over Tiga's: {}.{}", ratios.join(", "), notes.join(" ")),
        table: table(&["protocol", "skew", "p50 ms", "p90 ms", "commit rate", "check"], rows),
    }
}

fn headroom_shift(r: &RunResult) -> f64 {
    extra_f64(r, "headroom_shift_ms").unwrap_or(0.0)
}

fn zero_headroom(r: &RunResult) -> bool {
    r.extra.get("zero_headroom").and_then(|v| v.as_bool()).unwrap_or(false)
}

fn placement(r: &RunResult) -> String {
    r.extra.get("placement").and_then(|v| v.as_str()).unwrap_or("co-located").replace("colocated", "co-located")
}

/// Single Tiga runs (`kairos bench tiga`), one series per run, compared by `label`.
fn tiga_cdfs_by(
    head: Head,
    runs: Vec<&RunResult>,
    label: impl Fn(&RunResult) -> String,
    base_label: &str,
    what: &str,
) -> Figure {
    let Head { id, number, title, paper } = head;
    if runs.is_empty() {
        return missing(id, number, title, paper, &format!("No `kairos bench tiga` result {what} given."));
    }
    let mut seen = Vec::new();
    let runs: Vec<&RunResult> = runs
        .into_iter()
        .filter(|r| {
            !seen.contains(&label(r)) && {
                seen.push(label(r));
                true
            }
        })
        .collect();
    let series: Vec<Series> = runs.iter().map(|r| cdf_series(&label(r), &r.latency_cdf_ms, 1.0)).collect();
    let base = runs.iter().find(|r| label(r) == base_label).and_then(|r| quantile(&r.latency_cdf_ms, 0.5));
    let ratios: Vec<String> = runs
        .iter()
        .filter(|r| label(r) != base_label)
        .map(|r| format!("{} {}", label(r), x(ratio(quantile(&r.latency_cdf_ms, 0.5), base))))
        .collect();
    let rows = runs
        .iter()
        .map(|r| {
            vec![
                label(r),
                format!("{:.0}", r.offered_ops_per_s.unwrap_or(0.0)),
                format!("{:.0}", r.throughput_ops_per_s),
                format!("{:.1}", quantile(&r.latency_cdf_ms, 0.5).unwrap_or(0.0)),
                format!("{:.1}", quantile(&r.latency_cdf_ms, 0.9).unwrap_or(0.0)),
                format!("{:.1}", 100.0 * r.fast_path_ratio.unwrap_or(0.0)),
                format!("{:.2}", 100.0 * r.rollback_ratio.unwrap_or(0.0)),
                r.check.verdict.clone(),
            ]
        })
        .collect();
    let mut notes = Vec::new();
    let svgs = svg_or_note(
        plot::lines(title, "commit latency (ms)", "share of committed transactions", &series, true),
        &mut notes,
    )
    .into_iter()
    .collect();
    Figure {
        id: id.into(),
        number: number.into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos: median latency over {base_label}'s (from the plotted CDFs): {}.{}",
            if ratios.is_empty() { "only one run".into() } else { ratios.join(", ") },
            notes.join(" ")
        ),
        table: table(
            &["run", "offered txn/s", "throughput txn/s", "p50 ms", "p90 ms", "fast path %", "revised %", "check"],
            rows,
        ),
    }
}

fn tiga_clocks(single: &[&RunResult]) -> Figure {
    let runs: Vec<&RunResult> = single
        .iter()
        .copied()
        .filter(|r| placement(r) == "co-located" && headroom_shift(r) == 0.0 && !zero_headroom(r))
        .collect();
    let base = if runs.iter().any(|r| r.clock == "huygens") { "huygens" } else { "chrony" };
    tiga_cdfs_by(
        Head {
            id: "tiga-clocks",
            number: "Tiga Fig. 13",
            title: "Latency CDF by clock synchronization preset",
            paper: "Paper (skew 0.99): throughput 154.7k–158.1k txn/s across ntpd / chrony / Huygens / bad source; \
                    latency similar for chrony and Huygens, higher with ntpd, much higher with the bad source (the \
                    brief gives no latency ratio).",
        },
        runs,
        |r| r.clock.clone(),
        base,
        "with co-located leaders and no headroom shift",
    )
}

fn tiga_placement(single: &[&RunResult]) -> Figure {
    let runs: Vec<&RunResult> = single
        .iter()
        .copied()
        .filter(|r| r.clock == "chrony" && headroom_shift(r) == 0.0 && !zero_headroom(r))
        .collect();
    tiga_cdfs_by(
        Head {
            id: "tiga-placement",
            number: "Tiga Fig. 12",
            title: "Co-located against separated leaders",
            paper: "Paper: with leaders separated across regions, Tiga's median latency +34% (1.34×) and max \
                    throughput −9.7%.",
        },
        runs,
        placement,
        "co-located",
        "with chrony clocks",
    )
}

fn tiga_headroom(single: &[&RunResult]) -> Figure {
    let paper = "Paper: headroom shifted ±50 ms — the estimate is near-optimal; less headroom → more revisions and \
                 latency, more → transactions held longer; send time only (0 headroom) is worst (the brief gives no \
                 number).";
    let title = "Latency against the headroom shift";
    let runs: Vec<&RunResult> =
        single.iter().copied().filter(|r| r.clock == "chrony" && placement(r) == "co-located").collect();
    let mut shifted: Vec<&RunResult> = runs.iter().copied().filter(|r| !zero_headroom(r)).collect();
    shifted.sort_by(|a, b| headroom_shift(a).total_cmp(&headroom_shift(b)));
    shifted.dedup_by(|a, b| headroom_shift(a) == headroom_shift(b));
    if shifted.len() < 2 {
        return missing(
            "tiga-headroom",
            "Tiga Fig. 14",
            title,
            paper,
            "Fewer than two `kairos bench tiga --headroom-shift-ms` results given.",
        );
    }
    let p = |r: &RunResult, q| quantile(&r.latency_cdf_ms, q).unwrap_or(0.0);
    let mut series = vec![
        Series {
            name: "p50".into(),
            points: shifted.iter().map(|r| (headroom_shift(r), p(r, 0.5))).collect(),
            markers: true,
        },
        Series {
            name: "p90".into(),
            points: shifted.iter().map(|r| (headroom_shift(r), p(r, 0.9))).collect(),
            markers: true,
        },
    ];
    let zero = runs.iter().find(|r| zero_headroom(r));
    let (lo, hi) = (headroom_shift(shifted[0]), headroom_shift(shifted[shifted.len() - 1]));
    if let Some(z) = zero {
        series.push(Series {
            name: "p50, zero headroom (send time)".into(),
            points: vec![(lo, p(z, 0.5)), (hi, p(z, 0.5))],
            markers: false,
        });
    }
    let mut rows: Vec<Vec<String>> = shifted
        .iter()
        .chain(zero)
        .map(|r| {
            vec![
                if zero_headroom(r) { "zero headroom".into() } else { format!("{:+} ms", headroom_shift(r)) },
                format!("{:.1}", p(r, 0.5)),
                format!("{:.1}", p(r, 0.9)),
                format!("{:.2}", 100.0 * r.rollback_ratio.unwrap_or(0.0)),
                format!("{:.1}", 100.0 * r.fast_path_ratio.unwrap_or(0.0)),
                r.check.verdict.clone(),
            ]
        })
        .collect();
    rows.truncate(64);
    let at0 = shifted.iter().find(|r| headroom_shift(r) == 0.0).map(|r| p(r, 0.5));
    let best = shifted.iter().min_by(|a, b| p(a, 0.5).total_cmp(&p(b, 0.5))).map(|r| headroom_shift(r));
    let mut notes = Vec::new();
    let svgs = svg_or_note(plot::lines(title, "headroom shift (ms)", "commit latency (ms)", &series, true), &mut notes)
        .into_iter()
        .collect();
    Figure {
        id: "tiga-headroom".into(),
        number: "Tiga Fig. 14".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos: lowest median at a shift of {} ms; zero headroom's median over the unshifted estimate's: {}.{}",
            best.map_or("n/a".into(), |b| format!("{b:+}")),
            x(ratio(zero.map(|z| p(z, 0.5)), at0)),
            notes.join(" ")
        ),
        table: table(&["headroom", "p50 ms", "p90 ms", "revised %", "fast path %", "check"], rows),
    }
}

// ---------------------------------------------------------------- SWARM

pub fn swarm(results: &[&RunResult]) -> Section {
    let runs: Vec<&RunResult> = results.iter().copied().filter(|r| r.system == "swarm").collect();
    let mut figures = Vec::new();
    let mut hosts: Vec<String> = runs.iter().map(|r| r.host.clone()).collect();
    hosts.sort_by_key(|h| (["sim", "shm", "net"].iter().position(|o| o == h).unwrap_or(usize::MAX), h.clone()));
    hosts.dedup();
    if hosts.is_empty() {
        figures.push(missing(
            "swarm-cdf",
            "SWARM Fig. 6",
            "Latency CDFs of gets and updates",
            "Paper (YCSB B): get median SWARM-KV 2.4 µs vs RAW 1.9 µs, DM-ABD 4.3 µs; update 3.1 vs 1.6 and 4.9 µs.",
            "No `kairos bench swarm` result given.",
        ));
    }
    for host in &hosts {
        figures.push(swarm_cdf(&runs, host));
    }
    figures.push(swarm_offset(&runs));
    figures.push(swarm_memory(&runs));
    Section {
        id: "swarm".into(),
        title: "SWARM (SOSP 2024): a replicated key-value store over passive memory".into(),
        figures,
    }
}

/// The first run of each protocol on `host` (the report lists the side-by-side run first).
fn first_per_protocol<'a>(runs: &[&'a RunResult], host: &str) -> Vec<&'a RunResult> {
    let mut out: Vec<&RunResult> = Vec::new();
    for r in runs.iter().copied().filter(|r| r.host == host) {
        if !out.iter().any(|o| o.protocol == r.protocol) {
            out.push(r);
        }
    }
    out
}

fn swarm_cdf(runs: &[&RunResult], host: &str) -> Figure {
    let runs = first_per_protocol(runs, host);
    let title = format!("Latency CDFs of gets and updates on {host}");
    let mut notes = Vec::new();
    let mut svgs = Vec::new();
    let mut measured = Vec::new();
    let workload = runs.first().and_then(|r| workload_str(r, "name")).unwrap_or("?").to_string();
    for op in ["get", "update"] {
        let series: Vec<Series> = runs
            .iter()
            .filter_map(|r| r.latency_cdf_ms_by_op.get(op).map(|c| cdf_series(&r.protocol, c, 1000.0)))
            .collect();
        if series.is_empty() {
            continue;
        }
        svgs.extend(svg_or_note(
            plot::lines(
                &format!("{op}s on {host}, {workload}"),
                &format!("{op} latency (µs)"),
                "share of operations",
                &series,
                true,
            ),
            &mut notes,
        ));
        let med = |p: &str| {
            runs.iter().find(|r| r.protocol == p).and_then(|r| quantile(r.latency_cdf_ms_by_op.get(op)?, 0.5))
        };
        measured.push(format!(
            "{op}: SWARM-KV/RAW {}, SWARM-KV/DM-ABD {}, SWARM-KV/FUSEE {}",
            x(ratio(med("swarm-kv"), med("raw"))),
            x(ratio(med("swarm-kv"), med("dm-abd"))),
            x(ratio(med("swarm-kv"), med("fusee")))
        ));
    }
    let rows = runs
        .iter()
        .flat_map(|r| {
            r.latency_cdf_ms_by_op.iter().map(move |(op, c)| {
                vec![
                    r.protocol.clone(),
                    op.clone(),
                    format!("{:.2}", quantile(c, 0.01).unwrap_or(0.0) * 1e3),
                    format!("{:.2}", quantile(c, 0.5).unwrap_or(0.0) * 1e3),
                    format!("{:.2}", quantile(c, 0.99).unwrap_or(0.0) * 1e3),
                    format!("{:.0}", r.throughput_ops_per_s),
                    r.check.verdict.clone(),
                ]
            })
        })
        .collect();
    Figure {
        id: format!("swarm-cdf-{host}"),
        number: "SWARM Fig. 6".into(),
        title,
        svgs,
        paper: "Paper (YCSB B, testbed of RDMA machines): get median SWARM-KV 2.4 µs vs RAW 1.9 µs (1.26×) and \
                DM-ABD 4.3 µs (0.56×); update 3.1 µs vs RAW 1.6 µs (1.94×) and DM-ABD 4.9 µs (0.63×); FUSEE get \
                2.9 µs for 87% of gets, update 8.5–10.4 µs (gets up to 2× and updates 3.4× slower than SWARM-KV)."
            .into(),
        measured: format!("Kairos medians (from the plotted CDFs): {}.{}", measured.join("; "), notes.join(" ")),
        table: table(&["protocol", "op", "p1 µs", "p50 µs", "p99 µs", "throughput ops/s", "check"], rows),
    }
}

fn one_rtt_share(r: &RunResult, op: &str) -> Option<f64> {
    let h = r.extra.get("round_trips_by_op")?.get(op)?.as_object()?;
    let total: f64 = h.values().filter_map(|v| v.as_f64()).sum();
    (total > 0.0).then(|| h.get("1").and_then(|v| v.as_f64()).unwrap_or(0.0) / total)
}

fn swarm_offset(runs: &[&RunResult]) -> Figure {
    let title = "SWARM-KV: share of operations in one round trip against client clock offset";
    let paper = "Paper: Safe-Guess finishes in 1 RTT when the guessed timestamp is fresh; the brief gives no number \
                 for a clock-offset sweep (listed among what nobody has measured).";
    let mut sweep: Vec<&RunResult> = runs
        .iter()
        .copied()
        .filter(|r| r.protocol == "swarm-kv" && r.host == "sim" && workload_f64(r, "clock_offset_max_us").is_some())
        .collect();
    sweep.sort_by(|a, b| {
        workload_f64(a, "clock_offset_max_us")
            .unwrap_or(0.0)
            .total_cmp(&workload_f64(b, "clock_offset_max_us").unwrap_or(0.0))
    });
    sweep.dedup_by(|a, b| workload_f64(a, "clock_offset_max_us") == workload_f64(b, "clock_offset_max_us"));
    if sweep.len() < 2 {
        return missing(
            "swarm-offset",
            "SWARM §clock skew",
            title,
            paper,
            "Fewer than two simulated SWARM-KV runs with different --clock-skew-us given.",
        );
    }
    let off = |r: &RunResult| workload_f64(r, "clock_offset_max_us").unwrap_or(0.0);
    let series: Vec<Series> = ["get", "update"]
        .iter()
        .map(|op| Series {
            name: format!("{op}s in 1 RTT"),
            points: sweep.iter().filter_map(|r| Some((off(r), 100.0 * one_rtt_share(r, op)?))).collect(),
            markers: true,
        })
        .collect();
    let rows = sweep
        .iter()
        .map(|r| {
            vec![
                format!("{}", off(r)),
                one_rtt_share(r, "get").map_or("-".into(), |s| format!("{:.2}", 100.0 * s)),
                one_rtt_share(r, "update").map_or("-".into(), |s| format!("{:.2}", 100.0 * s)),
                format!(
                    "{:.2}",
                    quantile(r.latency_cdf_ms_by_op.get("update").unwrap_or(&Vec::new()), 0.5).unwrap_or(0.0) * 1e3
                ),
                r.check.verdict.clone(),
            ]
        })
        .collect();
    let first = sweep[0];
    let last = sweep[sweep.len() - 1];
    let mut notes = Vec::new();
    let svgs = svg_or_note(
        plot::lines(title, "largest client clock offset (µs)", "operations in one round trip (%)", &series, true),
        &mut notes,
    )
    .into_iter()
    .collect();
    Figure {
        id: "swarm-offset".into(),
        number: "SWARM §clock skew".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos: updates in 1 RTT {:.1}% at {} µs offset, {:.1}% at {} µs (ratio {}).{}",
            100.0 * one_rtt_share(first, "update").unwrap_or(0.0),
            off(first),
            100.0 * one_rtt_share(last, "update").unwrap_or(0.0),
            off(last),
            x(ratio(one_rtt_share(last, "update"), one_rtt_share(first, "update"))),
            notes.join(" ")
        ),
        table: table(&["offset µs", "gets 1 RTT %", "updates 1 RTT %", "update p50 µs", "check"], rows),
    }
}

fn swarm_memory(runs: &[&RunResult]) -> Figure {
    let title = "Memory per key";
    let paper = "Paper (1M keys × 1 KiB values): SWARM-KV 4.06 GiB, DM-ABD 3.00, FUSEE 2.04, RAW 0.95 — SWARM-KV 4.3× \
                 RAW's, DM-ABD 3.2×.";
    let host =
        if runs.iter().any(|r| r.host == "sim") { "sim" } else { runs.first().map_or("sim", |r| r.host.as_str()) };
    let runs = first_per_protocol(runs, host);
    let bars: Vec<(String, f64)> =
        runs.iter().filter_map(|r| Some((r.protocol.clone(), extra_f64(r, "memory_bytes_per_key_used")?))).collect();
    let allocated: Vec<(String, f64)> =
        runs.iter().filter_map(|r| Some((r.protocol.clone(), extra_f64(r, "memory_bytes_per_key")?))).collect();
    if bars.is_empty() {
        return missing("swarm-memory", "SWARM Table 2", title, paper, "No `kairos bench swarm` result given.");
    }
    let of = |p: &str| bars.iter().find(|b| b.0 == p).map(|b| b.1);
    let alloc = |p: &str| allocated.iter().find(|b| b.0 == p).map(|b| b.1);
    let value_size = runs.first().and_then(|r| workload_f64(r, "value_size")).unwrap_or(0.0);
    let mut notes = Vec::new();
    let svgs = svg_or_note(
        plot::bars(
            &format!("{title}: bytes touched ({value_size:.0} B values, {host})"),
            "bytes per key (B)",
            &bars,
            |v| format!("{v:.0} B"),
        ),
        &mut notes,
    )
    .into_iter()
    .collect();
    let rows = runs
        .iter()
        .map(|r| {
            vec![
                r.protocol.clone(),
                format!("{:.0}", extra_f64(r, "memory_bytes_per_key").unwrap_or(0.0)),
                format!("{:.0}", extra_f64(r, "memory_bytes_per_key_used").unwrap_or(0.0)),
            ]
        })
        .collect();
    Figure {
        id: "swarm-memory".into(),
        number: "SWARM Table 2".into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!(
            "Kairos ({value_size:.0} B values), bytes touched per key (pages the memory nodes wrote; zeroed \
             memory is allocated on first write): SWARM-KV/RAW {}, DM-ABD/RAW {}, FUSEE/RAW {}; address space \
             reserved per key (the layout reserves the same regions for every protocol): SWARM-KV/RAW {}, \
             DM-ABD/RAW {}.{}",
            x(ratio(of("swarm-kv"), of("raw"))),
            x(ratio(of("dm-abd"), of("raw"))),
            x(ratio(of("fusee"), of("raw"))),
            x(ratio(alloc("swarm-kv"), alloc("raw"))),
            x(ratio(alloc("dm-abd"), alloc("raw"))),
            notes.join(" ")
        ),
        table: table(&["protocol", "reserved B/key", "touched B/key"], rows),
    }
}

// ---------------------------------------------------------------- causal

fn members(r: &RunResult) -> u64 {
    workload_f64(r, "members").unwrap_or(0.0) as u64
}

fn read_pref(r: &RunResult) -> String {
    workload_str(r, "read_pref").unwrap_or("?").to_lowercase()
}

fn signing(r: &RunResult) -> String {
    workload_str(r, "signing").unwrap_or("Range").to_lowercase().replace("perreply", "per-reply")
}

pub fn causal(results: &[&RunResult]) -> Section {
    let runs: Vec<&RunResult> = results.iter().copied().filter(|r| r.system == "causal").collect();
    // On/off and signing compare runs of the read preference of the first causal-off run (the
    // side-by-side run); the read scaling figure prefers reads from secondaries (the paper's
    // setting) when such runs are given.
    let first_pref =
        runs.iter().find(|r| r.protocol == "causal-off").or(runs.first()).map(|r| read_pref(r)).unwrap_or_default();
    let same_pref: Vec<&RunResult> = runs.iter().copied().filter(|r| read_pref(r) == first_pref).collect();
    let secondary: Vec<&RunResult> = runs.iter().copied().filter(|r| read_pref(r) == "secondary").collect();
    Section {
        id: "causal".into(),
        title: "Causal sessions over signed cluster time (SIGMOD 2019)".into(),
        figures: vec![
            causal_on_off(&same_pref),
            causal_hmac(&same_pref),
            causal_reads(if secondary.is_empty() { &same_pref } else { &secondary }),
        ],
    }
}

fn bar_figure(head: Head, y_label: &str, bars: Vec<(String, f64)>, measured: String, fmt: fn(f64) -> String) -> Figure {
    let Head { id, number, title, paper } = head;
    if bars.is_empty() {
        return missing(id, number, title, paper, "No matching `kairos bench causal` result given.");
    }
    let mut notes = Vec::new();
    let svgs = svg_or_note(plot::bars(title, y_label, &bars, fmt), &mut notes).into_iter().collect();
    let rows = bars.iter().map(|(n, v)| vec![n.clone(), fmt(*v)]).collect();
    Figure {
        id: id.into(),
        number: number.into(),
        title: title.into(),
        svgs,
        paper: paper.into(),
        measured: format!("{measured}{}", notes.join(" ")),
        table: table(&["run", y_label], rows),
    }
}

fn causal_on_off(runs: &[&RunResult]) -> Figure {
    let sel: Vec<&&RunResult> = runs.iter().filter(|r| signing(r) == "range").collect();
    let bars: Vec<(String, f64)> = sel
        .iter()
        .map(|r| {
            (format!("{} members, {}", members(r), r.protocol.trim_start_matches("causal-")), r.throughput_ops_per_s)
        })
        .collect();
    let mut ms: Vec<u64> = sel.iter().map(|r| members(r)).collect();
    ms.sort_unstable();
    ms.dedup();
    let ratios: Vec<String> = ms
        .iter()
        .map(|m| {
            let t = |p: &str| sel.iter().find(|r| members(r) == *m && r.protocol == p).map(|r| r.throughput_ops_per_s);
            format!("{m} members {}", x(ratio(t("causal-on"), t("causal-off"))))
        })
        .collect();
    bar_figure(
        Head {
            id: "causal-throughput",
            number: "Causal Fig. 5",
            title: "Throughput with causal consistency on and off",
            paper: "Paper: with w:1 and nearest reads, causal consistency has no visible cost at higher thread \
                    counts; with majority writes the cost is small (the brief gives no number).",
        },
        "throughput (ops/s)",
        bars,
        format!("Kairos: throughput on/off: {}.", ratios.join(", ")),
        |v| format!("{v:.0}"),
    )
}

fn hmacs_per_million(r: &RunResult) -> Option<f64> {
    let h = extra_f64(r, "hmac_computations")?;
    let replies = extra_f64(r, "replies")?;
    (replies > 0.0).then(|| h / replies * 1e6)
}

fn causal_hmac(runs: &[&RunResult]) -> Figure {
    let sel: Vec<&&RunResult> = runs.iter().filter(|r| r.protocol == "causal-on").collect();
    let bars: Vec<(String, f64)> = sel
        .iter()
        .filter_map(|r| Some((format!("{} members, {}", members(r), signing(r)), hmacs_per_million(r)?)))
        .collect();
    let h = |s: &str| sel.iter().find(|r| signing(r) == s).and_then(|r| hmacs_per_million(r));
    bar_figure(
        Head {
            id: "causal-hmac",
            number: "Causal §signing ranges",
            title: "HMACs per 10⁶ replies: range against per-reply signing",
            paper: "Paper: signing could cost ~10% of a simple insert workload; range signing cut the CPU for \
                    signing and validation by several hundred times (no exact ratio in the brief).",
        },
        "HMACs per 10⁶ replies",
        bars,
        format!(
            "Kairos: per-reply signing computes {} the HMACs of range signing.",
            x(ratio(h("per-reply"), h("range")))
        ),
        |v| format!("{v:.0}"),
    )
}

fn causal_reads(runs: &[&RunResult]) -> Figure {
    let mut sel: Vec<&&RunResult> =
        runs.iter().filter(|r| r.protocol == "causal-on" && signing(r) == "range").collect();
    sel.sort_by_key(|r| members(r));
    sel.dedup_by_key(|r| members(r));
    let bars: Vec<(String, f64)> =
        sel.iter().filter_map(|r| Some((format!("{} members", members(r)), extra_f64(r, "reads_per_s")?))).collect();
    let (lo, hi) = (sel.first(), sel.last());
    let measured = match (lo, hi) {
        (Some(l), Some(h)) if members(l) != members(h) => format!(
            "Kairos: reads/s with {} members over {}: {} (linear would be {:.2}×).",
            members(h),
            members(l),
            x(ratio(extra_f64(h, "reads_per_s"), extra_f64(l, "reads_per_s"))),
            members(h) as f64 / members(l) as f64
        ),
        _ => "Kairos: only one replica-set size ran.".into(),
    };
    let read_pref = sel.first().and_then(|r| workload_str(r, "read_pref")).unwrap_or("?").to_lowercase();
    let title = format!("Reads per second by replica-set size (causal on, read preference {read_pref})");
    bar_figure(
        Head {
            id: "causal-reads",
            number: "Causal Fig. 6",
            title: &title,
            paper: "Paper: read throughput grows almost linearly with the number of members when reading from \
                    secondaries under causal consistency (the brief gives no number; linear from 3 to 5 members is \
                    1.67×).",
        },
        "reads (ops/s)",
        bars,
        measured,
        |v| format!("{v:.0}"),
    )
}

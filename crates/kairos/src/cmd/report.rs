//! `kairos report`: runs the benchmarks behind the papers' headline figures (or reads their
//! `--json` results) and writes one self-contained HTML page of SVG figures and tables.
//!
//! The report runs each bench in-process through the same command-line parser and functions
//! `kairos bench …` uses, with `--json` into `OUT/runs/`, then reads those files back: the page
//! is drawn only from result files, whether it ran them or was given them.

use crate::report::{self, Input, Provenance};
use crate::result;
use crate::CliError;
use clap::{Args, Parser};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
#[command(
    long_about = "Draws the papers' figures from Kairos's own measurements: one self-contained HTML page \
(OUT/index.html, inline SVG, no JavaScript) with, per figure, the plot, the table of plotted numbers, the paper's \
figure it reproduces, the paper's number and Kairos's measured ratio, and at the end a provenance block (command \
lines, seeds, commit, machine cores, every run's checker verdict).\n\n\
Figures: Tiga — latency CDF per coordinator region for Tiga and each peer, throughput–latency curves, the skew \
sweep, clock presets, co-located vs separated leaders, headroom shift; SWARM — latency CDFs of gets and updates \
on the simulator and on shared memory, share of one-round-trip operations against client clock offset, memory per \
key; causal sessions — throughput with causal on and off, HMACs per 10^6 replies (range vs per-reply signing), \
reads per second with 3 and 5 members.\n\n\
Without RESULT files the report runs the benches itself (in this process, the same code as `kairos bench`), \
writing their results to OUT/runs/*.json: --quick runs a small plan (minutes), the default a larger one (under an \
hour on 2 cores). With RESULT files (written by `kairos bench … --json`) it runs nothing and plots what they hold; \
a figure without matching results says which bench to run.",
    after_help = "Examples:\n  kairos report --quick\n  kairos report --out results/report\n  \
kairos bench micro --skew-sweep 0.5,0.99 --json micro.json && kairos report --out rep micro.json\n  \
kairos report --out rep results/*.json"
)]
pub struct ReportArgs {
    /// Folder to write index.html (and, when the report runs the benches, runs/*.json) into.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Run the small plan (a few minutes on 2 cores) instead of the full one.
    #[arg(long, conflicts_with = "results")]
    pub quick: bool,
    /// Result files of `kairos bench … --json` to plot instead of running the benches.
    #[arg(value_name = "RESULT.json")]
    pub results: Vec<PathBuf>,
}

/// One bench run of a plan: its result file name and its arguments after `kairos`.
struct PlannedRun {
    name: String,
    args: Vec<String>,
}

fn planned(name: &str, args: &str) -> PlannedRun {
    PlannedRun { name: name.into(), args: args.split_whitespace().map(str::to_string).collect() }
}

/// The runs behind every figure. `quick`: small loads and short runs; otherwise closer to the
/// papers' parameters (still simulated seconds, not the papers' minutes).
fn plan(quick: bool) -> Vec<PlannedRun> {
    let (micro, tiga, swarm, causal) = if quick {
        (
            "--load 2000,4000,8000,16000 --common-load 1000 --skew-sweep 0.5,0.9,0.99 --sweep-load 1000 --cpu-us 50 \
             --duration-s 1.5",
            "--load 1000 --duration-s 1.5",
            "--ops 500 --keys 1000 --warmup 2000 --clients 4",
            "--duration-s 2 --threads 8",
        )
    } else {
        (
            "--load 2000,4000,6000,8000,10000,12000,16000 --common-load 2000 --skew-sweep 0.5,0.7,0.9,0.99 --sweep-load 2000 \
             --cpu-us 50 --duration-s 3",
            "--load 4000 --duration-s 5",
            "--ops 5000 --keys 100000 --warmup 100000 --clients 4",
            "--duration-s 10 --threads 32",
        )
    };
    let mut p =
        vec![planned("tiga-micro", &format!("bench micro --protocols tiga,2pl-paxos,occ-paxos,tapir,calvin+ {micro}"))];
    for clock in ["huygens", "chrony", "ntpd", "bad"] {
        p.push(planned(&format!("tiga-clock-{clock}"), &format!("bench tiga --clock {clock} {tiga}")));
    }
    p.push(planned("tiga-separated", &format!("bench tiga --placement separated {tiga}")));
    for shift in ["-50", "-20", "20", "50"] {
        p.push(planned(&format!("tiga-headroom{shift}"), &format!("bench tiga --headroom-shift-ms {shift} {tiga}")));
    }
    p.push(planned("tiga-zero-headroom", &format!("bench tiga --zero-headroom {tiga}")));
    p.push(planned("swarm-sim", &format!("bench swarm --backend sim --workload ycsb-b {swarm}")));
    p.push(planned("swarm-shm", &format!("bench swarm --backend shm --workload ycsb-b {swarm}")));
    for offset in ["0", "10", "100", "1000"] {
        p.push(planned(
            &format!("swarm-offset-{offset}"),
            &format!(
                "bench swarm --backend sim --workload ycsb-b --protocols swarm-kv --clock-skew-us {offset} {swarm}"
            ),
        ));
    }
    p.push(planned("causal", &format!("bench causal --nodes 3,5 --causal on,off --signing range,per-reply {causal}")));
    p.push(planned("causal-secondary", &format!("bench causal --nodes 3,5 --read-pref secondary {causal}")));
    p
}

fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // The source tree this binary was built from, if it is still there; else the working directory.
    let source = env!("CARGO_MANIFEST_DIR");
    for (dir, what) in [(source, "the source tree kairos was built from"), (".", "the working directory")] {
        if let Some(c) = git(&["-C", dir, "rev-parse", "HEAD"]) {
            let dirty =
                git(&["-C", dir, "status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            return format!("{c}{} ({what}, read at report time)", if dirty { " + uncommitted changes" } else { "" });
        }
    }
    "unknown (neither the source tree nor the working directory is a git checkout)".into()
}

/// Runs one planned bench in this process, its `--json` into `runs_dir`.
fn run_planned(run: &PlannedRun, runs_dir: &Path) -> Result<Input, CliError> {
    let json = runs_dir.join(format!("{}.json", run.name));
    let mut argv = vec!["kairos".to_string()];
    argv.extend(run.args.iter().cloned());
    argv.extend(["--json".to_string(), json.display().to_string()]);
    let command = argv.join(" ");
    eprintln!("report: {command}");
    let cli = crate::cli::Cli::try_parse_from(&argv).map_err(|e| {
        CliError::Runtime(format!("the report's own plan has a bad command `{command}` (a Kairos bug): {e}"))
    })?;
    let started = Instant::now();
    match super::run(cli) {
        Ok(()) => {}
        // An anomaly or unknown verdict is a finding to show, not a reason to stop: the
        // result file records it and the provenance block prints it.
        Err(e @ (CliError::Anomaly(_) | CliError::Unknown(_))) => eprintln!("report: `{command}` reported: {e}"),
        Err(e) => return Err(CliError::Runtime(format!("the report's run `{command}` failed: {e}"))),
    }
    let wall_s = started.elapsed().as_secs_f64();
    Ok(Input {
        path: json.display().to_string(),
        command: Some(command),
        wall_s: Some(wall_s),
        results: result::read_json(&json)?,
    })
}

pub fn run(a: ReportArgs) -> Result<(), CliError> {
    let started = Instant::now();
    std::fs::create_dir_all(&a.out)
        .map_err(|e| CliError::Io(format!("cannot create the output folder {}: {e}", a.out.display())))?;
    let (inputs, mode) = if a.results.is_empty() {
        let runs_dir = a.out.join("runs");
        std::fs::create_dir_all(&runs_dir)
            .map_err(|e| CliError::Io(format!("cannot create {}: {e}", runs_dir.display())))?;
        let plan = plan(a.quick);
        let mut inputs = Vec::new();
        for (i, run) in plan.iter().enumerate() {
            eprintln!("report: run {} of {}", i + 1, plan.len());
            inputs.push(run_planned(run, &runs_dir)?);
        }
        (inputs, format!("ran the {} plan in this process", if a.quick { "quick" } else { "full" }))
    } else {
        let mut inputs = Vec::new();
        for path in &a.results {
            inputs.push(Input {
                path: path.display().to_string(),
                command: None,
                wall_s: None,
                results: result::read_json(path)?,
            });
        }
        (inputs, "read result files given on the command line".to_string())
    };
    let sections = report::sections(&inputs);
    let prov = Provenance {
        mode,
        commit: commit(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kairos_version: env!("CARGO_PKG_VERSION").into(),
        generated_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        wall_s: started.elapsed().as_secs_f64(),
    };
    let html = report::page(&sections, &inputs, &prov);
    let index = a.out.join("index.html");
    std::fs::write(&index, html).map_err(|e| CliError::Io(format!("cannot write {}: {e}", index.display())))?;
    let drawn = sections.iter().flat_map(|s| &s.figures).filter(|f| !f.svgs.is_empty()).count();
    let total = sections.iter().map(|s| s.figures.len()).sum::<usize>();
    println!(
        "wrote {} ({drawn} of {total} figures drawn, {} results, {:.1} s)",
        index.display(),
        inputs.iter().map(|i| i.results.len()).sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    for f in sections.iter().flat_map(|s| &s.figures).filter(|f| f.svgs.is_empty()) {
        println!("  not drawn: {} — {}", f.title, f.measured);
    }
    Ok(())
}

//! `kairos sim register --seeds A..B`: swarm testing. Each seed draws its own fault plan
//! (which kinds of fault are on, when, where); every history is checked, and a failing seed's
//! history is saved with the command that replays it.

use super::bench::run_and_check;
use crate::cli::SimRegisterArgs;
use crate::progress;
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_sim::FaultRates;

/// Parses `N`, `A..B` (B excluded) or `A..=B`.
pub fn parse_seeds(spec: &str) -> Result<Vec<u64>, CliError> {
    let bad = || CliError::Usage(format!("--seeds takes N, A..B or A..=B (e.g. 1..51), not `{spec}`"));
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    let seeds: Vec<u64> = if let Some((a, b)) = spec.split_once("..=") {
        (num(a)?..=num(b)?).collect()
    } else if let Some((a, b)) = spec.split_once("..") {
        (num(a)?..num(b)?).collect()
    } else {
        vec![num(spec)?]
    };
    if seeds.is_empty() || seeds.len() > 100_000 {
        return Err(CliError::Usage(format!("--seeds `{spec}` names {} seeds; give 1 to 100,000", seeds.len())));
    }
    Ok(seeds)
}

pub fn register(args: SimRegisterArgs) -> Result<(), CliError> {
    let seeds = parse_seeds(&args.seeds)?;
    let base = args.run.to_run()?;
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["seed", "faults", "ok", "unknown", "linearizable", "trace"]);
    let mut failing = Vec::new();
    let mut unverified = Vec::new();
    let bar = progress::bar(seeds.len() as u64, "seeds");
    for &seed in &seeds {
        let mut run = base.clone();
        run.seed = seed;
        run.faults = Some(FaultRates::default());
        bar.set_message(format!("seed {seed}"));
        let (outcome, report) = run_and_check(&run, "run")?;
        let summary = crate::stats::summarize(&outcome.history, |_| None);
        if args.show_faults {
            for f in &outcome.fault_plan {
                progress::say(&bar, format!("seed {seed}: {} {}", f.at, f.fault));
            }
        }
        table.add_row([
            seed.to_string(),
            outcome.fault_plan.len().to_string(),
            summary.ok.to_string(),
            summary.unknown.to_string(),
            super::bench::verdict_cell(report.verdict),
            format!("{:016x}", outcome.trace_hash),
        ]);
        if report.verdict == kairos_check::Verdict::Invalid {
            let path = args.failing_dir.join(format!("seed-{seed}.jsonl"));
            crate::result::write_history(&path, &outcome.history)?;
            progress::say(&bar, format!("seed {seed}: NOT linearizable; history in {}\n{report}", path.display()));
            failing.push(seed);
        } else if report.verdict == kairos_check::Verdict::Unknown {
            progress::say(&bar, format!("seed {seed}: UNVERIFIED\n{report}"));
            unverified.push(seed);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!("{table}");
    if failing.is_empty() && unverified.is_empty() {
        println!("{} seeds, every history linearizable.", seeds.len());
        Ok(())
    } else if failing.is_empty() {
        Err(CliError::Unknown(format!(
            "{} of {} seeds could not be decided by any checker: {unverified:?}",
            unverified.len(),
            seeds.len()
        )))
    } else {
        Err(CliError::Anomaly(format!(
            "{} of {} seeds violated linearizability: {failing:?}. Replay one with `kairos bench register --seed N` plus the same flags, and keep it as a regression test.",
            failing.len(),
            seeds.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_seeds;

    #[test]
    fn seed_ranges_parse_and_bad_ones_are_errors() {
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
        assert_eq!(parse_seeds("1..4").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("1..=3").unwrap(), vec![1, 2, 3]);
        for bad in ["", "a..b", "5..5", "1..x", "-1"] {
            assert!(parse_seeds(bad).is_err(), "{bad}");
        }
    }
}

//! `kairos demo`: the main job, in well under two minutes on two cores. Today it runs the
//! replicated register in the simulated four-region deployment and checks its history; each
//! protocol that lands adds its section.

use super::bench::{print_register_table, register_result, run_and_check, verdict};
use crate::cli::DemoArgs;
use crate::deploy::RegisterRun;
use crate::result;
use crate::CliError;

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    println!("Kairos demo — seed {} (every random choice derives from it; rerun with --seed N)\n", args.seed);
    println!("Replicated register (multi-writer ABD): 3 replicas in sc / fi / br, 2 clients in each of");
    println!("sc / fi / br / hk, GCP latency matrix, chrony-grade clocks, 20 virtual seconds.\n");
    let run = RegisterRun { seed: args.seed, ..RegisterRun::default() };
    let (outcome, report) = run_and_check(&run, "register")?;
    let result = register_result(&run, &outcome, &report);
    print_register_table(&[&result]);
    println!("{report}");
    if let Some(path) = &args.json {
        result::write_json(path, &[result])?;
        println!("wrote {}", path.display());
    }
    verdict(&report, args.seed)
}

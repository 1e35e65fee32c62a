//! `kairos check HISTORY --model M`: exit 0 valid, 1 anomaly, 2 unreadable.

use crate::cli::{CheckArgs, ModelArg};
use crate::CliError;
use kairos_check::Model;

pub fn model(m: ModelArg) -> Model {
    match m {
        ModelArg::StrictSerializable => Model::StrictSerializable,
        ModelArg::Serializable => Model::Serializable,
        ModelArg::Linearizable => Model::Linearizable,
        ModelArg::Causal => Model::Causal,
    }
}

pub fn run(args: CheckArgs) -> Result<(), CliError> {
    let history = kairos_check::load_history(&args.history)
        .map_err(|e| CliError::Io(format!("cannot check {}: {e}", args.history.display())))?;
    let report = kairos_check::check(&history, model(args.model))
        .map_err(|e| CliError::Io(format!("cannot check {}: {e}", args.history.display())))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        println!("{report}");
    }
    if report.valid {
        Ok(())
    } else {
        Err(CliError::Anomaly(format!("{} is not {}", args.history.display(), model(args.model))))
    }
}

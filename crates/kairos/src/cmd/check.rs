//! `kairos check HISTORY --model M`: exit 0 valid, 1 anomaly, 2 unreadable, 3 unknown.

use crate::cli::{CheckArgs, ModelArg};
use crate::CliError;
use kairos_check::{CheckOptions, Model, Verdict};

pub fn model(m: ModelArg) -> Model {
    match m {
        ModelArg::StrictSerializable => Model::StrictSerializable,
        ModelArg::Serializable => Model::Serializable,
        ModelArg::Linearizable => Model::Linearizable,
        ModelArg::Causal => Model::Causal,
    }
}

pub fn run(args: CheckArgs) -> Result<(), CliError> {
    let path = args.history.display();
    let history =
        kairos_check::load_history(&args.history).map_err(|e| CliError::Io(format!("cannot check {path}: {e}")))?;
    let opts = CheckOptions { search_budget: args.search_budget };
    let report = kairos_check::check_history(&history, model(args.model), &opts)
        .map_err(|e| CliError::Io(format!("cannot check {path}: {e}")))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| CliError::Runtime(e.to_string()))?);
    } else {
        println!("{report}");
    }
    let m = model(args.model);
    match report.verdict {
        Verdict::Valid => Ok(()),
        Verdict::Invalid => Err(CliError::Anomaly(format!("{path} is not {m}"))),
        Verdict::Unknown => Err(CliError::Unknown(format!("{path}: no checker could decide whether it is {m}"))),
    }
}

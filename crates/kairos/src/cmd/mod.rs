//! One module per subcommand.

mod bench;
mod campaign;
mod causal;
mod check;
mod demo;
mod micro;
mod mongo_listen;
mod net;
pub mod redis;
pub mod report;
mod serve;
pub mod swarm;
mod swarm_memory;
mod swarm_real;
mod tiga;

use crate::cli::{BenchCommand, CampaignProtocol, Cli, ClockArg, Command, RegisterArgs, SimCommand};
use crate::CliError;
use kairos_clock::ClockPreset;
use kairos_harness::register::RegisterRun;
use std::time::Duration;

pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Demo(a) => demo::run(a),
        Command::Bench(BenchCommand::Tiga(a)) => tiga::bench(a),
        Command::Bench(BenchCommand::Micro(a)) => micro::bench(a),
        Command::Bench(BenchCommand::Tpcc(a)) => micro::bench_tpcc(a),
        Command::Bench(BenchCommand::Causal(a)) => causal::bench(a),
        Command::Bench(BenchCommand::Register(a)) => bench::register(a),
        Command::Bench(BenchCommand::Des(a)) => bench::des(a),
        Command::Bench(BenchCommand::Net(a)) => net::bench(a),
        Command::Bench(BenchCommand::Swarm(a)) => swarm::bench(a),
        Command::Sim(SimCommand::Register(a)) => campaign::run(CampaignProtocol::Register, a),
        Command::Sim(SimCommand::Tiga(a)) => campaign::run(CampaignProtocol::Tiga, a),
        Command::Sim(SimCommand::TwoPlPaxos(a)) => campaign::run(CampaignProtocol::TwoPlPaxos, a),
        Command::Sim(SimCommand::OccPaxos(a)) => campaign::run(CampaignProtocol::OccPaxos, a),
        Command::Sim(SimCommand::NccPaxos(a)) => campaign::run(CampaignProtocol::NccPaxos, a),
        Command::Sim(SimCommand::Ncc(a)) => campaign::run(CampaignProtocol::Ncc, a),
        Command::Sim(SimCommand::Tapir(a)) => campaign::run(CampaignProtocol::Tapir, a),
        Command::Sim(SimCommand::Janus(a)) => campaign::run(CampaignProtocol::Janus, a),
        Command::Sim(SimCommand::CalvinPlus(a)) => campaign::run(CampaignProtocol::CalvinPlus, a),
        Command::Sim(SimCommand::Detock(a)) => campaign::run(CampaignProtocol::Detock, a),
        Command::Sim(SimCommand::Causal(a)) => campaign::run(CampaignProtocol::Causal, a),
        Command::Sim(SimCommand::SwarmKv(a)) => campaign::run(CampaignProtocol::SwarmKv, a),
        Command::Sim(SimCommand::DmAbd(a)) => campaign::run(CampaignProtocol::DmAbd, a),
        Command::Sim(SimCommand::Fusee(a)) => campaign::run(CampaignProtocol::Fusee, a),
        Command::Check(a) => check::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Cluster(redis::cluster::ClusterCommand::Up(a)) => redis::cluster::up(a),
        Command::Cluster(redis::cluster::ClusterCommand::Down(a)) => redis::cluster::down(a),
        Command::Cluster(redis::cluster::ClusterCommand::Bench(a)) => redis::bench::bench(a),
        Command::Report(a) => report::run(a),
    }
}

impl From<ClockArg> for ClockPreset {
    fn from(c: ClockArg) -> Self {
        match c {
            ClockArg::Perfect => ClockPreset::Perfect,
            ClockArg::Huygens => ClockPreset::Huygens,
            ClockArg::Chrony => ClockPreset::Chrony,
            ClockArg::Ntpd => ClockPreset::Ntpd,
            ClockArg::Bad => ClockPreset::Bad,
        }
    }
}

impl RegisterArgs {
    /// Validates the flags and turns them into a run description.
    pub fn to_run(&self) -> Result<RegisterRun, CliError> {
        if !(self.duration_s > 0.0 && self.duration_s <= 86_400.0) {
            return Err(CliError::Usage(format!(
                "--duration-s must be between 0 and 86400 virtual seconds, not {}",
                self.duration_s
            )));
        }
        if !(0.0..=1.0).contains(&self.write_ratio) {
            return Err(CliError::Usage(format!("--write-ratio is a share between 0 and 1, not {}", self.write_ratio)));
        }
        if !(0.0..1.0).contains(&self.loss) {
            return Err(CliError::Usage(format!("--loss is a probability in [0, 1), not {}", self.loss)));
        }
        if self.clients_per_region == 0 || self.clients_per_region > 1_000 {
            return Err(CliError::Usage(format!(
                "--clients-per-region must be 1..=1000, not {}",
                self.clients_per_region
            )));
        }
        if self.keys == 0 {
            return Err(CliError::Usage("--keys must be at least 1".into()));
        }
        Ok(RegisterRun {
            seed: self.seed,
            clock: self.clock.into(),
            clients_per_region: self.clients_per_region,
            keys: self.keys,
            write_ratio: self.write_ratio,
            duration: Duration::from_secs_f64(self.duration_s),
            loss: self.loss,
            ..RegisterRun::default()
        })
    }
}

//! `kairos bench net`: what one message costs the TCP host, and the per-message cost the
//! throughput benches (`bench micro`, `bench tiga --measured-cpu`) add to handler CPU.

use crate::cli::NetBenchArgs;
use crate::progress;
use crate::CliError;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use kairos_harness::wire_calibration::{calibrate, Calibration, CalibrationConfig};
use kairos_sim::WireCost;
use std::time::Duration;

/// The window of the calibration the throughput benches charge: a host under load has several
/// messages queued per connection and writes and reads them together.
pub const LOADED_WINDOW: usize = 16;

pub fn bench(args: NetBenchArgs) -> Result<(), CliError> {
    if args.sizes.is_empty() || args.sizes.iter().any(|s| *s > 1 << 20) {
        return Err(CliError::Usage(
            "--sizes takes payload sizes in bytes, each at most 1 MiB, comma separated".into(),
        ));
    }
    if args.windows.is_empty() || args.windows.iter().any(|w| !(1..=1024).contains(w)) {
        return Err(CliError::Usage(
            "--windows takes messages in flight, each between 1 and 1,024, comma separated".into(),
        ));
    }
    if !(1..=10_000_000).contains(&args.messages) {
        return Err(CliError::Usage(format!("--messages must be between 1 and 10,000,000, not {}", args.messages)));
    }
    let mut json = Vec::new();
    for &window in &args.windows {
        let config = CalibrationConfig {
            payload_bytes: args.sizes.clone(),
            window,
            messages: args.messages,
            warmup: (args.messages / 10).max(100),
            ..CalibrationConfig::default()
        };
        let calibration = run(&config)?;
        println!(
            "Per-message CPU of the TCP host (kairos-net) over loopback, {window} message(s) in flight, {} messages per size:",
            calibration.messages
        );
        println!("{}", table(&calibration));
        let wire = calibration.wire_cost();
        let used = if window == LOADED_WINDOW { " (what the throughput benches charge)" } else { "" };
        println!("Fitted per-message cost{used}: {}\n", describe(&wire));
        json.push(serde_json::json!({ "calibration": calibration, "wire_cost": wire }));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&json).map_err(|e| CliError::Runtime(e.to_string()))? + "\n")
            .map_err(|e| CliError::Io(format!("cannot write {}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs a calibration with a progress bar.
fn run(config: &CalibrationConfig) -> Result<Calibration, CliError> {
    let bar = progress::bar(config.payload_bytes.len() as u64, "calibrating the TCP host");
    let calibration = calibrate(config, |done, _| bar.set_position(done as u64)).map_err(|e| {
        CliError::Runtime(format!("{e}; pass --message-cost-us to charge a fixed cost per message instead"))
    })?;
    bar.finish_and_clear();
    Ok(calibration)
}

fn table(c: &Calibration) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    table.set_header(["payload B", "encoded B", "sender µs/msg", "receiver µs/msg", "messages/s"]);
    for p in &c.points {
        table.add_row([
            p.payload_bytes.to_string(),
            p.encoded_bytes.to_string(),
            format!("{:.2}", p.sender_ns_per_message / 1e3),
            format!("{:.2}", p.receiver_ns_per_message / 1e3),
            format!("{:.0}", p.messages_per_s),
        ]);
    }
    table
}

/// One line: the model's two sides.
pub fn describe(w: &WireCost) -> String {
    format!(
        "send {:.2} µs + {:.2} ns/B, receive {:.2} µs + {:.2} ns/B",
        w.send_ns_base / 1e3,
        w.send_ns_per_byte,
        w.receive_ns_base / 1e3,
        w.receive_ns_per_byte
    )
}

/// The measured-CPU model in one line, for a bench's header.
pub fn cpu_header(w: &WireCost) -> String {
    format!(
        "measured handler time (less {:.2} µs of clock reading per handler) + per message {}",
        clock_overhead_ns() as f64 / 1e3,
        describe(w)
    )
}

/// The per-message cost of a throughput bench: `--message-cost-us` when given (a flat cost per
/// message, half at each end; 0 charges handler CPU only), else a short calibration of this
/// host's TCP stack, run now, with [`LOADED_WINDOW`] messages in flight. Returns the cost and,
/// for the header and `--json`, what it came from.
pub fn wire_cost(message_cost_us: Option<f64>) -> Result<(WireCost, serde_json::Value), CliError> {
    match message_cost_us {
        Some(us) => {
            let wire = WireCost::flat(Duration::from_secs_f64(us / 1e6));
            Ok((
                wire,
                serde_json::json!({ "source": "--message-cost-us", "wire_cost": wire, "clock_overhead_ns": clock_overhead_ns() }),
            ))
        }
        None => {
            let config = CalibrationConfig {
                payload_bytes: vec![16, 512, 4096],
                window: LOADED_WINDOW,
                messages: 4_000,
                warmup: 300,
                ..CalibrationConfig::default()
            };
            let calibration = run(&config)?;
            let wire = calibration.wire_cost();
            Ok((
                wire,
                serde_json::json!({ "source": "calibrated", "calibration": calibration, "wire_cost": wire, "clock_overhead_ns": clock_overhead_ns() }),
            ))
        }
    }
}

/// The thread-CPU clock's reading cost the measured-CPU model subtracts from every handler.
fn clock_overhead_ns() -> u64 {
    kairos_sim::cpu_clock::overhead().as_nanos() as u64
}

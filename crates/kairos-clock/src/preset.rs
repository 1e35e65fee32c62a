//! Clock presets: the synchronization quality of the Tiga paper's deployments (Table 3).
//!
//! Each preset is named after a clock-synchronization setup and carries the synchronization
//! error `E` the Tiga paper measured for it. [`ClockPreset::sample`] draws one node's
//! [`SimClock`] so that, over a run, the typical (mean) absolute error of a node's reading
//! against true time is about `E`:
//!
//! | preset    | `E` (paper)  | offset: Normal(0, σ), σ = E·√(π/2) | drift: uniform ±D, D = E / 2400 s | jitter: uniform ±E/10 | steps |
//! |-----------|-------------:|-----------------:|-------------:|-----------:|-------|
//! | `perfect` | 0            | 0                | 0            | 0          | none  |
//! | `huygens` | 0.012 ms     | 15.04 µs         | ±5 ppb       | ±1.2 µs    | none  |
//! | `chrony`  | 4.54 ms      | 5.690 ms         | ±1.891 ppm   | ±454 µs    | none  |
//! | `ntpd`    | 16.45 ms     | 20.617 ms        | ±6.854 ppm   | ±1.645 ms  | none  |
//! | `bad`     | 62.55 ms     | 78.394 ms        | ±26.062 ppm  | ±6.255 ms  | every 30 s on average (exponential gaps) during the first hour; each step jumps the clock to a fresh offset drawn from the same Normal |
//!
//! Why these choices:
//!
//! * **Offset** is the bulk of the error: a node's clock is off by whatever its last sync left.
//!   For a Normal(0, σ), `E|X| = σ·√(2/π)`, so σ = E·√(π/2) makes the mean absolute offset
//!   exactly `E`.
//! * **Drift** is the residual frequency error of a disciplined clock between re-syncs. The
//!   model never re-syncs, so D is chosen so that drift adds at most `E/4` after 600 s of true
//!   time (`D` ppb = `E` ns / 2400). Runs much longer than 10 minutes see the error slowly grow.
//! * **Jitter** (±E/10 per reading, mean 5 % of `E`) is read/sync noise.
//! * **Steps** (`bad` only) model the deliberately unstable NTP source: now and then the daemon
//!   steps the clock — forward or backward — to a new wrong offset. Because each step lands on a
//!   fresh draw of the offset distribution (delta = new offset − current nominal error), the
//!   error stays distributed like the other presets (mean |error| ≈ E) instead of random-walking.
//!   Steps are scheduled for the first hour of true time only.
//!
//! With these, the measured mean |error| over nodes and times in the first 10 minutes is within
//! a few percent of `E` (the test `mean_abs_error_matches_paper_figures` checks 0.9–1.1×).

use crate::sim_clock::SimClock;
use kairos_core::{Rng, SimTime};
use rand::Rng as _;
use rand_distr::{Exp1, StandardNormal};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use thiserror::Error;

/// A named clock-synchronization quality; see the [module docs](self) for the model of each.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClockPreset {
    /// Every node reads true time exactly.
    Perfect,
    /// Huygens (NSDI 2018): 0.012 ms.
    Huygens,
    /// chrony: 4.54 ms.
    Chrony,
    /// ntpd: 16.45 ms.
    Ntpd,
    /// NTP against a deliberately unstable source: 62.55 ms, with clock steps.
    Bad,
}

/// `"perfect|huygens|chrony|ntpd|bad"` was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown clock preset `{0}`; expected one of: perfect, huygens, chrony, ntpd, bad")]
pub struct UnknownClockPreset(pub String);

/// The numbers behind a preset (see the table in the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PresetParams {
    /// The paper's synchronization error `E`, in ns.
    pub sync_error_ns: u64,
    /// Standard deviation of the Normal the offset is drawn from, in ns (E·√(π/2)).
    pub offset_sigma_ns: u64,
    /// Drift is drawn uniformly from `[-drift_max_ppb, +drift_max_ppb]`.
    pub drift_max_ppb: i64,
    /// Jitter bound of each reading, in ns (E/10).
    pub jitter_ns: u64,
    /// Mean gap between steps (exponentially distributed), if the preset steps.
    pub step_mean_interval: Option<Duration>,
    /// Steps are scheduled in `(0, step_horizon]` of true time.
    pub step_horizon: Duration,
}

/// Drift adds at most E/4 after this much true time.
const DRIFT_HORIZON_SECS: u64 = 600;
const BAD_STEP_MEAN_INTERVAL: Duration = Duration::from_secs(30);
const STEP_HORIZON: Duration = Duration::from_secs(3600);

impl ClockPreset {
    /// Every preset, from best to worst.
    pub const ALL: [ClockPreset; 5] =
        [ClockPreset::Perfect, ClockPreset::Huygens, ClockPreset::Chrony, ClockPreset::Ntpd, ClockPreset::Bad];

    /// The lowercase name used on the command line and in result files.
    pub const fn name(self) -> &'static str {
        match self {
            ClockPreset::Perfect => "perfect",
            ClockPreset::Huygens => "huygens",
            ClockPreset::Chrony => "chrony",
            ClockPreset::Ntpd => "ntpd",
            ClockPreset::Bad => "bad",
        }
    }

    /// The synchronization error the Tiga paper measured (Table 3).
    pub const fn sync_error(self) -> Duration {
        Duration::from_nanos(match self {
            ClockPreset::Perfect => 0,
            ClockPreset::Huygens => 12_000,
            ClockPreset::Chrony => 4_540_000,
            ClockPreset::Ntpd => 16_450_000,
            ClockPreset::Bad => 62_550_000,
        })
    }

    /// The model parameters derived from [`Self::sync_error`].
    pub fn params(self) -> PresetParams {
        let e = self.sync_error().as_nanos() as u64;
        PresetParams {
            sync_error_ns: e,
            offset_sigma_ns: (e as f64 * (std::f64::consts::PI / 2.0).sqrt()).round() as u64,
            // E/4 over DRIFT_HORIZON_SECS: E ns / (4 · 600 s) = E/2400 ns per s = E/2400 ppb.
            drift_max_ppb: (e / (4 * DRIFT_HORIZON_SECS)) as i64,
            jitter_ns: e / 10,
            step_mean_interval: (self == ClockPreset::Bad).then_some(BAD_STEP_MEAN_INTERVAL),
            step_horizon: STEP_HORIZON,
        }
    }

    /// Draws one node's clock from `rng`. `Perfect` draws nothing. Deterministic: the same
    /// generator state gives the same clock.
    pub fn sample(&self, rng: &mut Rng) -> SimClock {
        let p = self.params();
        if p.sync_error_ns == 0 {
            return SimClock::perfect();
        }
        let sigma = p.offset_sigma_ns as f64;
        let draw_offset = |rng: &mut Rng| -> i64 {
            let z: f64 = rng.sample(StandardNormal);
            (z * sigma).round() as i64
        };
        let offset_ns = draw_offset(rng);
        let drift_ppb = rng.random_range(-p.drift_max_ppb..=p.drift_max_ppb);
        let mut clock = SimClock::new(offset_ns, drift_ppb, p.jitter_ns);
        if let Some(mean) = p.step_mean_interval {
            let mean_ns = mean.as_nanos() as f64;
            let horizon_ns = p.step_horizon.as_nanos() as u64;
            let mut t: u64 = 0;
            loop {
                let gap: f64 = rng.sample(Exp1);
                t = t.saturating_add(((gap * mean_ns) as u64).max(1));
                if t > horizon_ns {
                    break;
                }
                let at = SimTime(t);
                let target = i128::from(draw_offset(rng));
                let delta = target - clock.nominal_error_ns(at);
                clock.add_step(at, delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64);
            }
        }
        clock
    }
}

impl fmt::Display for ClockPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ClockPreset {
    type Err = UnknownClockPreset;
    /// Accepts the lowercase names (any ASCII case, surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        ClockPreset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| UnknownClockPreset(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim_clock::SIM_EPOCH_NS;
    use rand::SeedableRng;

    /// Mean |reading − true time| over `nodes` sampled clocks, each read at several times in
    /// the first 10 minutes.
    fn mean_abs_error_ns(preset: ClockPreset, seed: u64, nodes: usize) -> f64 {
        let mut model_rng = Rng::seed_from_u64(seed);
        let mut read_rng = Rng::seed_from_u64(seed ^ 0x5eed);
        let times = [0u64, 1, 45, 150, 300, 450, 599].map(SimTime::from_secs);
        let mut sum = 0f64;
        let mut n = 0usize;
        for _ in 0..nodes {
            let mut c = preset.sample(&mut model_rng);
            for t in times {
                let reading = c.read(t, &mut read_rng).as_nanos() as i128;
                sum += (reading - i128::from(SIM_EPOCH_NS + t.as_nanos())).unsigned_abs() as f64;
                n += 1;
            }
        }
        sum / n as f64
    }

    #[test]
    fn mean_abs_error_matches_paper_figures() {
        for preset in ClockPreset::ALL {
            let e = preset.sync_error().as_nanos() as f64;
            let measured = mean_abs_error_ns(preset, 42, 3_000);
            if preset == ClockPreset::Perfect {
                assert_eq!(measured, 0.0);
                continue;
            }
            let ratio = measured / e;
            assert!(
                (0.9..=1.1).contains(&ratio),
                "{preset}: mean |error| {:.3} ms vs nominal {:.3} ms (ratio {ratio:.3})",
                measured / 1e6,
                e / 1e6
            );
        }
    }

    #[test]
    fn presets_are_ordered_by_error() {
        let errors: Vec<f64> = ClockPreset::ALL.iter().map(|p| mean_abs_error_ns(*p, 7, 500)).collect();
        assert!(errors.windows(2).all(|w| w[0] < w[1]), "{errors:?}");
    }

    #[test]
    fn same_seed_same_clocks_different_seed_different_clocks() {
        for preset in ClockPreset::ALL {
            let draw = |seed| {
                let mut r = Rng::seed_from_u64(seed);
                (0..50).map(|_| preset.sample(&mut r)).collect::<Vec<_>>()
            };
            assert_eq!(draw(9), draw(9), "{preset}");
            if preset != ClockPreset::Perfect {
                assert_ne!(draw(9), draw(10), "{preset}");
            }
        }
    }

    #[test]
    fn perfect_samples_a_perfect_clock_and_draws_nothing() {
        let mut r = Rng::seed_from_u64(1);
        let before = r.clone();
        assert_eq!(ClockPreset::Perfect.sample(&mut r), SimClock::perfect());
        assert_eq!(r, before);
    }

    #[test]
    fn only_bad_steps_and_it_steps_both_ways_within_the_horizon() {
        let mut r = Rng::seed_from_u64(3);
        for preset in [ClockPreset::Huygens, ClockPreset::Chrony, ClockPreset::Ntpd] {
            for _ in 0..20 {
                let c = preset.sample(&mut r);
                assert_eq!(c.pending_steps().len(), 0, "{preset}");
                assert!(c.drift_ppb().abs() <= preset.params().drift_max_ppb);
                assert_eq!(c.jitter_ns(), preset.params().jitter_ns);
            }
        }
        let c = ClockPreset::Bad.sample(&mut r);
        let steps: Vec<_> = c.pending_steps().copied().collect();
        // ~120 expected in an hour at one per 30 s.
        assert!((60..=200).contains(&steps.len()), "{} steps", steps.len());
        assert!(steps.iter().any(|s| s.delta_ns < 0) && steps.iter().any(|s| s.delta_ns > 0));
        assert!(steps.windows(2).all(|w| w[0].at < w[1].at));
        assert!(steps.last().unwrap().at <= SimTime::from_secs(3600));
    }

    #[test]
    fn params_match_the_documented_table() {
        let p = ClockPreset::Huygens.params();
        assert_eq!((p.sync_error_ns, p.offset_sigma_ns, p.drift_max_ppb, p.jitter_ns), (12_000, 15_040, 5, 1_200));
        let p = ClockPreset::Chrony.params();
        assert_eq!((p.offset_sigma_ns, p.drift_max_ppb, p.jitter_ns), (5_690_046, 1_891, 454_000));
        let p = ClockPreset::Ntpd.params();
        assert_eq!((p.offset_sigma_ns, p.drift_max_ppb, p.jitter_ns), (20_617_018, 6_854, 1_645_000));
        let p = ClockPreset::Bad.params();
        assert_eq!((p.offset_sigma_ns, p.drift_max_ppb, p.jitter_ns), (78_394_799, 26_062, 6_255_000));
        assert_eq!(p.step_mean_interval, Some(Duration::from_secs(30)));
        assert_eq!(ClockPreset::Ntpd.params().step_mean_interval, None);
    }

    #[test]
    fn names_parse_display_and_serde() {
        assert_eq!(ClockPreset::Huygens.sync_error(), Duration::from_micros(12));
        assert_eq!(ClockPreset::Bad.sync_error(), Duration::from_micros(62_550));
        for p in ClockPreset::ALL {
            assert_eq!(p.to_string().parse::<ClockPreset>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
            assert_eq!(serde_json::from_str::<ClockPreset>(&format!("\"{p}\"")).unwrap(), p);
        }
        assert_eq!(" Chrony ".parse::<ClockPreset>(), Ok(ClockPreset::Chrony));
        let err = "ptp".parse::<ClockPreset>().unwrap_err().to_string();
        assert!(err.contains("`ptp`"), "{err}");
        for name in ["perfect", "huygens", "chrony", "ntpd", "bad"] {
            assert!(err.contains(name), "{err}");
        }
    }
}

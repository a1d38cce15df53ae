//! The chaos run: all three controllers, installed by their charts with two
//! replicas each on the real nodes, under random faults while the
//! invariants of [`invariants`] are checked, during the run and after it.
//!
//! A run is a list of seeds played in order on one workload ([`workload`]):
//! for each seed, [`actions`] are drawn from the seed (which, on what, for
//! how long) for the given minutes, at a bounded rate; then every fault is
//! healed and everything must converge. At the end the writer stops and the
//! controllers must write nothing for a minute. The seed fixes the choices,
//! not the timing: the controllers' and the nodes' pace still varies, so a
//! failing seed reproduces the same storm, not the same interleaving.

pub mod actions;
pub mod invariants;
pub mod observe;
pub mod rng;
pub mod workload;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use invariants::{Invariant, Tally};

use crate::chaos::actions::{Chaos, Kind};
use crate::chaos::observe::Observer;
use crate::chaos::workload::Workload;

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub seeds: Vec<u64>,
    /// Chaos per seed.
    pub duration: Duration,
    /// The mean pause between two actions.
    pub mean_interval: Duration,
}

impl Settings {
    /// `CAIRN_CHAOS_SEEDS` (comma-separated) and `CAIRN_CHAOS_MINUTES`
    /// (per seed), or the given defaults.
    pub fn from_env(seeds: &[u64], minutes: f64) -> Result<Self> {
        let seeds = match std::env::var("CAIRN_CHAOS_SEEDS") {
            Ok(list) => list
                .split(',')
                .map(|s| s.trim().parse::<u64>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| format!("CAIRN_CHAOS_SEEDS={list}: {e}"))?,
            Err(_) => seeds.to_vec(),
        };
        let minutes = match std::env::var("CAIRN_CHAOS_MINUTES") {
            Ok(m) => m
                .parse::<f64>()
                .map_err(|e| format!("CAIRN_CHAOS_MINUTES={m}: {e}"))?,
            Err(_) => minutes,
        };
        Ok(Self {
            seeds,
            duration: Duration::from_secs_f64(minutes * 60.0),
            mean_interval: Duration::from_secs(3),
        })
    }
}

/// How often the pods' logs are copied into the cluster's log folder.
const KEEP_LOGS_EVERY: Duration = Duration::from_secs(10);

/// How long everything has to converge once the faults are healed.
pub const CONVERGENCE_BOUND: Duration = Duration::from_secs(300);

/// Runs the seeds; returns the tally of every invariant. The caller fails
/// the test on any violation.
pub async fn run(settings: &Settings) -> Result<Tally> {
    let started = Instant::now();
    let workload = Workload::set_up().await?;
    eprintln!(
        "chaos: workload ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        workload.describe()
    );
    let mut observer = Observer::new(&workload).await?;
    let mut tally = Tally::default();
    let mut actions_taken: BTreeMap<Kind, (u64, u64)> = BTreeMap::new();
    let mut slowest = (Duration::ZERO, String::new());
    for &seed in &settings.seeds {
        eprintln!(
            "chaos: seed {seed}, {:.1} min",
            settings.duration.as_secs_f64() / 60.0
        );
        let mut chaos = Chaos::new(&workload, seed);
        let until = Instant::now() + settings.duration;
        let mut logs_kept = Instant::now();
        while Instant::now() < until {
            chaos.step().await;
            observer.sample(&workload, &mut tally).await;
            if logs_kept.elapsed() >= KEEP_LOGS_EVERY {
                // The controllers' and instances' logs, before a deleted
                // pod or a stopped node takes them away.
                workload.real.keep_pod_logs();
                logs_kept = Instant::now();
            }
            let pause = chaos.pause(settings.mean_interval);
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
        }
        chaos.heal().await?;
        for (kind, (done, failed)) in chaos.counts() {
            let entry = actions_taken.entry(kind).or_default();
            entry.0 += done;
            entry.1 += failed;
        }
        eprintln!("chaos: seed {seed} actions:\n{}", chaos.log());
        let converged = observer.converge(&workload, &mut tally).await?;
        if converged.0 > slowest.0 {
            slowest = converged;
        }
        observer.sample(&workload, &mut tally).await;
        observer.audit(&workload, &mut tally)?;
    }
    observer.finish(&workload, &mut tally).await?;
    eprintln!(
        "chaos: seeds {:?}, {:.1} min each, {:.0} s in all",
        settings.seeds,
        settings.duration.as_secs_f64() / 60.0,
        started.elapsed().as_secs_f64()
    );
    eprintln!("{}", actions::table(&actions_taken));
    eprintln!(
        "slowest convergence after the chaos: {:.1} s ({})",
        slowest.0.as_secs_f64(),
        slowest.1
    );
    eprintln!("{}", tally.table());
    workload.uninstall().await?;
    Ok(tally)
}

/// Fails with the named invariants that were violated.
pub fn assert_held(tally: &Tally) -> Result {
    let failed = tally.failed();
    if failed.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = failed.iter().map(|i| Invariant::name(*i)).collect();
    Err(format!(
        "invariants violated: {} (evidence in the table above)",
        names.join(", ")
    )
    .into())
}

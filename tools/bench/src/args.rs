//! Argument groups that several scenarios share, declared once and flattened into each
//! scenario's arguments. A group takes its defaults from the scenario it is flattened into
//! ([`Defaults`]), so every scenario keeps its own `--help` defaults while the flags mean the
//! same everywhere. (The defaults are texts, not `default_value_t`: clap keeps that one's text
//! in a static shared by every instance of a generic group.)

use std::marker::PhantomData;

/// The defaults of the groups a scenario flattens, as `--help` shows them; a scenario
/// overrides the ones that differ.
pub(crate) trait Defaults {
    const ROUNDS: &'static str = "3";
    const RUNS: &'static str = "10000";
    const WORKERS: &'static str = "2";
    const CONCURRENCY: &'static str = "64";
    const CLIENTS: &'static str = "64";
    const TASKS: &'static str = "100000";
}

/// Measurement rounds: each round measures every variant of the scenario once (A/B scenarios
/// alternate them); the report gives each round and the medians over them.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Rounds<D: Defaults> {
    /// Rounds; each measures every variant of the scenario once, and the report gives the
    /// medians over them.
    #[arg(long, default_value = D::ROUNDS)]
    pub(crate) rounds: usize,
    #[arg(skip)]
    defaults: PhantomData<D>,
}

/// The in-process worker replicas that execute a scenario's runs.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Pool<D: Defaults> {
    /// In-process worker replicas.
    #[arg(long, default_value = D::WORKERS)]
    pub(crate) workers: usize,
    /// Concurrency of each worker replica.
    #[arg(long, default_value = D::CONCURRENCY)]
    pub(crate) concurrency: usize,
    #[arg(skip)]
    defaults: PhantomData<D>,
}

/// Concurrent request loops, each waiting for its reply before sending its next request.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Clients<D: Defaults> {
    /// Concurrent clients (each waits for its reply before sending the next request).
    #[arg(long, default_value = D::CLIENTS)]
    pub(crate) clients: usize,
    #[arg(skip)]
    defaults: PhantomData<D>,
}

/// The runs each measurement of a scenario executes.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Runs<D: Defaults> {
    /// Runs per measurement (per variant and round).
    #[arg(long, default_value = D::RUNS)]
    pub(crate) runs: usize,
    #[arg(skip)]
    defaults: PhantomData<D>,
}

/// The task specs a scenario registers before it measures.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Tasks<D: Defaults> {
    /// Task specs registered before the measurement (their kind: see the scenario).
    #[arg(long, default_value = D::TASKS)]
    pub(crate) tasks: usize,
    #[arg(skip)]
    defaults: PhantomData<D>,
}

impl<D: Defaults> Rounds<D> {
    pub(crate) fn new(rounds: usize) -> Self {
        Rounds { rounds, defaults: PhantomData }
    }
}

impl<D: Defaults> Clients<D> {
    pub(crate) fn new(clients: usize) -> Self {
        Clients { clients, defaults: PhantomData }
    }
}

impl<D: Defaults> Runs<D> {
    pub(crate) fn new(runs: usize) -> Self {
        Runs { runs, defaults: PhantomData }
    }
}

impl<D: Defaults> Tasks<D> {
    pub(crate) fn new(tasks: usize) -> Self {
        Tasks { tasks, defaults: PhantomData }
    }
}

//! `jetsched`: submit, inspect and control tasks over NATS (the registry's API and the event
//! stream). Exit codes: 0 success, 1 the API answered with an error (or `status` found no
//! leader, no registry or a stream missing), 2 usage or connection problems.

mod api;
mod backfill;
mod breakers;
mod calendars;
mod cancel;
mod commands;
mod dlq;
mod files;
mod graph;
mod inspect;
mod limits;
mod output;
mod queues;
mod runs;
mod tasks;
mod tenant;
mod text;
mod trigger;

use std::process::ExitCode;

use clap::Parser;

use crate::api::Failure;
use crate::commands::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Api(problems)) => {
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            ExitCode::from(1)
        }
        Err(Failure::Reported(summary)) => {
            eprintln!("error: {summary}");
            ExitCode::from(1)
        }
        Err(Failure::Other(error)) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

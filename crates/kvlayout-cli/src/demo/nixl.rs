//! `kvlayout demo --engine nixl`: the decode side in a second process over NIXL on loopback.
//! (Not finished: see `run`.)

use super::rank::{Published, RankRun};
use super::scenario::Scenario;
use super::DemoArgs;
use crate::CliError;

/// The hidden subcommand's arguments (the decode side's process).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PeerArgs {
    /// Address of the prefill side's socket.
    #[arg(long)]
    pub connect: String,
}

/// Whether NIXL loads here; a one-line user error saying why not.
pub(crate) fn available() -> Result<(), CliError> {
    kvlayout_connector::nixl::available()
        .map_err(|why| CliError::Usage(format!("--engine nixl: {why}")))
}

pub(crate) fn run(
    _a: &DemoArgs,
    _sc: &Scenario,
    _prefill: &[Vec<Vec<u8>>],
) -> Result<(Vec<Published>, f64, Vec<RankRun>), CliError> {
    Err(CliError::Usage("--engine nixl: not finished".into()))
}

pub(crate) fn peer(_a: &PeerArgs) -> Result<String, CliError> {
    Err(CliError::Usage("demo-peer: not finished".into()))
}

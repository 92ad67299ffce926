//! Opening a backend by the name a command's `--backend` gives, with its `--threads`: the one
//! place that turns `kvlayout_backends`' refusal into the CLI's error (exit 2, the flag named).
//! It does not own the names (`kvlayout_backends` does) nor check `--threads` (see
//! [`super::limits::threads`]).

use kvlayout::ops::AnyBackend;
use kvlayout_backends::{OpenError, Options};

use crate::CliError;

/// The backend `name`, on `threads` threads where it is the CPU backend (`None`: every core);
/// a name that is no backend, or one that cannot run here, is a user error naming `--backend`.
pub(crate) fn open(name: &str, threads: Option<usize>) -> Result<AnyBackend, CliError> {
    open_or_unavailable(name, threads)?
        .map_err(|reason| CliError::Usage(format!("--backend {name}: {reason}")))
}

/// As [`open`], but a backend that cannot run here (no device, no driver, a kernel build
/// the CPU lacks) is `Ok(Err(why))`, for commands that report it as a skip; an unknown name
/// is still a user error.
pub(crate) fn open_or_unavailable(
    name: &str,
    threads: Option<usize>,
) -> Result<Result<AnyBackend, String>, CliError> {
    match kvlayout_backends::open_with(name, &Options { threads }) {
        Ok(be) => Ok(Ok(be)),
        Err(OpenError::Unavailable { reason, .. }) => Ok(Err(reason)),
        Err(e) => Err(CliError::Usage(format!("--backend {e}"))),
    }
}

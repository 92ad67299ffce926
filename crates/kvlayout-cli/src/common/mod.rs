//! Helpers several commands share: the bounds of their common numeric flags ([`limits`]),
//! opening a backend by name ([`backend`]), byte sizes as text ([`units`]), the memory still
//! available ([`memory`]) and the seeded random numbers of their data ([`rng`]). It owns no
//! command.

pub(crate) mod backend;
pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod rng;
pub(crate) mod units;

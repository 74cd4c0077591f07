//! The HTTP building blocks every layer above shares: bodies, header fields,
//! a rate-limit decision's fields, the target's relayed fields, and the
//! service types a listener and a handler agree on.
pub mod body;
pub mod fields;
pub mod rate_limit;
pub(crate) mod relayed;
pub mod service;

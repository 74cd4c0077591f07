//! The HTTP building blocks every layer above shares: bodies, header fields,
//! the hop-by-hop set, the target's relayed fields, and the service types a listener and a
//! handler agree on. Nothing here knows what a gateway does with them.
pub mod body;
pub mod fields;
pub(crate) mod hop_by_hop;
pub(crate) mod relayed;
pub mod service;

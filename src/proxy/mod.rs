//! Forwarding (DESIGN.md §5): header hygiene, the upstream client, target
//! balancing and health, the TLS client, and the streamed bodies.
mod balance;
pub(crate) mod client;
pub mod headers;
mod health;
mod pool;
mod stream;
pub mod tls_client;
mod transport;
pub mod upstream;

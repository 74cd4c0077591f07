//! Forwarding: header hygiene and the identity signature, the upstream client, target balancing and
//! health, the TLS client, and the streamed bodies.
mod balance;
mod error;
mod forward;
pub mod headers;
mod health;
pub use health::TargetView;
mod pool;
pub mod signature;
mod stream;
mod target;
pub mod tls_client;
mod transport;
pub mod upstream;

//! HTTP/1.1, both sides: the server that serves clients (`server`), the
//! client that carries requests to the targets (`client`), and the codec
//! they share openly (`codec`): framing, the body decoder and the socket
//! work. Neither side reaches into the other.
//!
//! Why our own and not hyper's: see `docs/architecture.md` ("The HTTP/1.1
//! server is our own", "The HTTP/1.1 client to the targets is our own").
pub(crate) mod client;
pub(crate) mod codec;
mod server;

#[cfg(feature = "fuzzing")]
pub(crate) use server::parse_head;
pub(crate) use server::{serve, ConnectionLimits, Ended};

//! mpg-gateway: an authenticating, rate-limiting API gateway.
//!
//! The request's life is in [`pipeline`]; everything else is a stage's helper
//! or an I/O seam (the key store, the rate limiter, the upstream client).
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod body;
pub mod cli;
mod clock;
pub mod config;
pub mod demo;
pub mod error;
pub mod gateway;
mod h1;
mod ip;
pub mod keys_service;
pub mod logging;
pub mod pipeline;
pub mod proxy;
pub mod ratelimit;
pub mod reload;
pub mod routes;
pub mod server;
pub mod signals;
pub mod store;
pub mod tls;
#[doc(hidden)]
pub mod wire;

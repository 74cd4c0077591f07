//! mpg-gateway: an authenticating, rate-limiting API gateway.
//!
//! The modules form layers; each imports only from the layers below it
//! (`tests/layers.rs` checks this):
//!
//! - **base:** `clock`, `ip`, [`secret`], [`metrics`] and [`http_core`] (bodies,
//!   header fields, the service types a listener and a handler share);
//! - **parts:** [`tls`], [`config`], [`logging`], [`trace`], [`routes`], [`store`],
//!   [`error`] (every refusal, a store error's among them), [`auth`],
//!   [`ratelimit`] and the HTTP/1.1 codec (`h1`);
//! - **serving:** [`proxy`], [`server`], [`keys_service`] and [`pipeline`],
//!   where a request's life is;
//! - **application:** [`admin`], [`app`] (build, reload, start),
//!   [`signals`], [`cli`] and [`demo`].
#![forbid(unsafe_code)]

// base
mod clock;
pub mod http_core;
mod ip;
pub mod metrics;
pub mod secret;

// parts
pub mod auth;
pub mod config;
pub mod error;
mod h1;
pub mod logging;
pub mod ratelimit;
pub mod routes;
pub mod store;
pub mod tls;
pub mod trace;

// serving
pub mod keys_service;
pub mod pipeline;
pub mod proxy;
pub mod server;

// application
pub mod admin;
pub mod app;
pub mod cli;
pub mod demo;
pub mod signals;
// Entry points for the fuzz targets and the differential test; only with
// the `fuzzing` feature, which the gateway's own build leaves off.
#[cfg(feature = "fuzzing")]
pub mod wire;
